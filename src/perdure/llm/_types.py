"""The normalised shapes of a model call's request: messages, tools, parameters.

Every value here is a frozen dataclass with ``to_json()`` (a JSON value, the form memory
holds) and ``from_json()``; ``from_json(x.to_json()) == x`` for every value. The JSON
form is compact (a text-only message's content is a plain string, empty fields are left
out) and there is exactly one JSON form per value, so its canonical bytes can be hashed
(``perdure.llm.message_hash``).

Provider dialects (Chat Completions, Responses, Anthropic Messages) are translated to and
from these shapes at the client edge; nothing here knows a provider. What comes back
(``ModelReply``, ``Usage``, ``StreamChunk``) is in ``_reply``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from perdure.core.codec import detached

__all__ = [
    "ImagePart",
    "Message",
    "ModelParams",
    "ModelRequest",
    "Part",
    "Role",
    "TextPart",
    "ToolCall",
    "ToolSpec",
]

Role = Literal["system", "user", "assistant", "tool"]
_ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True, slots=True)
class TextPart:
    """A piece of text in a message's content."""

    text: str

    def to_json(self) -> dict[str, Any]:
        """The JSON form: ``{"type": "text", "text": ...}``."""
        return {"type": "text", "text": self.text}


@dataclass(frozen=True, slots=True)
class ImagePart:
    """An image in a message's content, by URL (``https:`` or a ``data:`` URL)."""

    url: str
    media_type: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON form: ``{"type": "image", "url": ..., "media_type": ...}``."""
        out: dict[str, Any] = {"type": "image", "url": self.url}
        if self.media_type is not None:
            out["media_type"] = self.media_type
        return out


Part = TextPart | ImagePart


def _part_from_json(value: Any) -> Part:
    if not isinstance(value, dict):
        raise ValueError(f"a content part is a JSON object, not {value!r}")
    kind = value.get("type")
    if kind == "text":
        return TextPart(str(value["text"]))
    if kind == "image":
        return ImagePart(str(value["url"]), value.get("media_type"))
    raise ValueError(f"unknown content part type {kind!r}")


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call the model proposed: an id (the provider's), a tool name and the
    arguments as the JSON text the model wrote (kept verbatim; parse with ``parsed()``)."""

    id: str
    name: str
    arguments: str = "{}"

    def parsed(self) -> Any:
        """The arguments decoded from JSON (``ValueError`` if the model wrote bad JSON)."""
        return json.loads(self.arguments or "{}")

    def to_json(self) -> dict[str, Any]:
        """The JSON form: ``{"id", "name", "arguments"}``."""
        return {"id": self.id, "name": self.name, "arguments": self.arguments}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> ToolCall:
        """Rebuild from ``to_json()``."""
        return cls(str(value["id"]), str(value["name"]), str(value.get("arguments", "{}")))


@dataclass(frozen=True, slots=True)
class Message:
    """One message of a conversation.

    ``role`` is ``system``, ``user``, ``assistant`` or ``tool``; ``content`` a tuple of
    parts. An assistant message may carry ``tool_calls``; a ``tool`` message answers one
    call and names it in ``tool_call_id``. Build them with ``Message.system(...)``,
    ``Message.user(...)``, ``Message.assistant(...)`` and ``Message.tool(...)``.
    """

    role: Role
    content: tuple[Part, ...] = ()
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None

    def __post_init__(self) -> None:
        if self.role not in _ROLES:
            raise ValueError(f"role must be one of {_ROLES}, not {self.role!r}")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only an assistant message carries tool calls")
        if (self.role == "tool") != (self.tool_call_id is not None):
            raise ValueError("a tool message, and only a tool message, names a tool_call_id")

    @classmethod
    def system(cls, text: str) -> Message:
        """A system (instructions) message."""
        return cls("system", (TextPart(text),))

    @classmethod
    def user(cls, text: str) -> Message:
        """A user message holding ``text``."""
        return cls("user", (TextPart(text),))

    @classmethod
    def assistant(cls, text: str = "", tool_calls: Sequence[ToolCall] = ()) -> Message:
        """An assistant message: text and/or tool calls."""
        return cls("assistant", (TextPart(text),) if text else (), tuple(tool_calls))

    @classmethod
    def tool(cls, tool_call_id: str, text: str) -> Message:
        """The result of the tool call ``tool_call_id``."""
        return cls("tool", (TextPart(text),), tool_call_id=tool_call_id)

    @property
    def text(self) -> str:
        """The text parts joined (images left out)."""
        return "".join(p.text for p in self.content if isinstance(p, TextPart))

    def to_json(self) -> dict[str, Any]:
        """The compact JSON form: content as a string when it is one text part."""
        out: dict[str, Any] = {"role": self.role}
        if len(self.content) == 1 and isinstance(self.content[0], TextPart):
            out["content"] = self.content[0].text
        elif self.content:
            out["content"] = [p.to_json() for p in self.content]
        if self.tool_calls:
            out["tool_calls"] = [c.to_json() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Message:
        """Rebuild from ``to_json()``."""
        content = value.get("content", ())
        parts: tuple[Part, ...]
        if isinstance(content, str):
            parts = (TextPart(content),)
        else:
            parts = tuple(_part_from_json(p) for p in content)
        return cls(
            role=cast(Role, value["role"]),
            content=parts,
            tool_calls=tuple(ToolCall.from_json(c) for c in value.get("tool_calls", ())),
            tool_call_id=value.get("tool_call_id"),
        )


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool the model may call: a name, a description and a JSON schema of its
    arguments (an object schema). The schema is copied on construction."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}})

    def __post_init__(self) -> None:
        object.__setattr__(self, "parameters", detached(dict(self.parameters)))

    def to_json(self) -> dict[str, Any]:
        """The JSON form: ``{"name", "description", "parameters"}``."""
        return {"name": self.name, "description": self.description,
                "parameters": detached(dict(self.parameters))}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> ToolSpec:
        """Rebuild from ``to_json()``."""
        return cls(str(value["name"]), str(value.get("description", "")),
                   dict(value.get("parameters", {})))


@dataclass(frozen=True, slots=True)
class ModelParams:
    """Sampling and provider settings of a call. ``None`` leaves the provider's default.

    ``store`` and ``previous_response_id`` are the Responses API's server-side state: a
    call with either is *stateful* (the provider keeps something), which matters when a
    stream breaks (see ``perdure.llm.classify_exception``). ``extra`` goes into the
    request body as it is (provider-specific fields).
    """

    temperature: float | None = None
    max_tokens: int | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    tool_choice: str | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "extra", detached(dict(self.extra)))

    def to_json(self) -> dict[str, Any]:
        """The JSON form: only the fields that are set."""
        out: dict[str, Any] = {}
        for name in ("temperature", "max_tokens", "top_p", "seed", "tool_choice", "store",
                     "previous_response_id"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.stop:
            out["stop"] = list(self.stop)
        if self.extra:
            out["extra"] = detached(dict(self.extra))
        return out

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> ModelParams:
        """Rebuild from ``to_json()``."""
        return cls(**{**value, "stop": tuple(value.get("stop", ())),
                      "extra": dict(value.get("extra", {}))})


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """One call: the model, the messages, the tools offered and the parameters.

    ``prefix`` is salvaged text the reply must start with (a continuation after a broken
    stream): the client asks the model to go on from it in the way its API allows, and
    the reply it returns holds the prefix joined with what followed.
    """

    model: str
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    params: ModelParams = field(default_factory=ModelParams)
    prefix: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "messages", tuple(self.messages))
        object.__setattr__(self, "tools", tuple(self.tools))

    @property
    def stateful(self) -> bool:
        """Whether the provider keeps state for this call (Responses ``store``/
        ``previous_response_id``): such a call is never silently repeated."""
        return bool(self.params.store) or self.params.previous_response_id is not None

    def to_json(self) -> dict[str, Any]:
        """The whole request as JSON (memory stores it split: ``split_request``)."""
        out: dict[str, Any] = {"model": self.model,
                               "messages": [m.to_json() for m in self.messages]}
        if self.tools:
            out["tools"] = [t.to_json() for t in self.tools]
        params = self.params.to_json()
        if params:
            out["params"] = params
        if self.prefix:
            out["prefix"] = self.prefix
        return out

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> ModelRequest:
        """Rebuild from ``to_json()``."""
        return cls(
            model=str(value["model"]),
            messages=tuple(Message.from_json(m) for m in value["messages"]),
            tools=tuple(ToolSpec.from_json(t) for t in value.get("tools", ())),
            params=ModelParams.from_json(value.get("params", {})),
            prefix=str(value.get("prefix", "")),
        )
