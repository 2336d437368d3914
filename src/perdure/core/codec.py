"""Canonical JSON: the one encoding of every value perdure writes to memory.

Canonical means one byte string per value: keys sorted, no insignificant
whitespace, UTF-8, no NaN or infinities. Hashes are taken over these bytes, so
two nodes that encode the same value always agree.
"""

from __future__ import annotations

import json
from typing import Any

from perdure.errors import SerializationError

__all__ = ["decode", "detached", "encode"]

_encoder = json.JSONEncoder(
    ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False
)


_quoted = json.encoder.encode_basestring  # what the encoder does to a str (no ASCII escaping)
_CONSTANTS: dict[Any, bytes] = {None: b"null", True: b"true", False: b"false"}


def encode(value: Any, *, what: str = "value") -> bytes:
    """Encode ``value`` canonically; ``SerializationError`` (naming ``what``) if it cannot be."""
    try:
        # A step's result is often a scalar: the encoder's machinery costs more than the
        # value. Same bytes as the encoder (an int as ``int.__repr__``, a str quoted by
        # the very function it uses); floats, containers and the rest go through it.
        kind = type(value)
        if kind is int:
            return b"%d" % value
        if kind is str:
            return _quoted(value).encode("utf-8")
        if value is None or kind is bool:
            return _CONSTANTS[value]
        return _encoder.encode(value).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise SerializationError(
            f"{what} cannot be stored: {exc}. Memory holds JSON values only "
            "(dict with str keys, list, str, int, float, bool, None); convert it first"
        ) from exc


def decode(data: bytes) -> Any:
    """Decode canonical JSON bytes; raises ``ValueError`` (caller names the record) on bad bytes."""
    return json.loads(data)


def detached(value: Any) -> Any:
    """A copy of a JSON value (dicts and lists copied all the way down).

    Values handed out of memory (step results, event payloads, intent arguments) are
    detached from the records they came from, so that code changing them in place
    never changes memory a node holds.
    """
    kind = type(value)
    if kind is dict:
        return {k: detached(v) for k, v in value.items()}
    if kind is list:
        return [detached(v) for v in value]
    return value
