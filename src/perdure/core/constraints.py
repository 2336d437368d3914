"""What a tool call's arguments must satisfy: a JSON schema and argument constraints.

``schema_problem(schema, args)`` checks arguments against the object schema a tool
declares (the subset of JSON Schema perdure derives from a signature: types, required
keys, no unknown keys, enums, array items, numeric bounds); the constraints narrow one
argument further: ``PathPrefix`` (a path that stays under allowed prefixes, ``..``
resolved first), ``UrlHost`` (a URL whose host is allowed), ``Range`` (a number within
bounds) and ``OneOf`` (one of a few values). Each says in words what is wrong, or
``None``. Pure: no I/O.
"""

from __future__ import annotations

import math
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

__all__ = ["Constraint", "OneOf", "PathPrefix", "Range", "UrlHost", "constraint_from_json",
           "schema_problem"]

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "array": (list, tuple), "object": (dict,), "null": (type(None),),
}


def _type_ok(value: Any, wanted: str | list[str]) -> bool:
    names = [wanted] if isinstance(wanted, str) else list(wanted)
    for name in names:
        kinds = _TYPES.get(name)
        if kinds is None:
            continue
        if isinstance(value, bool) and name in ("integer", "number"):
            continue  # JSON's true is not a number
        if isinstance(value, kinds):
            if name == "number" and isinstance(value, float) and not math.isfinite(value):
                continue
            return True
    return False


def schema_problem(schema: Mapping[str, Any], value: Any, where: str = "arguments"
                   ) -> str | None:
    """What is wrong with ``value`` under ``schema``, or ``None`` when it fits."""
    wanted = schema.get("type")
    if wanted is not None and not _type_ok(value, wanted):
        return f"{where} must be of type {wanted}, not {type(value).__name__}"
    if "enum" in schema and value not in list(schema["enum"]):
        return f"{where} must be one of {list(schema['enum'])!r}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            return f"{where} must be at least {schema['minimum']}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"{where} must be at most {schema['maximum']}"
    if isinstance(value, dict):
        props: Mapping[str, Any] = schema.get("properties", {})
        for key in schema.get("required", ()):
            if key not in value:
                return f"{where} lacks the required key {key!r}"
        for key, item in value.items():
            sub = props.get(key)
            if sub is None:
                if schema.get("additionalProperties", True) is False or props:
                    return f"{where} has an unknown key {key!r}"
                continue
            problem = schema_problem(sub, item, f"{where}.{key}")
            if problem is not None:
                return problem
    if isinstance(value, (list, tuple)) and isinstance(schema.get("items"), Mapping):
        for index, item in enumerate(value):
            problem = schema_problem(schema["items"], item, f"{where}[{index}]")
            if problem is not None:
                return problem
    return None


class Constraint:
    """A condition on one argument (``arg``); ``problem(args)`` says what is wrong."""

    __slots__ = ()
    arg: str

    def problem(self, args: Mapping[str, Any]) -> str | None:
        """What is wrong with ``args`` under this constraint, or ``None``."""
        raise NotImplementedError

    def to_json(self) -> dict[str, Any]:
        """The JSON form (part of a policy's content hash)."""
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class PathPrefix(Constraint):
    """Argument ``arg`` is a path that, with ``.`` and ``..`` resolved, lies under one of
    ``prefixes`` (a prefix matches whole path components: ``/data`` does not allow
    ``/database``)."""

    arg: str
    prefixes: tuple[str, ...]

    def problem(self, args: Mapping[str, Any]) -> str | None:
        value = args.get(self.arg)
        if value is None:
            return None
        if not isinstance(value, str) or "\x00" in value or not value:
            return f"argument {self.arg!r} is not a path"
        path = posixpath.normpath(value)
        for prefix in self.prefixes:
            base = posixpath.normpath(prefix)
            if path == base or path.startswith(base.rstrip("/") + "/"):
                return None
        return (f"argument {self.arg!r} = {value!r} is outside the allowed paths "
                f"{list(self.prefixes)!r}")

    def to_json(self) -> dict[str, Any]:
        return {"type": "path_prefix", "arg": self.arg, "prefixes": list(self.prefixes)}


@dataclass(frozen=True, slots=True)
class UrlHost(Constraint):
    """Argument ``arg`` is an ``http``/``https`` URL whose host is one of ``hosts``
    (``.example.com`` allows any subdomain of example.com, and example.com itself)."""

    arg: str
    hosts: tuple[str, ...]

    def problem(self, args: Mapping[str, Any]) -> str | None:
        value = args.get(self.arg)
        if value is None:
            return None
        if not isinstance(value, str):
            return f"argument {self.arg!r} is not a URL"
        try:
            parts = urlsplit(value)
            host = (parts.hostname or "").lower()
        except ValueError:
            return f"argument {self.arg!r} = {value!r} is not a URL"
        if parts.scheme not in ("http", "https") or not host:
            return f"argument {self.arg!r} = {value!r} is not an http(s) URL"
        for allowed in self.hosts:
            allowed = allowed.lower()
            if host == allowed or (allowed.startswith(".")
                                   and (host.endswith(allowed) or host == allowed[1:])):
                return None
        return f"argument {self.arg!r}: host {host!r} is not one of {list(self.hosts)!r}"

    def to_json(self) -> dict[str, Any]:
        return {"type": "url_host", "arg": self.arg, "hosts": list(self.hosts)}


@dataclass(frozen=True, slots=True)
class Range(Constraint):
    """Argument ``arg`` is a number between ``min`` and ``max`` (inclusive; ``None``: no
    bound)."""

    arg: str
    min: float | None = None
    max: float | None = None

    def problem(self, args: Mapping[str, Any]) -> str | None:
        value = args.get(self.arg)
        if value is None:
            return None
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value)):
            return f"argument {self.arg!r} is not a number"
        if self.min is not None and value < self.min:
            return f"argument {self.arg!r} = {value} is below {self.min}"
        if self.max is not None and value > self.max:
            return f"argument {self.arg!r} = {value} is above {self.max}"
        return None

    def to_json(self) -> dict[str, Any]:
        return {"type": "range", "arg": self.arg, "min": self.min, "max": self.max}


@dataclass(frozen=True, slots=True)
class OneOf(Constraint):
    """Argument ``arg`` is one of ``values``."""

    arg: str
    values: tuple[Any, ...]

    def problem(self, args: Mapping[str, Any]) -> str | None:
        value = args.get(self.arg)
        if value is None or value in self.values:
            return None
        return f"argument {self.arg!r} = {value!r} is not one of {list(self.values)!r}"

    def to_json(self) -> dict[str, Any]:
        return {"type": "one_of", "arg": self.arg, "values": list(self.values)}


def constraint_from_json(value: Mapping[str, Any]) -> Constraint:
    """Rebuild a constraint from its ``to_json()`` (``ValueError`` for an unknown type)."""
    kind = value.get("type")
    arg = str(value["arg"])
    if kind == "path_prefix":
        return PathPrefix(arg, tuple(str(p) for p in value["prefixes"]))
    if kind == "url_host":
        return UrlHost(arg, tuple(str(h) for h in value["hosts"]))
    if kind == "range":
        return Range(arg, value.get("min"), value.get("max"))
    if kind == "one_of":
        return OneOf(arg, tuple(value["values"]))
    raise ValueError(f"unknown constraint type {kind!r}")
