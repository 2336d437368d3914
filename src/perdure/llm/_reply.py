"""The normalised shapes of what a model call returns: the reply, its usage, its chunks.

Frozen dataclasses with ``to_json()`` / ``from_json()``, one JSON form per value, like
the request's shapes in ``_types``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from perdure.llm._types import Message, ToolCall

__all__ = ["ModelReply", "StreamChunk", "ToolCallDelta", "Usage"]


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens a call was billed for. ``input_tokens`` counts every prompt token, cached
    ones included; ``cached_input_tokens`` (read from a prompt cache) and
    ``cache_write_input_tokens`` (written to one) are parts of it; ``reasoning_tokens``
    is the part of ``output_tokens`` spent on hidden reasoning."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    cache_write_input_tokens: int = 0
    reasoning_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(*(getattr(self, n) + getattr(other, n) for n in _USAGE_FIELDS))

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens

    def to_json(self) -> dict[str, int]:
        """The JSON form: input and output always, the others when not zero."""
        out = {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}
        for name in _USAGE_FIELDS[2:]:
            if getattr(self, name):
                out[name] = getattr(self, name)
        return out

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Usage:
        """Rebuild from ``to_json()``."""
        return cls(*(int(value.get(n, 0)) for n in _USAGE_FIELDS))


_USAGE_FIELDS = ("input_tokens", "output_tokens", "cached_input_tokens",
                 "cache_write_input_tokens", "reasoning_tokens")


@dataclass(frozen=True, slots=True)
class ModelReply:
    """What a call returned: a proposal (text and/or tool calls), never an action.

    ``finish_reason`` is normalised: ``stop``, ``length``, ``tool_calls``,
    ``content_filter`` (a refusal), or the provider's word for anything else.
    ``request_id`` is the provider's request id header, ``response_id`` the id in the
    body (what ``previous_response_id`` names), ``model`` the model that answered and
    ``latency`` the seconds from sending to the last byte.
    """

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str = "stop"
    usage: Usage = field(default_factory=Usage)
    model: str = ""
    provider: str = ""
    request_id: str | None = None
    response_id: str | None = None
    latency: float = 0.0

    def message(self) -> Message:
        """The reply as the assistant message that goes into the next request."""
        return Message.assistant(self.text, self.tool_calls)

    def to_json(self) -> dict[str, Any]:
        """The JSON form (no credentials or headers: there are none to leave out)."""
        out: dict[str, Any] = {
            "text": self.text, "finish_reason": self.finish_reason,
            "usage": self.usage.to_json(), "model": self.model, "provider": self.provider,
            "latency": round(self.latency, 6),
        }
        if self.tool_calls:
            out["tool_calls"] = [c.to_json() for c in self.tool_calls]
        if self.request_id is not None:
            out["request_id"] = self.request_id
        if self.response_id is not None:
            out["response_id"] = self.response_id
        return out

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> ModelReply:
        """Rebuild from ``to_json()``."""
        return cls(
            text=str(value.get("text", "")),
            tool_calls=tuple(ToolCall.from_json(c) for c in value.get("tool_calls", ())),
            finish_reason=str(value.get("finish_reason", "stop")),
            usage=Usage.from_json(value.get("usage", {})),
            model=str(value.get("model", "")),
            provider=str(value.get("provider", "")),
            request_id=value.get("request_id"),
            response_id=value.get("response_id"),
            latency=float(value.get("latency", 0.0)),
        )


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of a streamed tool call: the call's position in the reply, its id and name
    (on the first piece) and a fragment of its JSON arguments."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""

    def to_json(self) -> dict[str, Any]:
        """The JSON form: ``index`` and whatever the piece carries."""
        out: dict[str, Any] = {"index": self.index}
        if self.id is not None:
            out["id"] = self.id
        if self.name is not None:
            out["name"] = self.name
        if self.arguments:
            out["arguments"] = self.arguments
        return out

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> ToolCallDelta:
        """Rebuild from ``to_json()``."""
        return cls(int(value["index"]), value.get("id"), value.get("name"),
                   str(value.get("arguments", "")))


@dataclass(frozen=True, slots=True)
class StreamChunk:
    """One piece of a streamed reply, numbered from 0 in the order it arrived: a text
    delta or a tool-call delta."""

    index: int
    text: str = ""
    tool_call: ToolCallDelta | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON form: ``index`` and ``text`` or ``tool_call``."""
        out: dict[str, Any] = {"index": self.index}
        if self.text:
            out["text"] = self.text
        if self.tool_call is not None:
            out["tool_call"] = self.tool_call.to_json()
        return out

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> StreamChunk:
        """Rebuild from ``to_json()``."""
        call = value.get("tool_call")
        return cls(int(value["index"]), str(value.get("text", "")),
                   ToolCallDelta.from_json(call) if call is not None else None)
