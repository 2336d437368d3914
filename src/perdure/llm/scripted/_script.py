"""What the scripted server answers: scripted replies and failures, and what it heard.

A script is a queue of steps; each request takes the next one. A ``ScriptedReply`` is
answered in the dialect and mode (JSON or SSE stream) the request asked for; a
``ScriptedFailure`` is an HTTP error with the headers a provider would send. When the
queue is empty the server's responder answers (by default it echoes the last user text).
Steps have a JSON form too, for ``python -m perdure.llm.scripted --script FILE``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = [
    "RecordedRequest",
    "ScriptedFailure",
    "ScriptedReply",
    "ScriptedToolCall",
    "Step",
    "echo",
    "load_script",
    "step_from_json",
]


@dataclass(frozen=True, slots=True)
class ScriptedToolCall:
    """A tool call to answer with: its name, its arguments as JSON text, and an id (one
    is made up when ``None``)."""

    name: str
    arguments: str = "{}"
    id: str | None = None


@dataclass(frozen=True, slots=True)
class ScriptedReply:
    """A reply to answer with.

    ``finish_reason`` is perdure's normalised word (``stop``, ``length``, ``tool_calls``,
    ``content_filter``; default ``tool_calls`` when there are tool calls, else ``stop``),
    translated to each dialect's. Token counts default to a quarter of the characters
    sent and written. Streaming: ``chunk_chars`` characters per text delta, ``chunk_delay``
    seconds before each content chunk; ``drop_after=n`` closes the connection abruptly
    after ``n`` content chunks (for a non-streamed answer: before answering at all);
    ``error_after=n`` sends an error event of ``error_type`` after ``n`` chunks;
    ``end_after=n`` ends the body cleanly after ``n`` chunks, without the events that
    finish a reply (a stream cut short by a proxy).
    ``delay`` waits before the answer starts; ``headers`` are added to it.
    """

    text: str = ""
    tool_calls: tuple[ScriptedToolCall, ...] = ()
    finish_reason: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int = 0
    model: str | None = None
    chunk_chars: int = 8
    chunk_delay: float = 0.0
    drop_after: int | None = None
    error_after: int | None = None
    error_type: str = "overloaded_error"
    end_after: int | None = None
    delay: float = 0.0
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def finish(self) -> str:
        """The normalised finish reason this reply ends with."""
        if self.finish_reason is not None:
            return self.finish_reason
        return "tool_calls" if self.tool_calls else "stop"


@dataclass(frozen=True, slots=True)
class ScriptedFailure:
    """An HTTP error answer: ``status``, the error ``message``, an error ``error_type``
    and ``code`` (defaults per status and dialect), ``retry_after`` / ``retry_after_ms``
    header values as given (seconds, an HTTP date, milliseconds), ``should_retry`` for
    ``x-should-retry``, and any other ``headers``."""

    status: int
    message: str = "scripted failure"
    error_type: str | None = None
    code: str | None = None
    retry_after: str | None = None
    retry_after_ms: str | None = None
    should_retry: bool | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


Step = ScriptedReply | ScriptedFailure


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """A request the server got: which API (``chat``, ``responses``, ``anthropic``), the
    path, the JSON body, whether it asked to stream, its headers (credentials removed),
    the SHA-256 of the credential it carried (to check which key was sent without
    keeping it) and when it arrived (``time.monotonic()``)."""

    api: str
    path: str
    body: Mapping[str, Any]
    stream: bool
    headers: Mapping[str, str]
    credential_sha256: str | None
    received: float = 0.0

    def last_user_text(self) -> str:
        """The text of the last user message in the body, in any of the three dialects."""
        items = self.body.get("messages") or self.body.get("input") or []
        if isinstance(items, str):
            return items
        for item in reversed(items):
            if not isinstance(item, Mapping) or item.get("role") != "user":
                continue
            content = item.get("content")
            if isinstance(content, str):
                return content
            texts = [str(p.get("text", "")) for p in content or ()
                     if isinstance(p, Mapping) and p.get("type") in ("text", "input_text")]
            if texts:
                return "".join(texts)
        return ""


def echo(request: RecordedRequest) -> Step:
    """The default responder: a reply echoing the last user text."""
    return ScriptedReply(text=f"echo: {request.last_user_text()}")


def step_from_json(value: Mapping[str, Any]) -> Step:
    """A step from its JSON form: ``{"reply": {...}}`` or ``{"failure": {...}}`` with the
    fields of ``ScriptedReply`` / ``ScriptedFailure``."""
    if set(value) == {"reply"}:
        data = dict(value["reply"])
        data["tool_calls"] = tuple(ScriptedToolCall(**c) for c in data.get("tool_calls", ()))
        _check_fields(ScriptedReply, data)
        return ScriptedReply(**data)
    if set(value) == {"failure"}:
        data = dict(value["failure"])
        _check_fields(ScriptedFailure, data)
        return ScriptedFailure(**data)
    raise ValueError(f"a script step is {{'reply': ...}} or {{'failure': ...}}, not {value!r}")


def _check_fields(cls: type, data: Mapping[str, Any]) -> None:
    known = {f.name for f in fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"unknown {cls.__name__} field(s) {sorted(unknown)}")


def load_script(text: str) -> Sequence[Step]:
    """Steps from a JSON list (the contents of a ``--script`` file)."""
    value = json.loads(text)
    if not isinstance(value, list):
        raise ValueError("a script is a JSON list of steps")
    return [step_from_json(v) for v in value]
