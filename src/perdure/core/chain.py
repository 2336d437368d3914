"""Sealing records into an object's chain, and verifying a chain.

Pure: keys come in as values, nothing here reads files or the store.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from perdure.core.codec import decode, encode
from perdure.core.records import (
    FORMAT_VERSION,
    GENESIS_HASH,
    KNOWN_KINDS,
    PLAIN_SEEN,
    Record,
    RecordDraft,
    compute_hash,
    has_long_digits,
    header_bytes,
    is_plain,
    needs_escape,
    parse_body,
)
from perdure.core.trust import KeyRing, verify_signature
from perdure.errors import IntegrityError

try:  # libsodium signs in less than half the time OpenSSL takes here
    from nacl.bindings import crypto_sign as _sodium_sign
    from nacl.bindings import crypto_sign_seed_keypair as _sodium_keypair
except ImportError:  # pragma: no cover - PyNaCl is a dependency; a platform without wheels
    _sodium_sign = None  # type: ignore[assignment]
    _sodium_keypair = None  # type: ignore[assignment]

__all__ = [
    "SEAL_MARK",
    "CommitSeal",
    "Signer",
    "VerifyReport",
    "chain_from_rows",
    "check_links",
    "record_problem",
    "seal",
    "seal_commit",
    "seal_parts",
    "seal_ref",
    "seal_unsigned",
    "sealed_by",
    "signed",
    "verify_chain",
]

SEAL_MARK = b"S"  # a record's signature column holding b"S" + a commit seal's digest
_SEAL_DOMAIN = b"perdure commit seal v1\n"


@dataclass(frozen=True, slots=True)
class Signer:
    """A node's identity: its id and Ed25519 private key.

    Signing goes through libsodium (PyNaCl) when it is installed: Ed25519 signatures
    are deterministic (RFC 8032), so it gives the very bytes ``cryptography`` gives,
    in less than half the time, and a node signs once per commit.
    """

    node_id: str
    private_key: Ed25519PrivateKey
    _sodium_key: bytes | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        if _sodium_sign is not None:
            seed = self.private_key.private_bytes(
                serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                serialization.NoEncryption())
            object.__setattr__(self, "_sodium_key", _sodium_keypair(seed)[1])

    def sign(self, digest: bytes) -> bytes:
        """Sign ``digest`` (the record hash bytes): the 64-byte Ed25519 signature."""
        key = self._sodium_key
        if key is not None and _sodium_sign is not None:
            return _sodium_sign(digest, key)[:64]
        return self.private_key.sign(digest)


def seal(
    draft: RecordDraft,
    *,
    object_id: str,
    seq: int,
    prev_hash: str,
    trace_id: str,
    ts_us: int,
    policy_ref: str,
    signer: Signer,
    sign: bool = True,
) -> Record:
    """Give ``draft`` its place after ``prev_hash``: hash it and sign it.

    ``sign=False`` leaves the signature empty for ``signed`` to add later (the engine's
    committer signs as a commit starts, just before the store sees the record).
    """
    body_bytes = draft.body_bytes or encode(draft.body, what=f"{draft.kind} record body")
    digest = compute_hash(
        object_id=object_id,
        seq=seq,
        trace_id=trace_id,
        ts_us=ts_us,
        node_id=signer.node_id,
        policy_ref=policy_ref,
        kind=str(draft.kind),
        body_bytes=body_bytes,
        prev_hash=prev_hash,
    )
    return Record(
        object_id=object_id,
        seq=seq,
        trace_id=trace_id,
        ts_us=ts_us,
        node_id=signer.node_id,
        policy_ref=policy_ref,
        kind=str(draft.kind),
        body_bytes=body_bytes,
        prev_hash=prev_hash,
        hash=digest,
        signature=signer.sign(bytes.fromhex(digest)) if sign else b"",
        body=draft.body,
    )


def seal_unsigned(drafts: Sequence[RecordDraft], *, object_id: str, seq: int, prev_hash: str,
                  trace_id: str, ts_us: int, node_id: str, policy_ref: str
                  ) -> list[Record] | None:
    """``seal`` with ``sign=False`` for each of ``drafts`` in turn after record ``seq``
    (hash ``prev_hash``): the same records, with the header formatted around the parts
    that stay the same. ``None`` when a header string needs escaping (then ``seal``).

    A node seals every step's record on its event loop; this is that path.
    """
    if not (type(seq) is int and type(ts_us) is int and is_plain(object_id)
            and is_plain(trace_id) and is_plain(node_id) and is_plain(policy_ref)
            and _plain_hash(prev_hash)):
        return None
    head = f'[{FORMAT_VERSION},"{object_id}",'
    mid = f',"{trace_id}",{ts_us},"{node_id}","{policy_ref}","'
    sha256 = hashlib.sha256
    new = tuple.__new__
    records: list[Record] = []
    prev = prev_hash
    for draft in drafts:
        seq += 1
        kind = str(draft.kind)
        if kind not in KNOWN_KINDS:
            return None
        body_bytes = draft.body_bytes or encode(draft.body, what=f"{kind} record body")
        try:
            header = f'{head}{seq}{mid}{kind}","{prev}"]\n'.encode()
        except UnicodeEncodeError:
            return None  # a lone surrogate: ``seal`` says what is wrong
        digest = sha256(header + body_bytes).hexdigest()
        records.append(new(Record, (object_id, seq, trace_id, ts_us, node_id, policy_ref, kind,
                                    body_bytes, prev, digest, b"", draft.body)))
        prev = digest
    return records


def signed(record: Record, signer: Signer) -> Record:
    """``record`` with ``signer``'s signature over its hash (as ``seal`` would give it)."""
    if record.node_id != signer.node_id:
        raise ValueError(f"record #{record.seq} names node {record.node_id!r}, "
                         f"not the signer {signer.node_id!r}")
    return record._replace(signature=signer.sign(bytes.fromhex(record.hash)))


@dataclass(frozen=True, slots=True)
class CommitSeal:
    """One signature over every record a node wrote in one commit.

    ``hashes`` is the records' 32-byte hashes, concatenated in commit order;
    ``digest`` is SHA-256 over a domain tag, the node id and ``hashes``, and
    ``signature`` is the node's Ed25519 signature of ``digest``. A sealed record
    stores ``seal_ref(digest)`` where a signature would be: verifying it finds its
    hash among ``hashes`` and checks the seal's signature once for all of them.
    """

    digest: bytes
    node_id: str
    hashes: bytes
    signature: bytes

    def covers(self, record_hash: bytes) -> bool:
        """Whether ``record_hash`` (32 bytes) is one of the hashes this seal signs."""
        hashes = self.hashes
        at = hashes.find(record_hash)
        while at != -1:
            if at % 32 == 0:
                return True
            at = hashes.find(record_hash, at + 1)
        return False

    def intact(self) -> bool:
        """Whether ``digest`` is what ``node_id`` and ``hashes`` give."""
        return (len(self.hashes) % 32 == 0
                and _seal_digest(self.node_id, self.hashes) == self.digest)


def _seal_digest(node_id: str, hashes: bytes) -> bytes:
    return hashlib.sha256(b"%b%b\n%b" % (_SEAL_DOMAIN, node_id.encode(), hashes)).digest()


def seal_ref(digest: bytes) -> bytes:
    """What a sealed record stores in its signature column (33 bytes, never 64)."""
    return SEAL_MARK + digest


def seal_parts(records: Sequence[Record], node_id: str) -> tuple[bytes, bytes, list[Record]]:
    """What a commit seal over ``records`` (all of ``node_id``) needs except its signature:
    the digest to sign, the hash list, and the records carrying the seal's reference."""
    for rec in records:
        if rec.node_id != node_id:
            raise ValueError(f"record #{rec.seq} names node {rec.node_id!r}, "
                             f"not the signer {node_id!r}")
    hashes = b"".join([bytes.fromhex(rec.hash) for rec in records])
    digest = _seal_digest(node_id, hashes)
    ref = seal_ref(digest)
    # ``tuple.__new__`` rather than ``_replace``: several times cheaper, once per record
    return digest, hashes, [tuple.__new__(Record, (*rec[:10], ref, rec[11]))
                            for rec in records]


def seal_commit(records: Sequence[Record], signer: Signer) -> tuple[CommitSeal, list[Record]]:
    """Sign ``records`` (all of ``signer``'s node) with one signature: the seal, and the
    records carrying a reference to it instead of a signature of their own."""
    digest, hashes, refs = seal_parts(records, signer.node_id)
    return CommitSeal(digest, signer.node_id, hashes, signer.sign(digest)), refs


def sealed_by(record: Record) -> bytes | None:
    """The digest of the commit seal ``record`` refers to, or ``None`` if it is signed."""
    sig = record.signature
    if len(sig) == 33 and sig[:1] == SEAL_MARK:
        return sig[1:]
    return None


def check_links(object_id: str, records: Sequence[Record], *, start_hash: str = GENESIS_HASH,
                start_seq: int = 1) -> None:
    """Check sequence numbers, hashes and links (not signatures); raise ``IntegrityError``.

    Every claim runs this over the whole chain, so the loop is kept tight: headers
    whose strings need no escaping are formatted directly (``records.header_bytes``
    gives the same bytes the canonical encoder would).
    """
    prev = start_hash
    expected = start_seq
    sha256 = hashlib.sha256
    plain = is_plain(object_id) and _plain_hash(start_hash)
    seen = PLAIN_SEEN
    for rec in records:
        oid, seq, trace, ts, node, policy, kind, body_bytes, prev_hash, digest, _, _ = rec
        if seq != expected or type(seq) is not int:
            raise IntegrityError(
                object_id, expected, f"sequence gap: expected #{expected}, found #{seq}"
            )
        if oid != object_id:
            raise IntegrityError(object_id, seq, f"record belongs to {oid!r}")
        if prev_hash != prev:
            raise IntegrityError(object_id, seq, "previous-hash link is broken")
        # ``prev`` is the start hash or a hash checked just before: hex, needs no escaping.
        if (plain and type(ts) is int and (trace in seen or is_plain(trace))
                and (node in seen or is_plain(node)) and (policy in seen or is_plain(policy))
                and (kind in seen or is_plain(kind))):
            header = (f'[{FORMAT_VERSION},"{object_id}",{seq},"{trace}",{ts},"{node}",'
                      f'"{policy}","{kind}","{prev}"]').encode()
        else:
            header = header_bytes(object_id, seq, trace, ts, node, policy, kind, prev)
        if sha256(b"%b\n%b" % (header, body_bytes)).hexdigest() != digest:
            raise IntegrityError(object_id, seq, "content does not match its hash")
        prev = digest
        expected += 1


def chain_from_rows(object_id: str, rows: Iterable[Sequence[Any]], *,
                    start_hash: str = GENESIS_HASH, start_seq: int = 1,
                    split: Callable[[Any], Any] = parse_body) -> list[Record] | None:
    """Decode compact record rows and check their links and hashes in one pass.

    Each row is ``(seq, ts_us, names, body, prev_hash, hash, signature)``, where
    ``names`` holds ``trace_id, node_id, policy_ref, kind`` in one value that ``split``
    turns into the four (by default the JSON array text; few distinct values in one
    history, so each is split once) and the hashes are raw bytes.

    This is the claim-time path: one pass, no second walk, no hex round trips. It
    returns ``None`` at the first thing out of the ordinary (a column of another type,
    a string that needs escaping, a broken link or hash, a body the fast parser must
    not take): the caller then reads the full rows and lets ``records`` and
    ``check_links`` say exactly what is wrong, or accept what was merely unusual.
    """
    if not (is_plain(object_id) and _plain_hash(start_hash)) or type(start_seq) is not int:
        return None
    out: list[Record] = []
    append = out.append
    names: dict[Any, tuple[str, str, str, str, str, str]] = {}
    head = f'[{FORMAT_VERSION},"{object_id}",'
    prev = start_hash
    expected = start_seq
    sha256 = hashlib.sha256
    parse = parse_body
    kept: list[bytes] = []
    bodies = kept.append
    new = tuple.__new__
    try:
        prev_raw = bytes.fromhex(start_hash)
        for seq, ts_us, key, body_bytes, prev_hash, digest, signature in rows:
            got = names.get(key)
            if got is None:
                got = _names(key, split)
                if got is None:
                    return None
                names[key] = got
            if (seq != expected or type(seq) is not int or type(ts_us) is not int
                    or type(body_bytes) is not bytes or prev_hash != prev_raw
                    or type(prev_hash) is not bytes or type(digest) is not bytes
                    or type(signature) is not bytes):
                return None
            trace, node, policy, kind, mid, tail = got
            if sha256(f'{head}{seq}{mid}{ts_us}{tail}{prev}"]\n'.encode()
                      + body_bytes).digest() != digest:
                return None
            bodies(body_bytes)
            body = parse(body_bytes)
            if type(body) is not dict:
                return None
            hexed = digest.hex()
            append(new(Record, (object_id, seq, trace, ts_us, node, policy, kind, body_bytes,
                                prev, hexed, signature, body)))
            prev = hexed
            prev_raw = digest
            expected += 1
    except (ValueError, TypeError, UnicodeError):
        return None
    # One look for a run of 19 digits over every body (a newline between two bodies
    # ends any run): cheaper than a look per body.
    if has_long_digits(b"\n".join(kept)):
        # A run of 19 digits (an integer past 64 bits, or only digits inside a string
        # such as a hex trace id): those bodies alone are parsed again, exactly.
        for at, rec in enumerate(out):
            if has_long_digits(rec.body_bytes):
                try:
                    exact = decode(rec.body_bytes)
                except (ValueError, UnicodeDecodeError):
                    return None
                if type(exact) is not dict:
                    return None
                out[at] = new(Record, (*rec[:11], exact))
    return out


def _names(key: Any, split: Callable[[Any], Any]) -> tuple[str, str, str, str, str, str] | None:
    """``(trace, node, policy, kind)`` from a row's names value, with the header pieces
    around ``ts_us``; ``None`` unless all four are strings that need no escaping."""
    try:
        values = split(key) if isinstance(key, str | bytes) else None
    except ValueError:
        return None
    if (type(values) is not list or len(values) != 4
            or not all(type(v) is str and is_plain(v) for v in values)):
        return None
    trace, node, policy, kind = values
    if kind not in KNOWN_KINDS:
        return None
    return (trace, node, policy, kind, f',"{trace}",', f',"{node}","{policy}","{kind}","')


def _plain_hash(text: str) -> bool:
    return type(text) is str and needs_escape(text) is None


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """Outcome of ``verify_chain``: ``ok``, records checked, and the first failure if any.

    ``untrusted`` marks a failure that says nothing of the record itself: it was written
    under a name no root the checking node trusts certifies, so its signature cannot be
    checked (another key folder, or a root to trust, is what is missing)."""

    object_id: str
    ok: bool
    records: int
    bad_seq: int | None = None
    reason: str | None = None
    head_hash: str | None = None
    untrusted: bool = False

    def __str__(self) -> str:
        if self.ok:
            return f"{self.object_id}: {self.records} records verified (head {self.head_hash})"
        if self.untrusted:
            return (f"{self.object_id}: record #{self.bad_seq} cannot be vouched for: "
                    f"{self.reason}")
        return f"{self.object_id}: record #{self.bad_seq} is bad: {self.reason}"


def verify_chain(
    object_id: str,
    records: Sequence[Record],
    public_keys: Mapping[str, bytes],
    *,
    head_seq: int | None = None,
    head_hash: str | None = None,
    seals: Mapping[bytes, CommitSeal] | None = None,
    trust: KeyRing | None = None,
) -> VerifyReport:
    """Walk ``records`` and report the first bad one by sequence number and reason.

    ``head_seq``/``head_hash`` are what the object's row says the chain ends
    with; a chain that stops short of it (a deleted tail) fails too. ``seals``
    holds the commit seals the records refer to (by digest); a sealed record whose
    seal is missing, altered, signed by another node or not covering its hash fails.
    With ``trust``, a record counts only if its node's key is certified by one of the
    ring's roots (and not revoked) when the record was written; without it, any key
    registered in ``public_keys`` is taken at its word.
    """
    try:
        check_links(object_id, records)
    except IntegrityError as exc:
        return VerifyReport(object_id, False, len(records), exc.seq, exc.reason)
    keys: dict[str, bytes] = {}
    good_seals: set[bytes] = set()
    for rec in records:
        problem = record_problem(rec, public_keys, seals or {}, trust, keys, good_seals)
        if problem is not None:
            digest = sealed_by(rec)
            # Foreign, not bad: the first record already names a writer no trusted root
            # certifies (an object of another cluster, or this node given the wrong key
            # folder). After records that verified, such a writer is a forgery.
            untrusted = (trust is not None and rec is records[0]
                         and not trust.keys_named(rec.node_id)
                         and rec.node_id not in keys  # no trusted root's key verified it
                         and (digest is None or _seal_shape_problem(
                             rec, digest, (seals or {}).get(digest)) is None))
            return VerifyReport(object_id, False, len(records), rec.seq, problem,
                                untrusted=untrusted)
    last = records[-1] if records else None
    if head_seq is not None and (last is None or last.seq != head_seq):
        got = last.seq if last else 0
        return VerifyReport(
            object_id, False, len(records), got + 1,
            f"chain ends at #{got} but the object's head is #{head_seq} (records missing)",
        )
    if head_hash is not None and last is not None and last.hash != head_hash:
        return VerifyReport(
            object_id, False, len(records), last.seq,
            "last record's hash differs from the object's recorded head",
        )
    if not records:
        return VerifyReport(object_id, False, 0, 1, "object has no records")
    return VerifyReport(object_id, True, len(records), head_hash=last.hash if last else None)


def record_problem(rec: Record, public_keys: Mapping[str, bytes],
                   seals: Mapping[bytes, CommitSeal], trust: KeyRing | None = None,
                   keys: dict[str, bytes] | None = None,
                   good_seals: set[bytes] | None = None) -> str | None:
    """Why ``rec``'s signature (or commit seal) does not vouch for its hash, or ``None``.

    With ``trust``, the signing key is one a trusted root certified under the record's
    node id (``KeyRing.signer``) and ``public_keys`` is not read; without it (memory
    logs checked on their own), the key ``public_keys`` gives for the node id is taken
    at its word. Checks the signature only, not the hash: callers check links and
    hashes first (``check_links``). ``keys`` (the key that signed last, per node id,
    and per checked commit seal under ``"\\0" + digest``) and ``good_seals`` are caches
    shared across calls.
    """
    keys = {} if keys is None else keys
    digest = sealed_by(rec)
    if digest is not None:
        found = seals.get(digest)
        why = _seal_shape_problem(rec, digest, found)
        if why is not None:
            return why
        assert found is not None
        signature, message = found.signature, digest
        what = "its commit seal's signature"
    else:
        try:
            message = bytes.fromhex(rec.hash)
        except ValueError:
            return "its hash is not hex"
        signature, what = rec.signature, "signature"
    if trust is not None:
        sealer = keys.get("\0" + digest.hex()) if digest is not None else None
        if sealer is not None:  # this seal's signature was checked: its key is known
            why = trust.problem(sealer, rec.ts_us, name=rec.node_id)
            return None if why is None else f"signed by node {rec.node_id!r}: {why}"
        key, why = trust.signer(rec.node_id, signature, message, rec.ts_us,
                                first=keys.get(rec.node_id))
        if key is not None:
            keys[rec.node_id] = key
            if digest is not None:
                keys["\0" + digest.hex()] = key
        if why is not None:
            if key is None and digest is not None:
                why = why.replace("its signature", "its commit seal's signature", 1)
            return f"signed by node {rec.node_id!r}: {why}"
        return None
    key = keys.get(rec.node_id)
    if key is None:
        raw = public_keys.get(rec.node_id)
        if raw is None:
            return f"origin node {rec.node_id!r} has no registered public key"
        try:
            Ed25519PublicKey.from_public_bytes(raw)
        except ValueError:
            return f"origin node {rec.node_id!r} has a malformed public key"
        key = keys[rec.node_id] = raw
    good = set() if good_seals is None else good_seals
    if digest is not None and digest in good:
        return None
    if not verify_signature(key, signature, message):
        return f"{what} does not verify against node {rec.node_id!r}"
    if digest is not None:
        good.add(digest)
    return None


def _seal_shape_problem(rec: Record, digest: bytes, found: CommitSeal | None) -> str | None:
    """Why the commit seal ``rec`` refers to cannot vouch for it whoever signed it, or
    ``None`` (its signature is checked by the caller)."""
    if found is None:
        return f"its commit seal {digest.hex()[:16]}… is missing from the store"
    if found.digest != digest or not found.intact():
        return f"its commit seal {digest.hex()[:16]}… was altered"
    if found.node_id != rec.node_id:
        return f"its commit seal was made by node {found.node_id!r}, not {rec.node_id!r}"
    if not found.covers(bytes.fromhex(rec.hash)):
        return f"its commit seal {digest.hex()[:16]}… does not cover this record's hash"
    return None


