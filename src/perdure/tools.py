"""Tools an agent's model may propose to call: ``@app.tool(...)`` or ``perdure.tool(...)``.

A ``Tool`` wraps a function with what the gate and the model need: a name, a
description (the docstring's first paragraph), a JSON schema of its arguments (derived
from the signature's type hints and the docstring's ``Args:`` section, or from a
pydantic model when the function takes one), a risk level (``low`` ... ``critical``),
whether it is idempotent, the capabilities it needs and argument constraints
(``perdure.PathPrefix``, ``UrlHost``, ``Range``, ``OneOf``). ``tool.spec()`` is the
schema the model clients send to the provider (a ``perdure.llm.ToolSpec``).

A parameter named ``idempotency_key`` is not part of the schema: perdure passes the
call's key (stable across crashes and retries) so the tool can make its effect once.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Union, overload

from perdure.core.constraints import Constraint
from perdure.core.gate import RISKS, ToolInfo
from perdure.core.names import check_name
from perdure.errors import ConfigurationError

__all__ = ["KEY_PARAMETER", "Tool", "schema_of", "tool"]

KEY_PARAMETER = "idempotency_key"
"""A tool parameter of this name receives the call's idempotency key (not in the schema)."""

_SIMPLE: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean",
                           dict: "object", list: "array", tuple: "array", type(None): "null"}


def _pydantic_model(annotation: Any) -> Any:
    try:
        from pydantic import BaseModel
    except ImportError:
        return None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _type_schema(annotation: Any, where: str) -> dict[str, Any]:
    if annotation is inspect.Parameter.empty or annotation is Any:
        return {}
    if annotation in _SIMPLE:
        return {"type": _SIMPLE[annotation]}
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Literal:
        return {"enum": list(args)}
    if origin in (Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _type_schema(inner[0], where)
        return {"anyOf": [_type_schema(a, where) for a in args]}
    if origin in (list, tuple, Sequence, set, frozenset):
        out: dict[str, Any] = {"type": "array"}
        if args and args[0] is not Ellipsis:
            out["items"] = _type_schema(args[0], where)
        return out
    if origin in (dict, Mapping):
        return {"type": "object"}
    model = _pydantic_model(annotation)
    if model is not None:
        return dict(model.model_json_schema())
    raise ConfigurationError(
        f"{where}: type {annotation!r} has no JSON schema perdure can derive; use str, int, "
        "float, bool, list, dict, Literal, a pydantic model, or pass schema=")


_ARGS_HEADER = re.compile(r"^\s*(Args|Arguments|Parameters):\s*$")
_ARG_LINE = re.compile(r"^\s+(\w+)(?:\s*\([^)]*\))?\s*:\s*(.+)$")


def _doc_parts(fn: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    doc = inspect.getdoc(fn) or ""
    lines = doc.splitlines()
    summary: list[str] = []
    for line in lines:
        if not line.strip() or _ARGS_HEADER.match(line):
            break
        summary.append(line.strip())
    described: dict[str, str] = {}
    inside = False
    for line in lines:
        if _ARGS_HEADER.match(line):
            inside = True
            continue
        if inside:
            found = _ARG_LINE.match(line)
            if found:
                described[found.group(1)] = found.group(2).strip()
            elif line.strip() and not line.startswith((" ", "\t")):
                inside = False
    return " ".join(summary), described


def schema_of(fn: Callable[..., Any]) -> tuple[dict[str, Any], Any]:
    """The JSON object schema of ``fn``'s arguments, and the pydantic model it takes as
    its one argument (``None`` when it takes plain parameters)."""
    where = f"tool {getattr(fn, '__qualname__', fn)!r}"
    signature = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn)
    except Exception as exc:
        raise ConfigurationError(f"{where}: its type hints cannot be resolved: {exc}") from exc
    params = [p for p in signature.parameters.values() if p.name != KEY_PARAMETER]
    if len(params) == 1:
        model = _pydantic_model(hints.get(params[0].name))
        if model is not None:
            return dict(model.model_json_schema()), model
    _, described = _doc_parts(fn)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in params:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise ConfigurationError(
                f"{where}: parameter {param.name!r} must be a plain or keyword parameter "
                "(models call tools by argument name)")
        prop = _type_schema(hints.get(param.name, param.annotation), where)
        if param.name in described:
            prop["description"] = described[param.name]
        if param.default is param.empty:
            required.append(param.name)
        properties[param.name] = prop
    schema: dict[str, Any] = {"type": "object", "properties": properties,
                              "additionalProperties": False}
    if required:
        schema["required"] = required
    return schema, None


@dataclass(frozen=True)
class Tool:
    """A function a model may propose to call, with what the gate needs to decide."""

    fn: Callable[..., Any]
    name: str
    description: str
    schema: Mapping[str, Any]
    risk: str = "low"
    idempotent: bool = True
    capabilities: frozenset[str] = frozenset()
    constraints: tuple[Constraint, ...] = ()
    model: Any = field(default=None, repr=False)

    @classmethod
    def of(cls, fn: Callable[..., Any], *, name: str | None = None,
           description: str | None = None, risk: str = "low", idempotent: bool = True,
           capabilities: Sequence[str] = (), constraints: Sequence[Constraint] = (),
           schema: Mapping[str, Any] | None = None) -> Tool:
        """A tool of ``fn`` (see the module); ``ConfigurationError`` for a bad option."""
        tool_name: str = name or str(getattr(fn, "__name__", ""))
        check_name(tool_name, "tool name")
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", tool_name):
            raise ConfigurationError(
                f"tool name {tool_name!r}: providers accept letters, digits, '_' and '-' "
                "(at most 64)")
        if risk not in RISKS:
            raise ConfigurationError(f"tool {tool_name!r}: risk must be one of {RISKS}, "
                                     f"not {risk!r}")
        derived, model = schema_of(fn) if schema is None else (dict(schema), None)
        summary, _ = _doc_parts(fn)
        for constraint in constraints:
            if not isinstance(constraint, Constraint):
                raise ConfigurationError(f"tool {tool_name!r}: {constraint!r} is not a "
                                         "constraint (PathPrefix, UrlHost, Range, OneOf)")
            if constraint.arg not in derived.get("properties", {}):
                raise ConfigurationError(f"tool {tool_name!r}: a constraint names argument "
                                         f"{constraint.arg!r}, which the tool does not take")
        return cls(fn, tool_name, description if description is not None else summary,
                   derived, risk, bool(idempotent), frozenset(capabilities),
                   tuple(constraints), model)

    @property
    def info(self) -> ToolInfo:
        """What the gate knows of this tool."""
        return ToolInfo(self.name, self.risk, self.idempotent, self.capabilities,
                        self.constraints, self.schema)

    def spec(self) -> Any:
        """The ``perdure.llm.ToolSpec`` the model clients send (needs ``perdure[llm]``)."""
        from perdure.llm import ToolSpec

        return ToolSpec(self.name, self.description, dict(self.schema))

    def to_json(self) -> dict[str, Any]:
        """Name, description and schema: the provider-neutral JSON form of the spec."""
        return {"name": self.name, "description": self.description,
                "parameters": dict(self.schema)}

    def arguments(self, args: Mapping[str, Any], key: str) -> dict[str, Any]:
        """The keyword arguments the function is called with for ``args``: a pydantic
        model built from them when it takes one, and the idempotency ``key`` when it has
        a parameter for it."""
        kwargs = dict(args)
        if self.model is not None:
            [param] = [p for p in inspect.signature(self.fn).parameters if p != KEY_PARAMETER]
            kwargs = {param: self.model.model_validate(kwargs)}
        if KEY_PARAMETER in inspect.signature(self.fn).parameters:
            kwargs[KEY_PARAMETER] = key
        return kwargs

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


@overload
def tool(fn: Callable[..., Any], /, **options: Any) -> Tool: ...


@overload
def tool(fn: None = None, /, **options: Any) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(fn: Callable[..., Any] | None = None, /, **options: Any
         ) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """``@perdure.tool`` or ``@perdure.tool(risk=..., idempotent=..., capabilities=...,
    constraints=..., name=..., description=..., schema=...)``: make ``fn`` a ``Tool``."""
    if fn is not None:
        return Tool.of(fn, **options)

    def make(func: Callable[..., Any]) -> Tool:
        return Tool.of(func, **options)
    return make
