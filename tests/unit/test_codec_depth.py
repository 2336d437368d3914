"""The codec's nesting bound: deep values are refused as SerializationError, never a
RecursionError, and what the encoder accepts always decodes."""

from __future__ import annotations

from typing import Any

import pytest

from perdure.core.codec import ENVELOPE_DEPTH, MAX_DEPTH, decode, encode
from perdure.errors import SerializationError


def nested(depth: int, *, kind: str = "list") -> Any:
    """A value whose lists (or dicts) nest ``depth`` levels: ``nested(2) == [[1]]``."""
    value: Any = 1
    for _ in range(depth):
        value = [value] if kind == "list" else {"k": value}
    return value


@pytest.mark.parametrize("kind", ["list", "dict"])
def test_a_value_at_the_bound_round_trips(kind: str) -> None:
    """Lists or dicts nested exactly ``MAX_DEPTH`` levels encode and decode back."""
    value = nested(MAX_DEPTH, kind=kind)
    data = encode(value, max_depth=MAX_DEPTH)
    assert decode(data) == value


@pytest.mark.parametrize("kind", ["list", "dict"])
def test_one_level_more_is_refused(kind: str) -> None:
    """One level past the bound is a SerializationError that names the value and the bound."""
    with pytest.raises(SerializationError,
                       match=r"step result cannot be stored: .*nest more than 128 levels"):
        encode(nested(MAX_DEPTH + 1, kind=kind), what="step result", max_depth=MAX_DEPTH)


def test_the_default_leaves_room_for_an_envelope() -> None:
    """Without ``max_depth`` the encoder takes ``ENVELOPE_DEPTH`` levels more, so a value at
    the bound still fits inside a record body; past that it refuses, still naming 128."""
    body = {"result": {"outer": nested(MAX_DEPTH)}}
    assert decode(encode(body)) == body
    assert encode(nested(MAX_DEPTH + ENVELOPE_DEPTH))
    with pytest.raises(SerializationError, match="more than 128 levels"):
        encode(nested(MAX_DEPTH + ENVELOPE_DEPTH + 1))


@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_far_too_deep_is_a_serialization_error(depth: int) -> None:
    """Nesting far past the bound, deep enough to exhaust the encoder's recursion, is the
    same SerializationError, chained to the RecursionError when there was one."""
    with pytest.raises(SerializationError, match="nest more than 128 levels") as caught:
        encode(nested(depth), what="payload")
    cause = caught.value.__cause__
    assert cause is None or isinstance(cause, RecursionError)


def test_mixed_and_wide_values() -> None:
    """Depth is the deepest branch, whatever the width: many shallow containers (more
    brackets than the bound) pass; one deep branch among them does not."""
    wide = [{"a": [i]} for i in range(1000)]
    assert decode(encode(wide, max_depth=3)) == wide
    with pytest.raises(SerializationError):
        encode(wide, max_depth=2)
    deep_branch = [*wide, nested(MAX_DEPTH)]
    with pytest.raises(SerializationError):
        encode(deep_branch, max_depth=MAX_DEPTH)
    assert encode([nested(MAX_DEPTH - 1)], max_depth=MAX_DEPTH)
    tuples: Any = (1,)
    for _ in range(MAX_DEPTH):
        tuples = (tuples,)
    with pytest.raises(SerializationError):
        encode(tuples, max_depth=MAX_DEPTH)


def test_brackets_inside_strings_do_not_count() -> None:
    """Brackets in text are not nesting: a string full of them is a flat value."""
    value = {"text": "[" * 10_000 + "{" * 10_000}
    assert decode(encode(value, max_depth=1)) == value


def test_scalars_keep_their_short_way() -> None:
    """Scalars are encoded as before, whatever the bound."""
    assert encode(7, max_depth=0) == b"7"
    assert encode("a[b", max_depth=0) == b'"a[b"'
    assert encode(None, max_depth=0) == b"null"


@pytest.mark.parametrize("value", [["ok", "\ud800"], {"k\udcff": 1}, "\udfff"])
def test_lone_surrogates_inside_values_are_refused(value: Any) -> None:
    """A lone surrogate anywhere in a value (a string, a key) is a SerializationError."""
    with pytest.raises(SerializationError, match="surrogates not allowed"):
        encode(value)


@pytest.mark.parametrize("depth", [5_000, 100_000])
def test_decode_of_too_deep_json_is_a_value_error(depth: int) -> None:
    """JSON nested past what the parser can follow raises ValueError (callers turn it
    into RecordDecodeError), not RecursionError."""
    with pytest.raises(ValueError, match="nested too deeply"):
        decode(b"[" * depth + b"]" * depth)
