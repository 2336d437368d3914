"""Canonical JSON: one byte string per value, and refusal of what JSON cannot hold."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perdure.core.codec import decode, encode
from perdure.core.records import step_done_bytes
from perdure.errors import SerializationError
from tests.unit.builders import PROFILE

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


def test_keys_are_sorted_at_every_depth() -> None:
    """Object keys come out sorted, in nested objects too."""
    assert encode({"b": 1, "a": {"z": 0, "y": [{"d": 1, "c": 2}]}}) == (
        b'{"a":{"y":[{"c":2,"d":1}],"z":0},"b":1}'
    )


def test_no_insignificant_whitespace() -> None:
    """Separators carry no spaces or newlines; spaces inside strings are kept."""
    data = encode({"k": [1, 2, {"x": "a b"}], "n": None, "t": True})
    assert data == b'{"k":[1,2,{"x":"a b"}],"n":null,"t":true}'


def test_insertion_order_does_not_change_the_bytes() -> None:
    """Two equal dicts built in different orders encode identically."""
    first = {"alpha": 1, "beta": 2, "gamma": 3}
    second = {"gamma": 3, "alpha": 1, "beta": 2}
    assert encode(first) == encode(second)


def test_unicode_is_utf8_not_escaped() -> None:
    """Non-ASCII text is written as UTF-8 bytes, not as \\u escapes, and decodes back."""
    value = {"name": "Zoë", "emoji": "🦉", "cjk": "持続"}
    data = encode(value)
    assert "Zoë".encode() in data
    assert "🦉".encode() in data
    assert b"\\u" not in data
    assert decode(data) == value


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nan_and_infinities_are_refused(bad: float) -> None:
    """NaN and infinities have no JSON form: SerializationError naming the value's role."""
    with pytest.raises(SerializationError, match="step result cannot be stored"):
        encode({"x": [bad]}, what="step result")


@pytest.mark.parametrize("bad", [{1, 2}, object(), b"bytes", {"k": 1j}, {("t",): 1}])
def test_non_json_values_are_refused(bad: Any) -> None:
    """Sets, bytes, complex numbers, arbitrary objects and tuple keys raise SerializationError."""
    with pytest.raises(SerializationError, match="JSON values only"):
        encode(bad)


def test_refusal_chains_the_original_error() -> None:
    """The SerializationError keeps the encoder's error as its cause."""
    with pytest.raises(SerializationError) as info:
        encode(math.nan)
    assert isinstance(info.value.__cause__, ValueError)


def test_decode_refuses_bad_bytes() -> None:
    """decode raises ValueError on bytes that are not JSON (callers name the record)."""
    with pytest.raises(ValueError):
        decode(b"{not json")


@PROFILE
@given(json_values)
def test_encoding_is_canonical(value: Any) -> None:
    """Any JSON value survives a round trip, and re-encoding gives the very same bytes."""
    data = encode(value)
    assert encode(decode(data)) == data
    assert decode(data) == value


@PROFILE
@given(attempt=st.integers(min_value=1, max_value=10**6),
       latency=st.floats(min_value=0, max_value=1e6),
       name=st.text(), pos=st.integers(min_value=0) | st.text(), result=json_values)
def test_step_done_bytes_are_the_encoders(attempt: int, latency: float, name: str,
                                          pos: int | str, result: Any) -> None:
    """The ``step_done`` body put together around the encoded result is byte for byte
    what the encoder gives for the whole body, or ``None`` for the encoder to do it."""
    latency = round(latency, 6)
    try:
        result_bytes = encode(result)
        whole = encode({"pos": pos, "cmd": "step", "name": name, "attempt": attempt,
                        "latency": latency, "result": decode(result_bytes)})
    except SerializationError:
        return  # a value JSON cannot hold (a lone surrogate): the step fails before this
    built = step_done_bytes(attempt, latency, name, pos, result_bytes)
    assert built is None or built == whole
    if name.isalnum() and (type(pos) is int or pos.isalnum()) and name.isascii():
        assert built == whole  # the common case takes the fast path


@given(st.none() | st.booleans() | st.integers() | st.text())
@PROFILE
def test_scalars_take_a_short_way_to_the_encoders_bytes(value: Any) -> None:
    """A scalar's bytes are exactly what the canonical JSON encoder gives."""
    import json

    assert encode(value) == json.dumps(value, ensure_ascii=False, sort_keys=True,
                                       separators=(",", ":"), allow_nan=False).encode()
    assert decode(encode(value)) == value


def test_a_lone_surrogate_is_refused_on_the_short_way_too() -> None:
    with pytest.raises(SerializationError, match="surrogates"):
        encode("\ud800")
