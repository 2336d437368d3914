"""Step failures as memory records them, and the exceptions rebuilt from those records.

An exception raised inside a step reaches the agent as the same type, with the same
message and attributes, on the first run and on every replay. The engine records
``error_body(exc)`` and raises ``rebuild_error(step, body)`` on the first run as well
as on replay, so the agent never sees the live object: what it sees is what memory
holds. The two functions are a fixpoint::

    error_body(rebuild_error(step, error_body(exc))) == error_body(exc)

whenever the type can be rebuilt at all. A type that cannot (a class defined inside
a function or in ``__main__``, a control-flow signal, arguments memory cannot hold, a
message the rebuilt object does not reproduce) reaches the agent as
``StepFailedError`` every time, the first run included.

The body::

    {"type": "module:qualname", "message": str(exc),
     "args": [...] | None,           # plain JSON args; None if they need tags or cannot be held
     "args_tagged": [...],           # only when the args need tags (tuples, bytes, ...)
     "attrs": {name: value, ...},    # __dict__, __slots__ and the C fields of built-in types
     "dropped": [name, ...]}         # attrs holding a value memory could not hold

Values are JSON as they are, or tagged objects ``{"$perdure": kind, ...}``: ``tuple``,
``bytes``, ``dict`` (as key/value pairs: a dict whose keys are not in the sorted order
memory would give them back in, or that has ``$perdure`` as a key), ``path``,
``exception``, ``http_request`` / ``http_response`` (httpx or httpx2 objects, bodies cut
at ``CONTENT_LIMIT``, credential headers redacted), ``model`` (a pydantic model) and
``unrecorded``: what stands for a value that could not be held (an open socket, a lock,
a value past the size budget). A rebuilt exception holds an ``Unrecorded`` there, the
same on every rebuild.

The class is instantiated without calling its ``__init__`` (which may need live
objects, have side effects, or compute the message differently): ``cls.__new__``
with the recorded args, the nearest built-in base's ``__init__`` (which fills the C
fields of ``OSError``, ``UnicodeError`` and the like), then the attributes.
"""

from __future__ import annotations

import base64
import importlib
import math
import pathlib
import sys
import types
from collections.abc import Callable, Mapping
from typing import Any

from perdure.errors import PerdureSignal, StepFailedError

__all__ = [
    "BUDGET",
    "CONTENT_LIMIT",
    "MESSAGE_LIMIT",
    "REDACTED",
    "SECRET_HEADERS",
    "Unrecorded",
    "error_body",
    "rebuild_error",
]

CONTENT_LIMIT = 64 * 1024
"""Bytes of an HTTP request or response body kept; the rest is cut and the cut marked."""

MESSAGE_LIMIT = 64 * 1024
"""Characters of ``str(exc)`` kept; a longer message is cut (and the type not rebuilt)."""

BUDGET = 256 * 1024
"""Rough size (characters) of args and attributes one body may hold; past it, not held."""

SECRET_HEADERS = frozenset(
    {"api-key", "authorization", "cookie", "proxy-authorization", "set-cookie", "x-api-key",
     "x-goog-api-key"}
)
"""HTTP headers whose values never reach memory (an SDK's request carries the API key)."""

REDACTED = "[redacted]"

MAX_DEPTH = 8  # nested containers and exceptions deeper than this are not held

TAG = "$perdure"
_HTTP_LIBS = ("httpx", "httpx2")
_TRUNCATED = "perdure.truncated_from"  # extensions key of a rebuilt request/response
_NOT_FIELDS = frozenset(
    {"args", "__cause__", "__context__", "__dict__", "__suppress_context__",
     "__traceback__", "__weakref__"}
)
_UNSET = object()
_PATH_CLASSES = frozenset(
    {"Path", "PosixPath", "PurePath", "PurePosixPath", "PureWindowsPath", "WindowsPath"}
)


class Unrecorded:
    """Stands, in a rebuilt exception, for a value memory could not hold.

    ``type_path`` names the value's type (``module:qualname``), ``reason`` says why
    it was not held. Two stand-ins with the same type and reason are equal.
    """

    __slots__ = ("reason", "type_path")

    def __init__(self, type_path: str, reason: str) -> None:
        self.type_path = type_path
        self.reason = reason

    def __repr__(self) -> str:
        return f"<unrecorded {self.type_path}: {self.reason}>"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Unrecorded):
            return NotImplemented
        return (self.type_path, self.reason) == (other.type_path, other.reason)

    def __hash__(self) -> int:
        return hash((self.type_path, self.reason))


class _TooLarge(Exception):  # noqa: N818 - internal: the size budget ran out
    """The value being encoded does not fit in what is left of the budget."""


class _Refused(Exception):  # noqa: N818 - internal: a value or type that cannot be held
    """A value cannot be held, or a record cannot be rebuilt; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _type_path(cls: type) -> str:
    return f"{getattr(cls, '__module__', '?')}:{getattr(cls, '__qualname__', '?')}"


def _message(exc: BaseException) -> str:
    """``str(exc)``, cut at ``MESSAGE_LIMIT`` and made storable; never raises."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ gets a stable stand-in
        text = f"<{_type_path(type(exc))} could not be printed>"
    if len(text) > MESSAGE_LIMIT:
        text = f"{text[:MESSAGE_LIMIT]}... [{len(text) - MESSAGE_LIMIT} more characters]"
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def _resolve(type_path: str, *, imports: bool, main: bool = False) -> Any:
    """The object a ``module:qualname`` path names; ``_Refused`` if none or a local one.

    ``imports``: import the module if need be (else only one already imported);
    ``main``: accept ``__main__``, whose classes differ from process to process.
    """
    module_name, sep, qualname = type_path.partition(":")
    if not sep or not module_name or not qualname:
        raise _Refused("malformed type path")
    if "<locals>" in qualname:
        raise _Refused("defined inside a function")
    if module_name == "__main__" and not main:
        raise _Refused("defined in __main__, which differs from process to process")
    obj = importlib.import_module(module_name) if imports else sys.modules.get(module_name)
    if obj is None:
        raise _Refused("module not imported")
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _exception_class(
    type_path: str, *, imports: bool = True, main: bool = False
) -> type[Exception]:
    """The exception class a path names, if the agent may receive a rebuilt one."""
    cls = _resolve(type_path, imports=imports, main=main)
    if not isinstance(cls, type) or not issubclass(cls, Exception):
        raise _Refused("not an Exception class")
    if issubclass(cls, PerdureSignal):
        raise _Refused("a control-flow signal")
    return cls


def _fields(cls: type) -> list[str]:
    """Descriptor-backed attributes: ``__slots__`` and the C fields of built-in types."""
    names: list[str] = []
    for klass in cls.__mro__:
        if klass is object:
            continue
        for name, attr in vars(klass).items():
            if (isinstance(attr, types.MemberDescriptorType | types.GetSetDescriptorType)
                    and name not in _NOT_FIELDS and name not in names):
                names.append(name)
    return names


def _attributes(exc: BaseException) -> list[tuple[str, Any]]:
    """The instance's attributes, sorted by name."""
    found: dict[str, Any] = {}
    for name, value in getattr(exc, "__dict__", {}).items():
        if type(name) is str:
            found[name] = value
    for name in _fields(type(exc)):
        try:
            found[name] = getattr(exc, name)
        except Exception:  # noqa: BLE001, S112 - an unset slot or field is simply absent
            continue
    return sorted(found.items(), key=lambda item: item[0])


def _http_lib(value: Any) -> Any:
    """The httpx-like module whose ``Request``/``Response`` ``value`` is, or ``None``."""
    for name in _HTTP_LIBS:
        module = sys.modules.get(name)
        request = getattr(module, "Request", None)
        response = getattr(module, "Response", None)
        if (isinstance(request, type) and isinstance(response, type)
                and isinstance(value, request | response)):
            return module
    return None


def _pydantic_model(value: Any) -> bool:
    base = getattr(sys.modules.get("pydantic"), "BaseModel", None)
    return isinstance(base, type) and isinstance(value, base)


class _Encoder:
    """Turns values into tagged JSON within a size budget; deterministic for one input."""

    def __init__(self, budget: int) -> None:
        self.left = budget
        self.active: set[int] = set()  # containers being encoded: a cycle is not held
        self.tags = 0  # tagged values made so far
        self.unrecorded = 0  # of which stand-ins for values not held

    def spend(self, units: int) -> None:
        self.left -= units
        if self.left < 0:
            raise _TooLarge

    def _mark(self) -> tuple[int, int, int]:
        return self.left, self.tags, self.unrecorded

    def _reset(self, mark: tuple[int, int, int]) -> None:
        self.left, self.tags, self.unrecorded = mark

    def placeholder(self, type_path: str, reason: str, *, checked: bool = True) -> dict[str, Any]:
        """A stand-in; unchecked ones may overdraw the budget (their size is bounded)."""
        cost = len(type_path) + len(reason) + 8
        if checked:
            self.spend(cost)
        else:
            self.left -= cost
        self.tags += 1
        self.unrecorded += 1
        return {TAG: "unrecorded", "type": type_path, "why": reason}

    def fallback(self, value: Any, reason: str) -> dict[str, Any]:
        """The unchecked stand-in for a whole attribute (a stand-in stays itself)."""
        if isinstance(value, Unrecorded):
            return self.placeholder(value.type_path, value.reason, checked=False)
        return self.placeholder(_type_path(type(value)), reason, checked=False)

    def text(self, value: str) -> str:
        self.spend(len(value) + 2)
        if not value.isascii():
            value.encode("utf-8")  # a lone surrogate cannot be stored: refused
        return value

    def value(self, value: Any, depth: int) -> Any:
        """Encode one value; a part that cannot be held becomes a stand-in in place."""
        kind = type(value)
        if kind is str:
            try:
                return self.text(value)
            except UnicodeEncodeError:
                return self.placeholder("builtins:str", "not valid Unicode")
        if value is None or kind is bool:
            self.spend(4)
            return value
        if kind is int:
            if value.bit_length() > 4096:
                return self.placeholder("builtins:int", "too many digits")
            self.spend(2 + value.bit_length() // 3)
            return value
        if kind is float:
            if not math.isfinite(value):
                return self.placeholder("builtins:float", "not a finite number")
            self.spend(8)
            return value
        if isinstance(value, Unrecorded):
            return self.placeholder(value.type_path, value.reason)
        if isinstance(value, int):  # enum members and the like: their plain value
            return self.value(int.__int__(value), depth)
        if isinstance(value, float):
            return self.value(float.__float__(value), depth)
        if isinstance(value, str):
            return self.value(str.__str__(value), depth)
        if depth >= MAX_DEPTH:
            return self.placeholder(_type_path(kind), "nested too deep")
        if id(value) in self.active:
            return self.placeholder(_type_path(kind), "refers to itself")
        mark = self._mark()
        self.active.add(id(value))
        try:
            return self.compound(value, depth + 1)
        except _TooLarge:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever fails to encode is not held
            self._reset(mark)
            reason = exc.reason if isinstance(exc, _Refused) else "cannot be encoded"
            return self.placeholder(_type_path(kind), reason)
        finally:
            self.active.discard(id(value))

    def compound(self, value: Any, depth: int) -> Any:
        self.spend(2)
        if isinstance(value, list):
            return [self.value(item, depth) for item in value]
        if isinstance(value, tuple):
            return self.tagged("tuple", items=[self.value(item, depth) for item in value])
        if isinstance(value, dict):
            return self.mapping(value, depth)
        if isinstance(value, bytes | bytearray):
            return self.tagged("bytes", base64=self.text(base64.b64encode(value).decode("ascii")))
        if isinstance(value, BaseException):
            return self.tagged("exception", body=self.exception(value, depth))
        if isinstance(value, pathlib.PurePath) and type(value).__module__ == "pathlib":
            return self.tagged("path", cls=type(value).__qualname__, path=self.text(str(value)))
        lib = _http_lib(value)
        if lib is not None:
            return self.http(lib, value, depth)
        if _pydantic_model(value):
            return self.model(value, depth)
        raise _Refused("not a value memory holds")

    def mapping(self, value: dict[Any, Any], depth: int) -> Any:
        """A dict with str keys. Memory sorts keys, so a dict whose order differs (its
        ``repr`` may be in a message) or that has the tag as a key is held as pairs."""
        if not all(isinstance(key, str) for key in value):
            raise _Refused("a dict with keys other than str")
        keys = [self.text(str.__str__(key)) for key in value]
        if len(set(keys)) != len(keys):
            raise _Refused("a dict with keys that are equal as str")
        values = value.values()
        items = [(key, self.value(item, depth)) for key, item in zip(keys, values, strict=True)]
        if TAG in keys or keys != sorted(keys):
            return self.tagged("dict", pairs=[[key, item] for key, item in items])
        return dict(items)

    def tagged(self, kind: str, **fields: Any) -> dict[str, Any]:
        self.tags += 1
        return {TAG: kind, **fields}

    def content(self, owner: Any) -> dict[str, Any]:
        """A request's or response's body: text or base64, cut at ``CONTENT_LIMIT``."""
        try:
            data: bytes | None = bytes(owner.content)
        except Exception:  # noqa: BLE001 - a streamed body that was never read
            data = None
        prior = owner.extensions.get(_TRUNCATED)
        truncated = prior if type(prior) is int else None
        if data is None:
            return {"content": None, "truncated_from": truncated}
        if len(data) > CONTENT_LIMIT:
            truncated, data = len(data), data[:CONTENT_LIMIT]
        try:
            content = {"text": self.text(data.decode("utf-8"))}
        except UnicodeDecodeError:
            content = {"base64": self.text(base64.b64encode(data).decode("ascii"))}
        return {"content": content, "truncated_from": truncated}

    def headers(self, headers: Any) -> list[list[str]]:
        """Raw header pairs, in order; credentials (``SECRET_HEADERS``) are redacted."""
        pairs = []
        for raw_key, raw_value in headers.raw:
            key = bytes(raw_key).decode("latin-1")
            value = bytes(raw_value).decode("latin-1")
            if key.lower() in SECRET_HEADERS:
                value = REDACTED
            pairs.append([self.text(key), self.text(value)])
        return pairs

    def http(self, lib: Any, value: Any, depth: int) -> dict[str, Any]:
        if isinstance(value, lib.Request):
            return self.tagged(
                "http_request", lib=lib.__name__, method=self.text(str(value.method)),
                url=self.text(str(value.url)), headers=self.headers(value.headers),
                **self.content(value),
            )
        try:
            request = value.request
        except RuntimeError:  # a response built without one
            request = None
        extras = {}
        for key in ("http_version", "reason_phrase"):
            raw = value.extensions.get(key)
            extras[key] = self.text(bytes(raw).decode("latin-1")) if raw is not None else None
        return self.tagged(
            "http_response", lib=lib.__name__, status_code=int(value.status_code),
            headers=self.headers(value.headers), **self.content(value), **extras,
            request=None if request is None else self.value(request, depth),
        )

    def model(self, value: Any, depth: int) -> dict[str, Any]:
        type_path = _type_path(type(value))
        if _resolve(type_path, imports=False) is not type(value):
            raise _Refused("its class cannot be imported by that name")
        data = value.model_dump(mode="json", by_alias=True, round_trip=True, warnings=False)
        return self.tagged("model", type=self.text(type_path), data=self.value(data, depth))

    def exception(self, exc: BaseException, depth: int, *, top: bool = False) -> dict[str, Any]:
        """An exception's body; at the top, each part is checked to rebuild as itself."""
        cls = type(exc)
        type_path = _type_path(cls)
        message = _message(exc)
        if not top:
            if _exception_class(type_path, imports=False) is not cls:
                raise _Refused("its class cannot be imported by that name")
            self.spend(len(type_path) + len(message))
        else:
            self.active.add(id(exc))  # an attribute holding the exception itself is cut
        body: dict[str, Any] = {"type": type_path, "message": message}
        body.update(self.args(list(exc.args), depth, top=top))
        attrs: dict[str, Any] = {}
        dropped: list[str] = []
        for name, value in _attributes(exc):
            before = self.unrecorded
            attrs[name] = self.attr(value, depth, top=top)
            if self.unrecorded != before:
                dropped.append(name)
        body["attrs"] = attrs
        body["dropped"] = dropped
        return body

    def args(self, args: list[Any], depth: int, *, top: bool) -> dict[str, Any]:
        """``{"args": [...]}``, or the tagged form under ``args_tagged``; ``None`` if the
        args cannot all be held (a stand-in among them, too large, or not rebuilding)."""
        mark = self._mark()
        try:
            encoded = self.value(args, depth)
        except _TooLarge:
            encoded = None
        if (encoded is None or self.unrecorded != mark[2]
                or (top and not _round_trips(encoded, mark[0], depth))):
            self._reset(mark)
            return {"args": None}
        if self.tags != mark[1]:
            return {"args": None, "args_tagged": encoded}
        return {"args": encoded}

    def attr(self, value: Any, depth: int, *, top: bool) -> Any:
        """One attribute; a stand-in if too large or (at the top) if it does not rebuild."""
        mark = self._mark()
        try:
            encoded = self.value(value, depth)
        except _TooLarge:
            self._reset(mark)
            return self.fallback(value, "too large")
        if (top and not (isinstance(encoded, dict) and encoded.get(TAG) == "unrecorded")
                and not _round_trips(encoded, mark[0], depth)):
            self._reset(mark)
            return self.fallback(value, "cannot be rebuilt")
        return encoded


def _round_trips(encoded: Any, budget: int, depth: int) -> bool:
    """Whether ``encoded`` decodes to a value that encodes, with that budget, to itself."""
    try:
        return bool(_Encoder(budget).value(_decode(encoded), depth) == encoded)
    except Exception:  # noqa: BLE001 - anything that fails to rebuild does not round-trip
        return False


def _decode(value: Any) -> Any:
    """The Python value a tagged JSON value stands for; raises if it cannot be rebuilt."""
    kind = type(value)
    if kind is list:
        return [_decode(item) for item in value]
    if kind is dict:
        if TAG not in value:
            return {key: _decode(item) for key, item in value.items()}
        return _DECODERS[value[TAG]](value)
    return value


def _content_bytes(content: Mapping[str, str] | None) -> bytes | None:
    if content is None:
        return None
    if "text" in content:
        return content["text"].encode("utf-8")
    return base64.b64decode(content["base64"], validate=True)


def _raw_headers(pairs: list[list[str]]) -> list[tuple[bytes, bytes]]:
    return [(key.encode("latin-1"), value.encode("latin-1")) for key, value in pairs]


def _http_module(record: Mapping[str, Any]) -> Any:
    name = record["lib"]
    if name not in _HTTP_LIBS:
        raise _Refused(f"{name!r} is not an HTTP library perdure rebuilds")
    return importlib.import_module(name)


def _extensions(record: Mapping[str, Any]) -> dict[str, Any]:
    """Request/response extensions: the cut mark, HTTP version and reason phrase."""
    extensions: dict[str, Any] = {}
    if record["truncated_from"] is not None:
        extensions[_TRUNCATED] = int(record["truncated_from"])
    for key in ("http_version", "reason_phrase"):
        if record.get(key) is not None:
            extensions[key] = str(record[key]).encode("latin-1")
    return extensions


def _decode_request(record: Mapping[str, Any]) -> Any:
    # stream= (not content=) so that httpx adds no Host or Content-Length header
    lib = _http_module(record)
    data = _content_bytes(record["content"])
    request = lib.Request(record["method"], record["url"], headers=_raw_headers(record["headers"]),
                          stream=lib.ByteStream(data or b""), extensions=_extensions(record))
    if data is not None:  # a body never read stays unread
        request.read()
    return request


def _decode_response(record: Mapping[str, Any]) -> Any:
    # The body was recorded decoded: it is read in before the headers are set, so that a
    # Content-Encoding header does not decode it a second time.
    lib = _http_module(record)
    data = _content_bytes(record["content"])
    request = None if record["request"] is None else _decode(record["request"])
    response = lib.Response(int(record["status_code"]), stream=lib.ByteStream(data or b""),
                            request=request, extensions=_extensions(record))
    if data is not None:
        response.read()
    response.headers = lib.Headers(_raw_headers(record["headers"]))
    return response


def _decode_model(record: Mapping[str, Any]) -> Any:
    cls = _resolve(str(record["type"]), imports=True)
    base = getattr(sys.modules.get("pydantic"), "BaseModel", None)
    if not (isinstance(cls, type) and isinstance(base, type) and issubclass(cls, base)):
        raise _Refused("not a pydantic model")
    return cls.model_validate(_decode(record["data"]))  # type: ignore[attr-defined]


def _decode_path(record: Mapping[str, Any]) -> pathlib.PurePath:
    name = str(record["cls"])
    if name not in _PATH_CLASSES:
        raise _Refused(f"pathlib has no path class {name!r}")
    cls: type[pathlib.PurePath] = getattr(pathlib, name)
    return cls(str(record["path"]))


_DECODERS: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "bytes": lambda record: base64.b64decode(record["base64"], validate=True),
    "dict": lambda record: {key: _decode(item) for key, item in record["pairs"]},
    "exception": lambda record: _rebuild(record["body"]),
    "http_request": _decode_request,
    "http_response": _decode_response,
    "model": _decode_model,
    "path": _decode_path,
    "tuple": lambda record: tuple(_decode(item) for item in record["items"]),
    "unrecorded": lambda record: Unrecorded(str(record["type"]), str(record["why"])),
}


def _rebuild(body: Mapping[str, Any]) -> Exception:
    """The exception a body describes, made without its class's ``__init__``."""
    cls = _exception_class(str(body["type"]))
    args = _decode(body["args_tagged"]) if "args_tagged" in body else body["args"]
    if type(args) is not list:
        raise _Refused("its args were not recorded")
    exc = cls.__new__(cls, *args)
    if type(exc) is not cls:
        raise _Refused(f"{cls.__qualname__}.__new__ made another type")
    # The nearest built-in __init__ fills the C fields: OSError.errno, UnicodeError.start...
    init = next(vars(k)["__init__"] for k in cls.__mro__
                if k.__module__ == "builtins" and "__init__" in vars(k))
    init(exc, *args)
    fields = set(_fields(cls))
    attrs: Mapping[str, Any] = body["attrs"]
    for name in sorted(attrs):
        value = _decode(attrs[name])
        if name not in fields:
            exc.__dict__[name] = value  # not setattr: a property's setter is not called
            continue
        # A C field is set only if __init__ left it different: setting OSError.filename2
        # to None is not the same as leaving it unset (str() shows "-> None").
        try:
            current = _Encoder(BUDGET).value(getattr(exc, name), 0)
        except Exception:  # noqa: BLE001 - unset (an AttributeError) or unreadable
            current = _UNSET
        if current != attrs[name]:
            setattr(exc, name, value)
    return exc


def _agrees(fresh: Mapping[str, Any], body: Mapping[str, Any]) -> bool:
    """Whether a rebuilt exception's body says what the record says.

    Attributes the record does not name (a field a newer library or Python adds) are
    not held against it.
    """
    if any(fresh.get(key) != body.get(key) for key in ("type", "message", "args", "args_tagged")):
        return False
    now = fresh["attrs"]
    return all(name in now and now[name] == value for name, value in body["attrs"].items())


def error_body(exc: BaseException) -> dict[str, Any]:
    """Describe an exception for memory: a JSON value, deterministic, never raising.

    Holds the type path, ``str(exc)``, the args and the attributes (see the module's
    docstring for the format). Values memory cannot hold become ``unrecorded``
    stand-ins and their attribute names are listed under ``dropped``.
    """
    try:
        return _Encoder(BUDGET).exception(exc, 0, top=True)
    except Exception:  # noqa: BLE001 - a body that rebuilds to the stand-in, never a raise
        return {"type": _type_path(type(exc)), "message": _message(exc), "args": None,
                "attrs": {}, "dropped": []}


def rebuild_error(step: str, body: Mapping[str, Any]) -> BaseException:
    """The exception a recorded body describes, or ``StepFailedError`` if it cannot be.

    A body from ``error_body`` rebuilds only if the rebuilt exception describes itself
    the same way (type, message, args, attributes); so the agent sees the same thing
    however often it is rebuilt. A record written before attributes were recorded (no
    ``attrs`` key) is rebuilt as it always was, with ``cls(*args)``.
    """
    type_path = str(body.get("type", "builtins:Exception"))
    message = str(body.get("message", ""))
    try:
        if "attrs" not in body:
            cls = _exception_class(type_path, main=True)
            args = body.get("args")
            if type(args) is list:
                return cls(*args)
        else:
            exc = _rebuild(body)
            if _agrees(error_body(exc), body):
                return exc
    except Exception:  # noqa: BLE001, S110 - any failure to rebuild gives the stand-in
        pass
    return StepFailedError(step, type_path, message)
