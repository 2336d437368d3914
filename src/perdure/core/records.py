"""Memory records: frozen, hash-chained, signed.

A record's hash is SHA-256 over a canonical header (format version, object id,
sequence, trace id, timestamp, origin node, policy reference, kind, previous
hash) followed by the canonical body bytes. The origin node signs the 32 hash
bytes with Ed25519. Records are built once and never changed.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple

from perdure.core.codec import decode, encode
from perdure.errors import RecordDecodeError

try:  # a C JSON parser: decoding a 10,000-record history is most of a cold resume
    from orjson import loads as _parse
except ImportError:  # pragma: no cover - a platform without orjson wheels
    _parse = json.loads  # type: ignore[assignment]

__all__ = [
    "FORMAT_VERSION",
    "GENESIS_HASH",
    "Kind",
    "Record",
    "RecordDraft",
    "compute_hash",
    "decode_record",
    "record_from_columns",
    "step_done_bytes",
]

FORMAT_VERSION = 1
GENESIS_HASH = "0" * 64


class Kind(StrEnum):
    """What a memory record says happened."""

    INSTANTIATED = "instantiated"  # body: intent, context
    STEP_STARTED = "step_started"  # non-idempotent step about to run
    STEP_DONE = "step_done"
    STEP_FAILED = "step_failed"
    STEP_IN_DOUBT = "step_in_doubt"
    VALUE = "value"  # run.now(), run.uuid(), run.random()
    DORMANT = "dormant"
    WOKE = "woke"
    EVENT_RECEIVED = "event_received"
    WAIT_TIMED_OUT = "wait_timed_out"
    INTENT_REFINED = "intent_refined"
    NONDETERMINISM = "nondeterminism"
    DELEGATED = "delegated"  # a child object was created
    CHILD_FINISHED = "child_finished"  # a child terminated; its result or error
    CAPABILITY_MISSING = "capability_missing"  # this node lacks what the next step needs
    PATCHED = "patched"  # run.patched(name): new code path taken
    PROGRESS = "progress"
    EVENT_REFUSED = "event_refused"  # an inbox event whose seal did not verify
    PARKED = "parked"  # the object waits for a person (e.g. its step kept killing workers)
    TERMINATED = "terminated"
    MODEL_CALL = "model_call"  # run.model: the reply a model gave (or a surfaced stream)
    MODEL_FAILED = "model_failed"  # run.model: an attempt that failed, and when to retry
    MODEL_CHUNKS = "model_chunks"  # run.model(stream=True): a batch of a streamed reply
    MODEL_RECOVERED = "model_recovered"  # run.model: what was done with a cut stream
    EMITTED = "emitted"  # run.emit(name, data): an event for the object's followers
    RESOURCE = "resource"  # run.resource: a live thing's descriptor (declared or updated)
    RESTORE_REPORT = "restore_report"  # reentry: what was restored, how long, what failed
    STEP_CHECKPOINT = "step_checkpoint"  # current_step().checkpoint: progress inside a step
    INVALIDATED = "invalidated"  # recorded steps from a position on are run again
    MODEL_STARTED = "model_started"  # run.model: a stateful request about to be sent
    TOOL_PROPOSED = "tool_proposed"  # a tool call the model proposed (tool, args, hash)
    TOOL_GATED = "tool_gated"  # the gate's verdict on a proposal, with the policy's ref
    TOOL_DECIDED = "tool_decided"  # a person's signed decision on a proposal (or expiry)
    TOOL_STARTED = "tool_started"  # a non-idempotent tool is about to run
    TOOL_RESULT = "tool_result"  # how a tool call ended: result, or why it did not run


@dataclass(frozen=True, slots=True)
class RecordDraft:
    """A record before it has a place in the chain: kind and body only.

    ``body_bytes``, when given, must be exactly ``encode(body)``: a caller that has
    the canonical bytes already (a step's body around its encoded result) spares the
    encoder a second pass.
    """

    kind: Kind
    body: dict[str, Any]
    body_bytes: bytes | None = None


def step_done_bytes(attempt: int, latency: float, name: str, pos: int | str,
                    result: bytes) -> bytes | None:
    """The canonical bytes of a ``step_done`` body around the already encoded ``result``,
    byte for byte what ``encode`` gives for the dict; ``None`` when a value needs the
    encoder (a name or position that must be escaped)."""
    if type(attempt) is not int or type(latency) is not float or not is_plain(name):
        return None
    if type(pos) is int:
        at = str(pos)
    elif is_plain(pos):
        at = f'"{pos}"'
    else:
        return None
    try:
        head = (f'{{"attempt":{attempt},"cmd":"step","latency":{latency!r},"name":"{name}",'
                f'"pos":{at},"result":').encode()
    except UnicodeEncodeError:
        return None  # a lone surrogate: the encoder says what is wrong
    return b"%b%b}" % (head, result)


class Record(NamedTuple):
    """One execution record in an object's memory.

    Immutable. A named tuple rather than a frozen dataclass because a resume builds
    one per recorded step (10,000 for a long history) and a tuple is built several
    times faster; use ``rec._replace(...)`` for a changed copy (tests only).
    """

    object_id: str
    seq: int
    trace_id: str
    ts_us: int
    node_id: str
    policy_ref: str
    kind: str
    body_bytes: bytes
    prev_hash: str
    hash: str
    signature: bytes
    body: dict[str, Any]

    @property
    def ts(self) -> float:
        """Timestamp in seconds since the epoch."""
        return self.ts_us / 1_000_000


needs_escape = re.compile(r'[\x00-\x1f"\\]').search
PLAIN_SEEN: set[str] = set()  # header strings seen to need no JSON escaping (ids, kinds)


def is_plain(text: object) -> bool:
    """Whether ``text`` is a str that canonical JSON writes as ``"text"`` unchanged."""
    if text in PLAIN_SEEN:
        return True
    if type(text) is not str or needs_escape(text) is not None:
        return False
    if len(PLAIN_SEEN) >= 4096:  # object ids come and go; keep the set small
        PLAIN_SEEN.clear()
    PLAIN_SEEN.add(text)
    return True


def header_bytes(object_id: str, seq: int, trace_id: str, ts_us: int, node_id: str,
            policy_ref: str, kind: str, prev_hash: str) -> bytes:
    """The canonical JSON header, byte for byte what ``encode`` gives for the list.

    Hashing a 10,000-record chain encodes 10,000 headers; formatting them directly
    when every string needs no escaping is several times faster than the encoder,
    which handles everything else.
    """
    if (type(seq) is int and type(ts_us) is int and is_plain(object_id) and is_plain(trace_id)
            and is_plain(node_id) and is_plain(policy_ref) and is_plain(kind)
            and type(prev_hash) is str and needs_escape(prev_hash) is None):
        try:
            return (f'[{FORMAT_VERSION},"{object_id}",{seq},"{trace_id}",{ts_us},"{node_id}",'
                    f'"{policy_ref}","{kind}","{prev_hash}"]').encode()
        except UnicodeEncodeError:
            pass  # a lone surrogate: let the encoder say what is wrong
    return encode(
        [FORMAT_VERSION, object_id, seq, trace_id, ts_us, node_id, policy_ref, kind, prev_hash]
    )


def compute_hash(
    *,
    object_id: str,
    seq: int,
    trace_id: str,
    ts_us: int,
    node_id: str,
    policy_ref: str,
    kind: str,
    body_bytes: bytes,
    prev_hash: str,
) -> str:
    """Return the hex SHA-256 of a record's canonical header and body bytes."""
    header = header_bytes(object_id, seq, trace_id, ts_us, node_id, policy_ref, kind, prev_hash)
    return hashlib.sha256(b"%b\n%b" % (header, body_bytes)).hexdigest()


def decode_record(
    *,
    object_id: str,
    seq: int,
    trace_id: str,
    ts_us: int,
    node_id: str,
    policy_ref: str,
    kind: str,
    body_bytes: bytes,
    prev_hash: str,
    hash: str,  # noqa: A002 - the record's field name
    signature: bytes,
) -> Record:
    """Build a ``Record`` from stored columns, failing closed on anything undecodable."""
    try:
        body = decode(body_bytes)
    except (ValueError, UnicodeDecodeError, TypeError) as exc:
        raise RecordDecodeError(object_id, seq, f"body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise RecordDecodeError(object_id, seq, "body is not a JSON object")
    try:
        Kind(kind)
    except ValueError as exc:
        raise RecordDecodeError(object_id, seq, f"unknown record kind {kind!r}") from exc
    return Record(
        object_id=object_id,
        seq=seq,
        trace_id=trace_id,
        ts_us=ts_us,
        node_id=node_id,
        policy_ref=policy_ref,
        kind=kind,
        body_bytes=body_bytes,
        prev_hash=prev_hash,
        hash=hash,
        signature=signature,
        body=body,
    )


KNOWN_KINDS = frozenset(Kind)  # every kind a stored record may have
_DIGITS_AS_ZERO = bytes(48 if 48 <= i <= 57 else 32 for i in range(256))
_LONG_RUN = b"0" * 19


def has_long_digits(body: bytes) -> bool:
    """Whether ``body`` holds a run of 19 digits anywhere.

    The C parser turns integers beyond 64 bits into floats, so such a body takes the
    exact (slower) path. Mapping every digit to ``0`` and searching for the run is
    three times faster than a regular expression on a short body, eight on a long one.
    """
    return _LONG_RUN in body.translate(_DIGITS_AS_ZERO)


parse_body = _parse  # the fast JSON parser (orjson when installed)


def record_from_columns(
    object_id: Any, seq: Any, trace_id: Any, ts_us: Any, node_id: Any, policy_ref: Any,
    kind: Any, body_bytes: Any, prev_hash: Any, hash: Any, signature: Any,  # noqa: A002
) -> Record:
    """A ``Record`` from stored columns in table order (hashes as raw bytes).

    The path every record read takes: when every column has its storage type, the
    kind is known and the body is one JSON object, the record is built at once;
    anything else goes through ``decode_record``'s checks, which fail closed with a
    ``RecordDecodeError`` that names the column or the problem.
    """
    if (type(object_id) is str and type(seq) is int and type(trace_id) is str
            and type(ts_us) is int and type(node_id) is str and type(policy_ref) is str
            and kind in KNOWN_KINDS and type(kind) is str and type(body_bytes) is bytes
            and type(prev_hash) is bytes and type(hash) is bytes and type(signature) is bytes):
        try:
            body = None if has_long_digits(body_bytes) else _parse(body_bytes)
        except ValueError:
            pass  # a body the fast parser declines: the checked path decides
        else:
            if type(body) is dict:
                return Record(object_id, seq, trace_id, ts_us, node_id, policy_ref, kind,
                              body_bytes, prev_hash.hex(), hash.hex(), signature, body)
    return _checked(object_id, seq, trace_id, ts_us, node_id, policy_ref, kind, body_bytes,
                    prev_hash, hash, signature)


_COLUMNS: tuple[tuple[str, type], ...] = (
    ("object_id", str), ("seq", int), ("trace_id", str), ("ts_us", int), ("node_id", str),
    ("policy_ref", str), ("kind", str), ("body", bytes), ("prev_hash", bytes), ("hash", bytes),
    ("signature", bytes),
)


def _shown(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value.encode("utf-8", "replace").decode() if isinstance(value, str) else str(value)


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _checked(*values: Any) -> Record:
    """The slow path of ``record_from_columns``: say exactly what is wrong, or build it."""
    values = tuple(bytes(v) if isinstance(v, memoryview) else v for v in values)
    fixed = list(values)
    for at, (value, (column, kind)) in enumerate(zip(values, _COLUMNS, strict=True)):
        if kind is str and isinstance(value, bytes):  # a text column read as bytes
            try:
                fixed[at] = value.decode("utf-8")
            except UnicodeDecodeError:
                raise RecordDecodeError(
                    _shown(values[0]), values[1] if isinstance(values[1], int) else -1,
                    f"column {column} is not valid UTF-8 text",
                ) from None
            continue
        if isinstance(value, str) and not _utf8(value):
            raise RecordDecodeError(
                _shown(values[0]), values[1] if isinstance(values[1], int) else -1,
                f"column {column} is not valid UTF-8 text",
            )
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise RecordDecodeError(
                str(values[0]), values[1] if isinstance(values[1], int) else -1,
                f"column {column} holds {type(value).__name__}, not {kind.__name__}",
            )
    values = tuple(fixed)
    return decode_record(
        object_id=values[0], seq=values[1], trace_id=values[2], ts_us=values[3],
        node_id=values[4], policy_ref=values[5], kind=values[6], body_bytes=values[7],
        prev_hash=values[8].hex(), hash=values[9].hex(), signature=values[10],
    )
