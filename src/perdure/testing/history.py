"""``History``: one object's memory as a file, to check into a repository and replay.

A history file is JSON, written the same way every time for the same memory (fields
in a fixed order, bodies with their keys sorted, one record per entry): the object's
id, agent, version and status when written, the public key(s) that signed it, the
commit seals its records refer to, and every record with all it was hashed and signed
with. Reading one rebuilds the records exactly (a body's canonical bytes are what was
hashed) and checks them before anything else: the sequence, every hash and link, and
every signature (or commit seal) under the keys the file names. An edited body, a
record removed or moved, a changed hash or signature is an ``IntegrityError`` naming
the record (``RecordDecodeError`` for a body or kind that does not decode); a file
that is not a history is a ``ConfigurationError``.

The keys are those of the file: what it proves is that nobody changed the memory after
it was signed by them, not who they are (pin them, or keep the files where changes are
reviewed). Sealed values (``perdure.Secret``, agents that encrypt all) stay sealed in
the file, and a replay hands them to the agent sealed.

The golden memory logs of perdure's own tests (``tests/golden``) are history files too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perdure.core.chain import CommitSeal, check_links, record_problem, sealed_by
from perdure.core.codec import encode
from perdure.core.records import Kind, Record, decode_record
from perdure.errors import ConfigurationError, IntegrityError, SerializationError

if TYPE_CHECKING:
    from perdure.app import App

__all__ = ["FORMAT", "History", "history_files"]

FORMAT = 1
"""The history file format this code writes and reads."""


@dataclass(frozen=True)
class History:
    """One object's memory, checked, with what a replay needs and what vouches for it.

    ``public_keys`` maps each node id that signed a record to its key(s) (32 bytes
    each); ``seals`` holds the commit seals records refer to, by digest. ``status`` is
    the object's status when the history was taken; ``path`` the file it was read from.
    """

    object_id: str
    agent: str
    version: str
    status: str
    records: tuple[Record, ...]
    public_keys: Mapping[str, tuple[bytes, ...]]
    seals: Mapping[bytes, CommitSeal] = field(default_factory=dict)
    recorded_with: str = ""
    path: Path | None = None

    # -- taking one ----------------------------------------------------------------

    @classmethod
    def of(cls, app: App, object_id: str) -> History:
        """The object's memory in ``app``'s store, verified as ``App.verify`` verifies it
        (``IntegrityError`` naming the record if it does not), with the keys that signed
        it and the commit seals it refers to."""
        from perdure import __version__

        report = app.verify(object_id)
        if not report.ok:
            raise IntegrityError(object_id, report.bad_seq or 0,
                                 f"{report.reason}; a history is written only of memory "
                                 "that verifies")
        info = app.get(object_id, explain=False)
        records = app.history(object_id)
        digests = sorted({d for rec in records if (d := sealed_by(rec)) is not None})
        seals = app.store.seals(digests) if digests else {}
        known = app.verifier.names()
        used: dict[str, list[bytes]] = {}
        for rec in records:
            for key in known.get(rec.node_id, []):
                if record_problem(rec, {rec.node_id: key}, seals) is None:
                    found = used.setdefault(rec.node_id, [])
                    if key not in found:
                        found.append(key)
                    break
            else:
                raise IntegrityError(object_id, rec.seq, f"no key certified as node "
                                     f"{rec.node_id!r} verifies this record")
        history = cls(object_id=object_id, agent=info.agent, version=info.agent_version,
                      status=str(info.status), records=tuple(records),
                      public_keys={node: tuple(keys) for node, keys in used.items()},
                      seals=dict(seals), recorded_with=__version__)
        history.check()
        return history

    # -- as a file -------------------------------------------------------------------

    def to_json(self) -> str:
        """The file's text: the same text for the same history, every time."""
        records: list[dict[str, Any]] = []
        for rec in self.records:
            item: dict[str, Any] = {"seq": rec.seq, "kind": str(rec.kind)}
            body = json.loads(json.dumps(rec.body, ensure_ascii=False))
            if _canonical(body) == rec.body_bytes:
                item["body"] = body
            else:  # a body JSON cannot carry back byte for byte: its canonical text
                item["body_text"] = rec.body_bytes.decode("utf-8")
            item.update({
                "trace_id": rec.trace_id, "ts_us": rec.ts_us, "node_id": rec.node_id,
                "policy_ref": rec.policy_ref, "prev_hash": rec.prev_hash, "hash": rec.hash,
                "signature": rec.signature.hex(),
            })
            records.append(item)
        keys = {node: found[0].hex() if len(found) == 1 else [k.hex() for k in found]
                for node, found in sorted(self.public_keys.items())}
        doc: dict[str, Any] = {
            "format": FORMAT,
            "recorded_with": self.recorded_with,
            "object_id": self.object_id,
            "agent": self.agent,
            "version": self.version,
            "status": self.status,
            "public_keys": keys,
        }
        if self.seals:
            doc["seals"] = [{"digest": seal.digest.hex(), "node_id": seal.node_id,
                             "hashes": seal.hashes.hex(), "signature": seal.signature.hex()}
                            for _, seal in sorted(self.seals.items())]
        doc["records"] = records
        return json.dumps(doc, indent=1, ensure_ascii=False, sort_keys=False) + "\n"

    def write(self, path: str | Path) -> Path:
        """Write the history to ``path`` (its folder made if need be); the path."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(self.to_json(), encoding="utf-8")
        return target

    @classmethod
    def read(cls, path: str | Path) -> History:
        """Read and check a history file (see the module): ``ConfigurationError`` for a
        file that cannot be read or is not a history, ``IntegrityError`` or
        ``RecordDecodeError`` naming the record for memory that does not verify."""
        source = Path(path)
        try:
            text = source.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigurationError(f"cannot read history file {source}: "
                                     f"{getattr(exc, 'strerror', None) or exc}") from None
        return cls.from_json(text, path=source)

    @classmethod
    def from_json(cls, text: str, *, path: Path | None = None) -> History:
        """``read`` from the file's text."""
        where = f"history file {path}" if path is not None else "history"
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise ConfigurationError(f"{where} is not JSON: {exc}") from None
        try:
            return cls._from_doc(doc, path)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigurationError(f"{where} is not a perdure history: "
                                     f"{type(exc).__name__}: {exc}") from None

    @classmethod
    def _from_doc(cls, doc: Any, path: Path | None) -> History:
        if not isinstance(doc, dict):
            raise TypeError("the document is not a JSON object")
        if doc.get("format") != FORMAT:
            raise ValueError(f"format {doc.get('format')!r}; this code reads format {FORMAT}")
        object_id = str(doc["object_id"])
        keys: dict[str, tuple[bytes, ...]] = {}
        for node, given in dict(doc["public_keys"]).items():
            listed = [given] if isinstance(given, str) else list(given)
            keys[str(node)] = tuple(bytes.fromhex(str(k)) for k in listed)
        seals: dict[bytes, CommitSeal] = {}
        for item in doc.get("seals", []):
            seal = CommitSeal(bytes.fromhex(item["digest"]), str(item["node_id"]),
                              bytes.fromhex(item["hashes"]), bytes.fromhex(item["signature"]))
            seals[seal.digest] = seal
        records = []
        for item in doc["records"]:
            if "body_text" in item:
                body_bytes = str(item["body_text"]).encode("utf-8")
            else:
                body_bytes = _canonical(item["body"])
            records.append(decode_record(
                object_id=object_id, seq=int(item["seq"]), trace_id=str(item["trace_id"]),
                ts_us=int(item["ts_us"]), node_id=str(item["node_id"]),
                policy_ref=str(item["policy_ref"]), kind=str(item["kind"]),
                body_bytes=body_bytes, prev_hash=str(item["prev_hash"]),
                hash=str(item["hash"]), signature=bytes.fromhex(str(item["signature"]))))
        history = cls(object_id=object_id, agent=str(doc["agent"]),
                      version=str(doc["version"]), status=str(doc["status"]),
                      records=tuple(records), public_keys=keys, seals=seals,
                      recorded_with=str(doc.get("recorded_with", "")), path=path)
        history.check()
        return history

    # -- checking --------------------------------------------------------------------

    def check(self) -> None:
        """Check the records (sequence, hashes, links, then each signature or commit
        seal under the keys given) and that they are the memory the header names:
        ``IntegrityError`` naming the first bad record."""
        oid = self.object_id
        if not self.records:
            raise IntegrityError(oid, 1, "the history holds no records")
        check_links(oid, self.records)
        for rec in self.records:
            keys = self.public_keys.get(rec.node_id, ())
            if not keys:
                raise IntegrityError(oid, rec.seq, f"the history names no key of node "
                                     f"{rec.node_id!r}, which signed this record")
            problems = [record_problem(rec, {rec.node_id: key}, self.seals) for key in keys]
            if None not in problems:
                raise IntegrityError(oid, rec.seq, str(problems[0]))
        first = self.records[0]
        intent = first.body.get("intent") if first.kind == Kind.INSTANTIATED else None
        if not isinstance(intent, dict):
            raise IntegrityError(oid, first.seq, "the first record is not the object's "
                                 "instantiation")
        said = (str(intent.get("agent")), str(intent.get("version")))
        if said != (self.agent, self.version):
            raise IntegrityError(oid, first.seq, f"the header says agent {self.agent!r} "
                                 f"version {self.version!r}, memory says {said[0]!r} "
                                 f"version {said[1]!r}")


def _canonical(body: Any) -> bytes:
    try:
        return encode(body)
    except SerializationError as exc:
        raise ValueError(f"a record body cannot be encoded: {exc}") from None


def history_files(paths: Sequence[str | Path]) -> list[Path]:
    """The files ``paths`` name: each file as given, each folder's ``*.json`` files in
    name order."""
    found: list[Path] = []
    for given in paths:
        path = Path(given)
        found.extend(sorted(path.glob("*.json")) if path.is_dir() else [path])
    return found
