"""Recorded step failures: the exception an agent sees is the one memory can give back.

``error_body`` describes an exception as JSON and ``rebuild_error`` makes it again
without calling its ``__init__``. For every type that can be rebuilt the pair is a
fixpoint (``error_body(rebuild_error(s, error_body(e))) == error_body(e)``); every
other type becomes the same ``StepFailedError`` however often it is rebuilt.
"""

from __future__ import annotations

import errno
import gzip
import json
import threading
from pathlib import PurePosixPath
from typing import Any

import anthropic
import httpx
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

from perdure.core.codec import decode, encode
from perdure.engine.failures import (
    BUDGET,
    CONTENT_LIMIT,
    REDACTED,
    Unrecorded,
    error_body,
    rebuild_error,
)
from perdure.errors import LeaseLostError, PerdureSignal, StepFailedError
from tests.unit.builders import PROFILE

STEP = "fetch"


def stored(body: dict[str, Any]) -> Any:
    """The body as memory gives it back: canonical JSON bytes, decoded."""
    return decode(encode(body))


def round_trip(exc: BaseException) -> Any:
    """Record ``exc``, rebuild it from memory, and check the rebuilt one is the same.

    Same type, same ``str``, same args, and the body of the rebuilt exception is the
    body it was rebuilt from (a second rebuild too).
    """
    body = error_body(exc)
    assert stored(body) == body  # a pure JSON value, canonical JSON holds it as it is
    rebuilt = rebuild_error(STEP, stored(body))
    assert type(rebuilt) is type(exc)
    assert str(rebuilt) == str(exc) == body["message"]
    assert repr(rebuilt.args) == repr(exc.args)  # exceptions among them compare by repr
    assert error_body(rebuilt) == body
    assert error_body(rebuild_error(STEP, body)) == body  # first run: the body in hand
    assert error_body(rebuild_error(STEP, stored(error_body(rebuilt)))) == body
    assert encode(error_body(exc)) == encode(body)  # deterministic
    return rebuilt


def assert_stand_in(exc: BaseException) -> StepFailedError:
    """``exc`` cannot be rebuilt: the stand-in, the same on every rebuild."""
    body = error_body(exc)
    first = rebuild_error(STEP, stored(body))
    again = rebuild_error(STEP, stored(body))
    assert isinstance(first, StepFailedError)
    assert error_body(first) == error_body(again)
    assert (first.step, first.error_type, first.message) == (
        STEP, body["type"], str(exc))
    round_trip(first)  # the stand-in itself is recorded and rebuilt like any error
    return first


# -- exception classes the tests raise (module level: their path can be imported) --


class PairError(Exception):
    """Two positional constructor arguments, one formatted message."""

    def __init__(self, left: str, right: int) -> None:
        super().__init__(f"{left} needs {right}")
        self.left = left
        self.right = right


class KeyedError(Exception):
    """Keyword-only constructor arguments, as SDK errors take them."""

    def __init__(self, message: str, *, code: int, retry: list[str]) -> None:
        super().__init__(message)
        self.code = code
        self.retry = retry


class LoudError(Exception):
    """An ``__init__`` with a side effect, and one that raises on the recorded args."""

    calls = 0

    def __init__(self, message: str, connection: object) -> None:
        LoudError.calls += 1
        if not isinstance(connection, threading.Thread):
            raise TypeError("LoudError needs a live thread")
        super().__init__(message)
        self.thread_name = connection.name


class SlottedError(Exception):
    """State in ``__slots__`` rather than in ``__dict__``."""

    __slots__ = ("code", "unset")

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class HoldingError(Exception):
    """An attribute memory cannot hold (a lock) beside ones it can."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()
        self.items = [1, threading.Lock(), "three"]
        self.count = 3


class WrapperError(Exception):
    """Another exception held as an attribute."""

    def __init__(self, inner: BaseException) -> None:
        super().__init__(f"wrapped: {inner}")
        self.inner = inner


class Halt(PerdureSignal):
    """A control-flow signal: never handed to an agent as a rebuilt exception."""


class BagError(Exception):
    """Plain args and whatever attributes a test puts in its ``__dict__``."""


class ShoutingError(Exception):
    """``str()`` computed from an attribute, not from args."""

    def __init__(self, word: str) -> None:
        super().__init__()
        self.word = word

    def __str__(self) -> str:
        return self.word.upper()


class UnprintableError(Exception):
    """A ``__str__`` that raises."""

    def __str__(self) -> str:
        raise RuntimeError("no text")


# -- built-in exceptions --


def _raised(fn: Any) -> BaseException:
    try:
        fn()
    except Exception as exc:
        return exc
    raise AssertionError("nothing raised")


@pytest.mark.parametrize("exc", [
    ValueError("bad value"),
    ValueError(),
    ValueError("two", 2),
    ValueError({"zeta": 1, "alpha": [2, {"y": 0, "x": 1}]}),  # repr in the message: order kept
    KeyError("missing"),
    TimeoutError("too slow"),
    OSError("plain"),
    OSError(99999, "no such errno name"),
    OSError(errno.EACCES, "Permission denied", "/etc/shadow"),
    FileNotFoundError(errno.ENOENT, "No such file or directory", "a.txt"),
    FileNotFoundError(errno.ENOENT, "No such file or directory", "a.txt", None, "b.txt"),
    BlockingIOError(errno.EAGAIN, "try again", 7),
    _raised(lambda: b"\xff\xfe".decode("utf-8")),
    _raised(lambda: json.loads('{"a": 1,\n "b": }')),
    _raised(lambda: compile("1 +", "snippet.py", "exec")),
    _raised(lambda: {}["key"]),
    StopIteration(42),
    ExceptionGroup("several", [ValueError("one"), KeyError("two")]),
])
def test_builtin_exceptions_round_trip(exc: BaseException) -> None:
    """Built-in exceptions come back with their type, message, args and C fields."""
    rebuilt = round_trip(exc)
    for name in ("errno", "strerror", "filename", "filename2", "encoding", "object",
                 "start", "end", "reason", "msg", "doc", "pos", "lineno", "colno",
                 "offset", "text", "value", "characters_written"):
        if hasattr(exc, name):
            assert getattr(rebuilt, name) == getattr(exc, name), name


def test_oserror_keeps_its_filename_and_subclass() -> None:
    """``OSError(errno, strerror, filename)`` comes back as the errno's subclass, with
    errno, strerror and filename, and the message that names the file."""
    rebuilt = round_trip(OSError(errno.ENOENT, "No such file or directory", "data.csv"))
    assert isinstance(rebuilt, FileNotFoundError)
    assert (rebuilt.errno, rebuilt.strerror, rebuilt.filename) == (
        errno.ENOENT, "No such file or directory", "data.csv")
    assert str(rebuilt) == "[Errno 2] No such file or directory: 'data.csv'"


def test_json_decode_error_keeps_its_position() -> None:
    """``json.JSONDecodeError`` keeps msg, doc, pos, lineno and colno."""
    exc = _raised(lambda: json.loads("[1, 2,,]"))
    assert isinstance(exc, json.JSONDecodeError)
    rebuilt = round_trip(exc)
    assert isinstance(rebuilt, json.JSONDecodeError)
    assert (rebuilt.msg, rebuilt.doc, rebuilt.pos, rebuilt.lineno, rebuilt.colno) == (
        exc.msg, exc.doc, exc.pos, exc.lineno, exc.colno)


def test_exception_group_holds_rebuilt_members() -> None:
    """An exception group's members come back as their own types."""
    rebuilt = round_trip(ExceptionGroup("batch", [KeyError("k"), PairError("x", 2)]))
    assert isinstance(rebuilt, ExceptionGroup)
    assert [type(e) for e in rebuilt.exceptions] == [KeyError, PairError]
    assert isinstance(rebuilt.exceptions[1], PairError) and rebuilt.exceptions[1].right == 2


def test_notes_are_kept() -> None:
    """Notes added with ``add_note`` come back."""
    exc = ValueError("bad")
    exc.add_note("while reading row 7")
    assert round_trip(exc).__notes__ == ["while reading row 7"]


# -- user classes --


def test_two_positional_arguments() -> None:
    """A constructor taking two arguments (args hold only the message) is rebuilt."""
    rebuilt = round_trip(PairError("disk", 3))
    assert (rebuilt.left, rebuilt.right) == ("disk", 3)


def test_keyword_only_arguments() -> None:
    """A constructor with keyword-only arguments is rebuilt, attributes and all."""
    rebuilt = round_trip(KeyedError("throttled", code=429, retry=["a", "b"]))
    assert (rebuilt.code, rebuilt.retry) == (429, ["a", "b"])


def test_init_is_never_called() -> None:
    """The class's ``__init__`` is not called: its side effects do not happen again,
    and one that would raise on the recorded args does not stop the rebuild."""
    exc = LoudError("lost connection", threading.current_thread())
    calls = LoudError.calls
    rebuilt = round_trip(exc)
    assert LoudError.calls == calls
    assert rebuilt.thread_name == exc.thread_name


def test_slots_are_restored() -> None:
    """Values in ``__slots__`` come back; an unset slot stays unset."""
    rebuilt = round_trip(SlottedError("slot", 5))
    assert rebuilt.code == 5
    assert not hasattr(rebuilt, "unset")


def test_unencodable_attribute_is_dropped_the_same_way_every_time() -> None:
    """An attribute memory cannot hold is listed as dropped and comes back as the same
    ``Unrecorded`` stand-in on every rebuild; the other attributes are kept."""
    exc = HoldingError("busy")
    body = error_body(exc)
    assert body["dropped"] == ["items", "lock"]
    first = round_trip(exc)
    second = rebuild_error(STEP, stored(body))
    assert isinstance(first.lock, Unrecorded)
    assert first.lock == second.lock
    assert first.lock.type_path == "_thread:lock"
    assert first.items[0] == 1 and first.items[2] == "three"
    assert isinstance(first.items[1], Unrecorded)
    assert first.count == 3


def test_attribute_values_keep_their_types() -> None:
    """Tuples, bytes, paths, dicts with the tag key and nested exceptions keep their types."""
    exc = BagError("typed")
    exc.pair = (1, ("two", b"\x00\xff"))
    exc.where = PurePosixPath("/tmp/x")
    exc.odd = {"$perdure": "not a tag", "n": [1.5, None, True]}
    exc.cause = KeyError("inner")
    rebuilt = round_trip(exc)
    assert rebuilt.pair == (1, ("two", b"\x00\xff"))
    assert rebuilt.where == PurePosixPath("/tmp/x")
    assert rebuilt.odd == exc.odd
    assert type(rebuilt.cause) is KeyError and str(rebuilt.cause) == "'inner'"


def test_str_computed_from_attributes() -> None:
    """An exception whose ``str()`` reads an attribute comes back with the same text."""
    assert str(round_trip(ShoutingError("stop"))) == "STOP"


def test_nested_exception_of_a_local_class_is_dropped() -> None:
    """A held exception that cannot be rebuilt is dropped; its holder is still rebuilt."""

    class LocalError(Exception):
        pass

    rebuilt = round_trip(WrapperError(LocalError("gone")))
    assert isinstance(rebuilt.inner, Unrecorded)
    assert error_body(rebuilt)["dropped"] == ["inner"]


def test_an_exception_that_refers_to_itself() -> None:
    """A cycle is cut where it closes; the rest is kept."""
    exc = BagError("loop")
    exc.me = exc
    exc.box = [exc]
    rebuilt = round_trip(exc)
    assert isinstance(rebuilt.me, Unrecorded) and rebuilt.me.reason == "refers to itself"


# -- what cannot be rebuilt --


def test_local_class_gets_the_stand_in() -> None:
    """A class defined inside a function cannot be imported: the stand-in, every time."""

    class LocalError(Exception):
        pass

    stand_in = assert_stand_in(LocalError("nope"))
    assert "LocalError" in stand_in.error_type


def test_signal_is_refused() -> None:
    """A ``PerdureSignal`` is never rebuilt into the agent: the stand-in."""
    assert_stand_in(Halt("stop"))
    assert_stand_in(LeaseLostError("lease gone"))


def test_main_module_classes_are_refused() -> None:
    """A class from ``__main__`` differs between processes: the stand-in, even where it
    would resolve."""
    body = {"type": "__main__:Whatever", "message": "m", "args": ["m"], "attrs": {},
            "dropped": []}
    assert isinstance(rebuild_error(STEP, body), StepFailedError)


def test_unencodable_args_get_the_stand_in() -> None:
    """Args memory cannot hold: the message could not be reproduced, so the stand-in."""
    body = error_body(ValueError(threading.Lock()))
    assert body["args"] is None and "args_tagged" not in body
    assert_stand_in(ValueError(threading.Lock()))


def test_unprintable_exception_is_consistent() -> None:
    """A ``__str__`` that raises is recorded with a fixed message; the rebuilt one fails
    to print the same way, so it is the same exception again."""
    body = error_body(UnprintableError("x"))
    assert body["message"] == "<tests.unit.test_failures:UnprintableError could not be printed>"
    rebuilt = rebuild_error(STEP, stored(body))
    assert type(rebuilt) is UnprintableError
    assert error_body(rebuilt) == body


def test_tampered_body_gets_the_stand_in() -> None:
    """A body whose message the rebuilt exception does not reproduce is not trusted."""
    body = stored(error_body(ValueError("real")))
    body["message"] = "something else"
    assert isinstance(rebuild_error(STEP, body), StepFailedError)


@pytest.mark.parametrize("type_path", [
    "builtins:len", "builtins:KeyboardInterrupt", "builtins:SystemExit",
    "perdure.engine.run:Suspend", "no.such.module:Error", "builtins:NoSuchError", "broken",
])
def test_what_is_not_an_exception_to_hand_over(type_path: str) -> None:
    """Non-exceptions, ``BaseException``-only signals and unknown types: the stand-in."""
    body = {"type": type_path, "message": "m", "args": ["m"], "attrs": {}, "dropped": []}
    rebuilt = rebuild_error(STEP, body)
    assert isinstance(rebuilt, StepFailedError)
    assert rebuilt.error_type == type_path


def test_records_without_attrs_rebuild_as_before() -> None:
    """A body from before attributes were recorded is rebuilt with ``cls(*args)``."""
    old = {"type": "builtins:ValueError", "message": "x", "args": ["x"]}
    assert type(rebuild_error(STEP, old)) is ValueError
    assert str(rebuild_error(STEP, old)) == "x"
    pair = rebuild_error(STEP, {"type": "tests.unit.test_failures:PairError",
                                "message": "a needs 1", "args": ["a", 1]})
    assert isinstance(pair, PairError) and pair.right == 1
    for body in ({"type": "builtins:ValueError", "message": "x", "args": None},
                 {"type": "tests.unit.test_failures:KeyedError", "message": "k", "args": ["k"]}):
        assert isinstance(rebuild_error(STEP, body), StepFailedError)


# -- size --


def test_oversized_attribute_is_dropped() -> None:
    """An attribute past the size budget becomes a stand-in; the body stays small."""
    exc = BagError("big")
    exc.huge = "x" * (BUDGET * 2)
    exc.small = "kept"
    body = error_body(exc)
    assert len(encode(body)) < BUDGET
    assert body["dropped"] == ["huge"]
    rebuilt = round_trip(exc)
    assert rebuilt.huge == Unrecorded("builtins:str", "too large") and rebuilt.small == "kept"


def test_deep_nesting_is_cut() -> None:
    """Containers nested past the depth limit are cut with a stand-in."""
    exc = BagError("deep")
    value: Any = "bottom"
    for _ in range(50):
        value = [value]
    exc.deep = value
    body = error_body(exc)
    assert body["dropped"] == ["deep"]
    round_trip(exc)


# -- httpx --


def _http_status_error(**response: Any) -> httpx.HTTPStatusError:
    request = httpx.Request("GET", "https://api.example.test/items?id=3",
                            headers={"Accept": "application/json",
                                     "Authorization": "Bearer secret-token"})
    reply = httpx.Response(request=request, **response)
    exc = _raised(reply.raise_for_status)
    assert isinstance(exc, httpx.HTTPStatusError)
    return exc


def test_httpx_status_error_round_trips() -> None:
    """``httpx.HTTPStatusError`` comes back with a real request and response: status,
    headers, body text and URL survive, and the properties that read them work."""
    exc = _http_status_error(status_code=404, headers={"X-Trace": "t-1"},
                             json={"error": "no such item"})
    rebuilt = round_trip(exc)
    assert isinstance(rebuilt.response, httpx.Response)
    assert isinstance(rebuilt.request, httpx.Request)
    assert rebuilt.response.status_code == 404
    assert rebuilt.response.reason_phrase == "Not Found"
    assert rebuilt.response.headers["x-trace"] == "t-1"
    assert rebuilt.response.headers["content-type"] == "application/json"
    assert rebuilt.response.json() == {"error": "no such item"}
    assert rebuilt.response.text == exc.response.text
    assert rebuilt.request.url == "https://api.example.test/items?id=3"
    assert rebuilt.response.request.url == exc.request.url
    assert rebuilt.request.method == "GET"
    assert rebuilt.response.is_error


def test_credentials_are_not_recorded() -> None:
    """An ``Authorization`` header is redacted in memory and in the rebuilt request."""
    exc = _http_status_error(status_code=401)
    assert b"secret-token" not in encode(error_body(exc))
    assert round_trip(exc).request.headers["authorization"] == REDACTED


def test_compressed_body_is_not_decoded_twice() -> None:
    """A gzip body is recorded as read (decoded) and comes back readable, with the
    ``Content-Encoding`` header still there."""
    exc = _http_status_error(status_code=500, headers={"Content-Encoding": "gzip"},
                             content=gzip.compress(b"upstream exploded"))
    rebuilt = round_trip(exc)
    assert rebuilt.response.text == "upstream exploded"
    assert rebuilt.response.headers["content-encoding"] == "gzip"


def test_large_body_is_cut_and_marked() -> None:
    """A response body over ``CONTENT_LIMIT`` is cut there and marked as cut, and the
    mark survives rebuilding."""
    exc = _http_status_error(status_code=502, content=b"y" * (CONTENT_LIMIT * 3))
    body = error_body(exc)
    recorded = body["attrs"]["response"]
    assert recorded["truncated_from"] == CONTENT_LIMIT * 3
    assert len(recorded["content"]["text"]) == CONTENT_LIMIT
    rebuilt = round_trip(exc)
    assert len(rebuilt.response.content) == CONTENT_LIMIT


def test_binary_body_is_kept_exactly() -> None:
    """A body that is not UTF-8 is recorded as base64 and comes back byte for byte."""
    data = bytes(range(256)) * 3
    rebuilt = round_trip(_http_status_error(status_code=500, content=data))
    assert rebuilt.response.content == data


def test_unread_streamed_body_stays_unread() -> None:
    """A streamed response that was never read comes back unread, not empty."""
    request = httpx.Request("GET", "https://api.example.test/stream")
    reply = httpx.Response(503, stream=httpx.ByteStream(b"later"), request=request)
    exc = httpx.HTTPStatusError("unavailable", request=request, response=reply)
    body = error_body(exc)
    assert body["attrs"]["response"]["content"] is None
    rebuilt = round_trip(exc)
    with pytest.raises(httpx.ResponseNotRead):
        _ = rebuilt.response.content


# -- LLM SDKs --


def _sdk_http(module: Any) -> Any:
    """The httpx-like library an SDK's errors are built from (httpx2 or httpx)."""
    return getattr(module, "httpx2", None) or module.httpx


def test_openai_rate_limit_error_round_trips() -> None:
    """``openai.RateLimitError`` comes back as itself: message, status code, the
    ``retry-after`` header, body, request id, and its place in the SDK's tree."""
    http = _sdk_http(openai._exceptions)
    error = {"message": "Rate limit reached", "type": "requests", "param": None,
             "code": "rate_limit_exceeded"}
    request = http.Request("POST", "https://api.openai.com/v1/chat/completions",
                           headers={"Authorization": "Bearer sk-secret"}, json={"model": "m"})
    response = http.Response(429, headers={"retry-after": "20", "x-request-id": "req_1"},
                             json={"error": error}, request=request)
    exc = openai.RateLimitError(f"Error code: 429 - {error}", response=response, body=error)
    rebuilt = round_trip(exc)
    assert isinstance(rebuilt, openai.RateLimitError)
    assert isinstance(rebuilt, openai.APIStatusError)
    assert rebuilt.status_code == 429
    assert rebuilt.response.headers["retry-after"] == "20"
    assert rebuilt.body == error
    assert rebuilt.request_id == "req_1"
    assert (rebuilt.code, rebuilt.type, rebuilt.param) == ("rate_limit_exceeded", "requests", None)
    assert rebuilt.message == exc.message
    assert rebuilt.request.url == "https://api.openai.com/v1/chat/completions"
    assert rebuilt.response.json() == {"error": error}
    assert b"sk-secret" not in encode(error_body(exc))


def test_anthropic_rate_limit_error_round_trips() -> None:
    """``anthropic.RateLimitError`` comes back as itself, its details model included."""
    http = _sdk_http(anthropic._exceptions)
    payload = {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down",
                                          "details": {"error_code": "ramp_limit_exceeded"}}}
    request = http.Request("POST", "https://api.anthropic.com/v1/messages",
                           headers={"x-api-key": "sk-ant-secret"})
    response = http.Response(429, headers={"retry-after": "7", "request-id": "req_a"},
                             json=payload, request=request)
    exc = anthropic.RateLimitError(f"Error code: 429 - {payload}", response=response,
                                   body=payload)
    rebuilt = round_trip(exc)
    assert isinstance(rebuilt, anthropic.RateLimitError)
    assert isinstance(rebuilt, anthropic.APIStatusError)
    assert rebuilt.status_code == 429
    assert rebuilt.response.headers["retry-after"] == "7"
    assert rebuilt.body == payload
    assert rebuilt.request_id == "req_a"
    assert (rebuilt.type, rebuilt.api_message) == ("rate_limit_error", "slow down")
    assert rebuilt.error_code == "ramp_limit_exceeded"
    assert rebuilt.details == exc.details
    assert b"sk-ant-secret" not in encode(error_body(exc))


# -- properties --

_json = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.sampled_from(["$perdure", "a", "b", "type"]) | st.text(max_size=5),
                      inner, max_size=4),
    max_leaves=12,
)
_values = st.recursive(
    _json | st.binary(max_size=8),
    lambda inner: st.tuples(inner, inner) | st.lists(inner, max_size=3),
    max_leaves=6,
)


@PROFILE
@given(args=st.lists(_values, max_size=4),
       attrs=st.dictionaries(st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True), _values,
                             max_size=5))
def test_arbitrary_args_and_attributes_round_trip(args: list[Any],
                                                  attrs: dict[str, Any]) -> None:
    """Any JSON values, tuples and bytes as args and attributes come back equal, and the
    body of the rebuilt exception is the body it came from."""
    exc = BagError(*args)
    exc.__dict__.update(attrs)
    rebuilt = round_trip(exc)
    assert vars(rebuilt) == attrs


@PROFILE
@given(st.builds(BagError, st.text(max_size=10)), st.sampled_from([
    object(), threading.Lock(), {1: "int key"}, {"x": float("nan")}, "\ud800", 10**5000,
]))
def test_error_body_never_raises(exc: BagError, value: Any) -> None:
    """Values memory cannot hold are dropped, never raised; the body stays a fixpoint."""
    exc.odd = value
    body = error_body(exc)
    assert body["dropped"] == ["odd"]
    round_trip(exc)


def _json_depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_json_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_json_depth, value), default=0)
    return 0


def test_body_nesting_stays_shallow() -> None:
    """However deep the attributes nest (unsorted dicts, tuples, exceptions), the body
    nests well within what memory accepts."""
    value: Any = "bottom"
    for level in range(20):
        value = {"z": value, "a": (value if level < 3 else 0,)}
    exc = BagError("deep")
    exc.deep = value
    exc.chain = WrapperError(WrapperError(WrapperError(KeyError("k"))))
    body = error_body(exc)
    assert _json_depth(body) <= 40
    round_trip(exc)
