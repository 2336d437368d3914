"""Putting a streamed reply together, and continuing from salvaged text.

``StreamAssembler`` takes the pieces a dialect's stream events carry (text deltas,
tool-call pieces, the finish reason, usage, ids) and numbers the chunks it hands out;
at the end it builds the ``ModelReply``. The reply of a continuation holds the salvaged
prefix joined with what the model added.

A continuation (``ModelRequest.prefix``) is asked for in one of three ways
(``Continuation``):

- ``prefill``: the prefix is sent as the start of the assistant's reply, which the
  model goes on from (Anthropic Messages). Anthropic refuses a prefill that ends in
  whitespace, so trailing whitespace is cut from the prefix first; the model writes it
  again as it goes on.
- ``continue_final_message``: the same for a chat server that supports it (vLLM and
  others: ``continue_final_message: true, add_generation_prompt: false``).
- ``turn``: the prefix is sent as an assistant message, followed by a user message
  asking to continue exactly where it stopped (any server; the model may join less
  cleanly).

Only text is continued: a stream that broke inside a tool call is restarted instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from perdure.llm._reply import ModelReply, StreamChunk, ToolCallDelta, Usage
from perdure.llm._types import Message, ModelRequest, ToolCall

__all__ = [
    "CONTINUE_PROMPT",
    "Continuation",
    "StreamAssembler",
    "continuation_messages",
    "joined_prefix",
]

CONTINUE_PROMPT = ("Your previous reply was cut off. Continue it from exactly where it "
                   "stopped, without repeating any of it and without any preamble.")


class Continuation(StrEnum):
    """How a client asks a model to continue salvaged text."""

    PREFILL = "prefill"
    CONTINUE_FINAL_MESSAGE = "continue_final_message"
    TURN = "turn"


def joined_prefix(prefix: str, mode: Continuation) -> str:
    """The text the continuation is appended to (a prefill loses trailing whitespace)."""
    return prefix.rstrip() if mode is Continuation.PREFILL else prefix


def continuation_messages(request: ModelRequest, mode: Continuation) -> tuple[Message, ...]:
    """The messages to send for ``request``: its own, plus what asks for a continuation
    of ``request.prefix`` in the way of ``mode`` (nothing added when there is none)."""
    if not request.prefix:
        return request.messages
    prefix = joined_prefix(request.prefix, mode)
    added = [Message.assistant(prefix)]
    if mode is Continuation.TURN:
        added.append(Message.user(CONTINUE_PROMPT))
    return request.messages + tuple(added)


@dataclass
class _PendingCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class StreamAssembler:
    """Collects a stream's pieces; hands out numbered ``StreamChunk``s; builds the reply.

    ``prefix`` is the salvaged text a continuation goes on from (empty otherwise).
    """

    def __init__(self, prefix: str = "") -> None:
        self._prefix = prefix
        self._text: list[str] = []
        self._calls: dict[int, _PendingCall] = {}
        self._next = 0
        self.finish_reason: str | None = None
        self.usage = Usage()
        self.model = ""
        self.response_id: str | None = None

    @property
    def chunks(self) -> int:
        """How many chunks were handed out."""
        return self._next

    @property
    def partial_text(self) -> str:
        """The reply's text so far, the prefix included."""
        return self._prefix + "".join(self._text)

    @property
    def has_tool_calls(self) -> bool:
        """Whether any tool call has started."""
        return bool(self._calls)

    def text(self, delta: str) -> StreamChunk | None:
        """A text delta as a chunk (``None`` for an empty delta)."""
        if not delta:
            return None
        self._text.append(delta)
        chunk = StreamChunk(self._next, text=delta)
        self._next += 1
        return chunk

    def tool(self, index: int, *, call_id: str | None = None, name: str | None = None,
             arguments: str = "") -> StreamChunk | None:
        """A piece of the tool call at ``index`` as a chunk (``None`` if it is empty)."""
        call = self._calls.setdefault(index, _PendingCall())
        if call_id:
            call.id = call_id
        if name:
            call.name = call.name or name
        if arguments:
            call.arguments.append(arguments)
        if not (call_id or name or arguments):
            return None
        delta = ToolCallDelta(index, call_id or None, name or None, arguments)
        chunk = StreamChunk(self._next, tool_call=delta)
        self._next += 1
        return chunk

    def reply(self, *, provider: str, request_id: str | None, latency: float) -> ModelReply:
        """The whole reply, once the stream has finished."""
        calls = tuple(ToolCall(c.id, c.name, "".join(c.arguments) or "{}")
                      for _, c in sorted(self._calls.items()))
        finish = self.finish_reason or "stop"
        return ModelReply(
            text=self.partial_text, tool_calls=calls, finish_reason=finish, usage=self.usage,
            model=self.model, provider=provider, request_id=request_id,
            response_id=self.response_id, latency=latency,
        )
