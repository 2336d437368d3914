"""Streams that survive a crash, the pure part: batching chunks for the journal, and
deciding what to do with what was salvaged.

The engine journals a streamed reply as it arrives. ``ChunkBatcher`` groups chunks into
the batches it writes: a batch is due once ``FlushPolicy.max_tokens`` tokens are pending,
or ``FlushPolicy.interval`` seconds after its first chunk arrived (``deadline`` says
when, for a timer: a stalled stream still has its last chunks written on time). A node
killed mid-stream loses at most the batch it had not written.

On resume the salvaged chunks become a ``Salvage`` and the call's ``Recovery`` policy
decides, through ``choose_recovery``:

- ``continue``: ask the model to go on from the salvaged text (``continuation_of``: the
  same request with the text as ``prefix``; the client joins the parts);
- ``restart``: call again from scratch; what the lost attempt was billed is unknown,
  ``lost_usage`` estimates it (to be recorded as in doubt);
- ``surface``: hand the partial output to the agent with a ``RecoveryMarker`` it, or the
  model, can see (``RecoveryMarker.messages``).

Only text can be continued: a salvage holding part of a tool call restarts instead. A
stateful call (Responses ``store``/``previous_response_id``) is never repeated by itself:
it is always surfaced.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from perdure.llm._reply import StreamChunk, Usage
from perdure.llm._tokens import TokenCounter
from perdure.llm._types import Message, ModelRequest

__all__ = [
    "ChunkBatcher",
    "FlushPolicy",
    "Recovery",
    "RecoveryMarker",
    "Salvage",
    "choose_recovery",
    "continuation_of",
    "lost_usage",
]


class Recovery(StrEnum):
    """What to do with a stream that a crash or a broken connection cut short."""

    CONTINUE = "continue"
    RESTART = "restart"
    SURFACE = "surface"


@dataclass(frozen=True, slots=True)
class FlushPolicy:
    """When the journal writes pending chunks: after ``interval`` seconds or once
    ``max_tokens`` tokens are pending, whichever comes first."""

    interval: float = 0.1
    max_tokens: int = 64

    def __post_init__(self) -> None:
        if self.interval <= 0 or self.max_tokens < 1:
            raise ValueError("a flush policy needs interval > 0 and max_tokens >= 1")


class ChunkBatcher:
    """Groups chunks into journal batches by a ``FlushPolicy``. Tokens are counted with
    ``counter`` (text and tool-call arguments), or one per chunk without one. Times are
    the caller's clock (``time.monotonic()``), so it is a pure function of its inputs."""

    def __init__(self, policy: FlushPolicy | None = None,
                 counter: TokenCounter | None = None) -> None:
        self._policy = policy or FlushPolicy()
        self._counter = counter
        self._pending: list[StreamChunk] = []
        self._tokens = 0
        self._first_at: float | None = None

    @property
    def deadline(self) -> float | None:
        """When the pending batch is due by time (``None`` when nothing is pending)."""
        return None if self._first_at is None else self._first_at + self._policy.interval

    def _cost(self, chunk: StreamChunk) -> int:
        if self._counter is None:
            return 1
        text = chunk.text + (chunk.tool_call.arguments if chunk.tool_call else "")
        return max(1, self._counter.count_text(text))

    def add(self, chunk: StreamChunk, now: float) -> tuple[StreamChunk, ...]:
        """Take ``chunk`` (arrived at ``now``); the batch to write now, or ``()``."""
        if self._first_at is None:
            self._first_at = now
        self._pending.append(chunk)
        self._tokens += self._cost(chunk)
        if self._tokens >= self._policy.max_tokens or self.due(now):
            return self.take()
        return ()

    def due(self, now: float) -> bool:
        """Whether the pending batch should be written by ``now``."""
        deadline = self.deadline
        return deadline is not None and now >= deadline

    def take(self) -> tuple[StreamChunk, ...]:
        """Everything pending, as one batch (at the end of the stream, or when due)."""
        batch = tuple(self._pending)
        self._pending, self._tokens, self._first_at = [], 0, None
        return batch


@dataclass(frozen=True, slots=True)
class Salvage:
    """What survived of a stream: the reply's text so far (a continuation's prefix
    included), how many chunks were journaled, and whether a tool call had begun."""

    text: str
    chunks: int
    tool_call_started: bool = False

    @classmethod
    def from_chunks(cls, chunks: Iterable[StreamChunk], prefix: str = "") -> Salvage:
        """The salvage of journaled ``chunks`` of a call whose request had ``prefix``."""
        listed = list(chunks)
        return cls(prefix + "".join(c.text for c in listed), len(listed),
                   any(c.tool_call is not None for c in listed))


def choose_recovery(policy: Recovery, salvage: Salvage, *, stateful: bool) -> Recovery:
    """The recovery to record for ``salvage`` under ``policy``: a stateful call is
    always surfaced; ``continue`` becomes ``restart`` when there is no text to go on from
    or a tool call had begun."""
    if stateful:
        return Recovery.SURFACE
    if policy is Recovery.CONTINUE and (not salvage.text or salvage.tool_call_started):
        return Recovery.RESTART
    return policy


def continuation_of(request: ModelRequest, salvage: Salvage) -> ModelRequest:
    """The request that continues ``salvage``: the same call, the salvaged text as its
    prefix (the client asks for the rest in the way its API allows, and joins)."""
    return replace(request, prefix=salvage.text)


def lost_usage(request: ModelRequest, salvage: Salvage, counter: TokenCounter) -> Usage:
    """An estimate of what a lost attempt was billed: the prompt's tokens and the
    salvaged output's, by ``counter``. The provider's figure was never seen, so this is
    what a ledger records as in doubt, never as known."""
    prompt = counter.count_prompt(request.messages, request.tools)
    written = counter.count_text(salvage.text[len(request.prefix):])
    return Usage(input_tokens=prompt, output_tokens=written)


_NOTE = ("[perdure: the reply above was interrupted after {chunks} chunk(s) and is "
         "incomplete ({reason}). It was not continued automatically.]")


@dataclass(frozen=True, slots=True)
class RecoveryMarker:
    """The typed marker of a recovered stream: which recovery was chosen, the partial
    text, how many chunks it was and why the stream stopped."""

    recovery: Recovery
    partial: str
    chunks: int
    reason: str

    def messages(self) -> tuple[Message, ...]:
        """For ``surface``: the partial reply and a note the model can read, to append
        to the conversation."""
        return (Message.assistant(self.partial),
                Message.user(_NOTE.format(chunks=self.chunks, reason=self.reason)))

    def to_json(self) -> dict[str, Any]:
        """The JSON form, for memory."""
        return {"recovery": str(self.recovery), "partial": self.partial,
                "chunks": self.chunks, "reason": self.reason}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> RecoveryMarker:
        """Rebuild from ``to_json()``."""
        return cls(Recovery(value["recovery"]), str(value["partial"]), int(value["chunks"]),
                   str(value["reason"]))
