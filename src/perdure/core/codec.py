"""Canonical JSON: the one encoding of every value perdure writes to memory.

Canonical means one byte string per value: keys sorted, no insignificant
whitespace, UTF-8, no NaN or infinities. Hashes are taken over these bytes, so
two nodes that encode the same value always agree.

Nesting is bounded. A value (an agent's arguments, an event's payload, a result) may
nest its lists and dicts at most ``MAX_DEPTH`` (128) levels deep (``[[1]]`` is two
levels, a scalar none); memory puts each value a few levels down inside a record body,
so ``encode`` itself accepts ``ENVELOPE_DEPTH`` (8) levels more unless told
``max_depth=MAX_DEPTH``, which is how values are checked where they come in. Without a
bound a deep value fails with a ``RecursionError``, or is written and then cannot be
read back by a node whose stack is deeper; 128 levels is far more than real data needs
and far below what every decoder handles.
"""

from __future__ import annotations

import json
from typing import Any

from perdure.errors import SerializationError

__all__ = ["ENVELOPE_DEPTH", "MAX_DEPTH", "decode", "detached", "encode"]

MAX_DEPTH = 128  # how deep a value's lists and dicts may nest
ENVELOPE_DEPTH = 8  # levels a record body (or a signal) may add around a value

_encoder = json.JSONEncoder(
    ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False
)


_quoted = json.encoder.encode_basestring  # what the encoder does to a str (no ASCII escaping)
_CONSTANTS: dict[Any, bytes] = {None: b"null", True: b"true", False: b"false"}


def encode(value: Any, *, what: str = "value",
           max_depth: int = MAX_DEPTH + ENVELOPE_DEPTH) -> bytes:
    """Encode ``value`` canonically; ``SerializationError`` (naming ``what``) if it cannot be.

    Refused: anything that is not a JSON value, text with a lone surrogate (not valid
    UTF-8), and lists and dicts nested more than ``max_depth`` levels deep (pass
    ``max_depth=MAX_DEPTH`` for a value on its own, the default leaves room for a
    record body around one).
    """
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
        data = _encoder.encode(value).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise SerializationError(
            f"{what} cannot be stored: {exc}. Memory holds JSON values only "
            "(dict with str keys, list, str, int, float, bool, None); convert it first"
        ) from exc
    except RecursionError as exc:  # nested far deeper than the bound: the encoder gave up
        raise _too_deep(what, max_depth) from exc
    # Nesting cannot be deeper than the number of opening brackets, which two C-speed
    # counts give; only a value with more of them than the bound is walked.
    if data.count(b"[") + data.count(b"{") > max_depth and _nests_deeper(value, max_depth):
        raise _too_deep(what, max_depth)
    return data


def _too_deep(what: str, max_depth: int) -> SerializationError:
    # A bound above MAX_DEPTH leaves room for an envelope: the value itself nests deeper
    # than MAX_DEPTH, and that is the rule a person can act on.
    return SerializationError(
        f"{what} cannot be stored: its lists and dicts nest more than "
        f"{min(max_depth, MAX_DEPTH)} levels deep; flatten it (or store the deep part as "
        "a JSON string)"
    )


_CONTAINERS = (dict, list, tuple)  # what the encoder writes as JSON arrays and objects


def _nests_deeper(value: Any, limit: int) -> bool:
    """Whether ``value``'s lists and dicts nest more than ``limit`` levels (no recursion)."""
    if not isinstance(value, _CONTAINERS):
        return False
    todo: list[tuple[Any, int]] = [(value, 1)]
    while todo:
        node, depth = todo.pop()
        if depth > limit:
            return True
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, _CONTAINERS):
                todo.append((child, depth + 1))
    return False


def decode(data: bytes) -> Any:
    """Decode canonical JSON bytes; raises ``ValueError`` (caller names the record) on bad bytes.

    JSON nested too deeply for the parser (never what ``encode`` writes) is bad bytes too.
    """
    try:
        return json.loads(data)
    except RecursionError as exc:
        raise ValueError("JSON nested too deeply to decode") from exc


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
