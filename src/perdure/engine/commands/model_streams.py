"""``run.model(stream=True)``: a streamed reply journaled as it arrives, and recovered
when a crash or a broken connection cut it short.

While a stream runs, its chunks go to memory in batches (``model_chunks``), each a
durable commit, by the call's ``FlushPolicy`` (every 100 ms or 64 tokens by default,
the earlier; a timer writes a stalled stream's batch on time too), so a worker killed
mid-stream loses at most one batch. The batch still pending when the stream ends goes
with the reply's record; the one pending when it breaks, with the failure's.

An attempt whose stream was cut short is one that memory holds chunks of and no reply:
broken (its ``model_failed`` says why) or lost with its worker (no outcome at all; on
resume the node records it failed, "the worker was lost mid-stream", and may try again
at once). The next attempt first decides what to do with what was salvaged, by the
call's recovery policy (``perdure.llm.choose_recovery``), and records the choice
(``model_recovered``, with an estimate of what the lost attempt was billed):

- ``continue``: the request again with the salvaged text as its prefix; the client
  asks the model to go on from it and the reply holds both parts joined;
- ``restart``: the request again from scratch;
- ``surface``: nothing is sent; the agent gets a reply holding the partial text, with
  finish reason ``interrupted`` (``RecoveryMarker.messages`` puts it and a note the model
  can read into the conversation).

The salvaged text of an attempt is its own prefix (the text it continued) and its
chunks, so a stream cut short twice is continued from all of it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from time import monotonic
from typing import Any

from perdure.core.backoff import ErrorClass
from perdure.core.bodies import ModelChunks, ModelFailed, ModelRecovered
from perdure.core.records import Kind, Record, RecordDraft
from perdure.engine.commands.model_attempts import Attempts, failure_of
from perdure.engine.commands.model_calls import Route
from perdure.engine.commands.model_memory import sealed_chunks
from perdure.engine.commands.step_failures import cannot_do
from perdure.errors import CannotDo
from perdure.llm import (
    CallFailure,
    ChunkBatcher,
    FailureKind,
    ModelCallError,
    ModelReply,
    ModelRequest,
    Recovery,
    RecoveryMarker,
    Salvage,
    StreamChunk,
    StreamTexts,
    choose_recovery,
    continuation_of,
    counter_for_model,
    load_counter,
    lost_usage,
)

__all__ = ["INTERRUPTED", "LOST", "StreamAttempts", "salvage_of"]

INTERRUPTED = "interrupted"
"""The finish reason of a surfaced reply: the partial text of a stream cut short."""

LOST = "the worker was lost mid-stream"
"""The reason recorded for an attempt whose worker died while it streamed."""

_MODEL_CHUNKS = Kind.MODEL_CHUNKS.value
_MODEL_RECOVERED = Kind.MODEL_RECOVERED.value
_END = object()  # the stream ended: its reply came
_TICK = object()  # a pending batch came due while no chunk arrived


def salvage_of(recs: Sequence[Record], attempt: int) -> Salvage | None:
    """What memory holds of attempt ``attempt``'s stream, its prefix included (``None``:
    no chunk of it was journaled)."""
    return StreamTexts.of(recs).salvage(attempt)


class StreamAttempts(Attempts):
    """A streaming call: each attempt is journaled in batches, and one that follows an
    attempt cut short first decides, and records, what to do with its salvage."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.texts = StreamTexts.of(self.recs)
        self._lost()

    def _lost(self) -> None:
        """An attempt with chunks and no outcome was lost with its worker: say so."""
        if not self.texts.chunks:
            return
        attempt = max(self.texts.chunks)
        if any(int(f["attempt"]) == attempt for f in self.failures):
            return
        last = next(r.body for r in reversed(self.recs)
                    if r.kind == _MODEL_CHUNKS and r.body["attempt"] == attempt)
        route = self.routes[int(last["client"])] if int(last["client"]) < len(
            self.routes) else self.routes[0]
        failure = CallFailure(FailureKind.TRANSIENT, ErrorClass.TRANSIENT, LOST)
        body = ModelFailed(self.pos, self.name, attempt, route.index, route.client.provider,
                           route.request(self.request).model, self.asked, failure.to_json(),
                           0.0, self.run._clock(), False, len(self.texts.chunks[attempt]))
        self.failures.append(body.encode())
        self.run._journal.defer(body.draft(), volatile=False)

    def _recovery(self, sent: ModelRequest) -> tuple[Recovery, Salvage] | None:
        """What this attempt does with the last one's salvage (``None``: nothing to do),
        recorded with the next commit."""
        if not self.failures:
            return None
        last = self.failures[-1]
        salvage = self.texts.salvage(int(last["attempt"]))
        if salvage is None:
            return None
        chosen = choose_recovery(self.options.recovery, salvage, stateful=sent.stateful)
        lost = lost_usage(sent, salvage, counter_for_model(sent.model))
        body = ModelRecovered(self.pos, self.name, self.attempt, str(chosen),
                              str(self.options.recovery), salvage.chunks, len(salvage.text),
                              str(last["failure"]["reason"]), lost.to_json())
        self.texts.recovered[self.attempt] = body.encode()
        self.run._journal.defer(body.draft(), volatile=False)
        return chosen, salvage

    async def attempt_on(self, route: Route, skipped: list[dict[str, Any]]
                         ) -> ModelReply | None:
        """One attempt on ``route``: recover, stream, record (``None``: it failed)."""
        sent = route.request(self.request)
        if self.failures:  # a salvage's lost tokens are counted: the encoding off the loop
            await load_counter(sent.model)
        recovery = self._recovery(sent)
        marker = None
        prefix_from = None  # the attempt whose salvage the request goes on from
        if recovery is not None:
            chosen, salvage = recovery
            marker = {"recovery": str(chosen), "chunks": salvage.chunks}
            if chosen is Recovery.SURFACE:
                return await self._surface(route, sent, salvage, skipped)
            if chosen is Recovery.CONTINUE:
                sent = continuation_of(sent, salvage)
                prefix_from = int(self.failures[-1]["attempt"])
        await self.started(route, sent)
        began = monotonic()
        batches = _Batches(self, route)
        try:
            reply = await batches.stream(sent)
        except CannotDo as exc:  # no key or SDK here (``NodeLacksError``): another node
            cannot_do(self.run, self.name, self.pos, exc.reason)
        except Exception as exc:  # noqa: BLE001 - recorded, then acted on as memory says
            tail = batches.tail()
            if tail is not None:
                self.run._journal.defer(tail, volatile=False)
            failure, partial, _ = self.failure_of(exc, sent)
            await self.failed(route, sent, failure, monotonic() - began, batches.count,
                              partial)
            return None
        tail = batches.tail()
        return await self.record(route, sent, reply, skipped, marker,
                                 before=[] if tail is None else [tail],
                                 streamed=self.attempt, prefix_from=prefix_from)

    async def _surface(self, route: Route, sent: ModelRequest, salvage: Salvage,
                       skipped: list[dict[str, Any]]) -> ModelReply:
        """Record and return the salvaged text as the reply, marked interrupted."""
        reason = str(self.failures[-1]["failure"]["reason"])
        marker = RecoveryMarker(Recovery.SURFACE, salvage.text, salvage.chunks, reason)
        reply = ModelReply(text=salvage.text, finish_reason=INTERRUPTED,
                           model=sent.model, provider=route.client.provider)
        recorded = {**marker.to_json(), "partial": len(salvage.text)}
        return await self.record(route, sent, reply, skipped, recorded,
                                 streamed=int(self.failures[-1]["attempt"]))

    def failure_of(self, exc: Exception, sent: ModelRequest) -> tuple[CallFailure, str, int]:
        """A stream's failure; its partial text is what memory holds."""
        failure, _, chunks = failure_of(exc, sent)
        salvage = self.texts.salvage(self.attempt)
        return failure, salvage.text if salvage is not None else "", chunks


class _Batches:
    """One attempt's stream, read by a task of its own and journaled in batches."""

    def __init__(self, attempts: StreamAttempts, route: Route) -> None:
        self.attempts = attempts
        self.route = route
        self.batcher = ChunkBatcher(attempts.options.flush)
        self.count = 0  # chunks journaled or pending
        self.attempt = attempts.attempt

    def draft(self, batch: Sequence[StreamChunk]) -> RecordDraft:
        """The record of a batch (noted in the call's texts as it is made)."""
        owner = self.attempts
        self.attempts.texts.add(self.attempt, batch)
        return ModelChunks(owner.pos, owner.name, self.attempt, self.route.index, owner.asked,
                           batch[0].index, sealed_chunks(owner.run, owner.name,
                                                         [c.to_json() for c in batch])
                           ).draft()

    def tail(self) -> RecordDraft | None:
        """The batch still pending, as a record (``None``: none)."""
        batch = self.batcher.take()
        return self.draft(batch) if batch else None

    async def stream(self, sent: ModelRequest) -> ModelReply:
        """Stream ``sent``; every due batch is committed as it comes due."""
        queue: asyncio.Queue[Any] = asyncio.Queue()

        async def pump() -> None:
            try:
                async for item in self.route.client.stream(sent):
                    queue.put_nowait(item)
                queue.put_nowait(_END)
            except Exception as exc:  # noqa: BLE001 - handed to the reader, raised there
                queue.put_nowait(exc)

        task = asyncio.create_task(pump())
        reply: ModelReply | None = None
        loop = asyncio.get_running_loop()
        # One timer per pending batch (not a timed wait per chunk, which costs more than
        # the chunk): it drops a tick in the queue when the batch comes due.
        timer: asyncio.TimerHandle | None = None
        timed: float | None = None  # the deadline the timer is set for
        try:
            while reply is None:
                deadline = self.batcher.deadline
                if deadline != timed:
                    if timer is not None:
                        timer.cancel()
                    timer = None if deadline is None else loop.call_later(
                        max(0.0, deadline - monotonic()), queue.put_nowait, _TICK)
                    timed = deadline
                item = queue.get_nowait() if not queue.empty() else await queue.get()
                if item is _TICK:  # a stalled stream: its batch is due
                    timed = None
                    due = self.batcher.deadline
                    if due is not None and monotonic() >= due:
                        await self.flush(self.batcher.take())
                    continue
                if isinstance(item, StreamChunk):
                    self.count += 1
                    await self.flush(self.batcher.add(item, monotonic()))
                elif isinstance(item, ModelReply):
                    reply = item
                elif isinstance(item, Exception):
                    raise item
                else:
                    raise ModelCallError(CallFailure(
                        FailureKind.TRANSIENT, ErrorClass.TRANSIENT,
                        "the stream ended without a reply"), model=sent.model,
                        provider=self.route.client.provider)
        finally:
            if timer is not None:
                timer.cancel()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        return reply

    async def flush(self, batch: Sequence[StreamChunk]) -> None:
        """Commit ``batch`` (nothing if it is empty)."""
        if batch:
            await self.attempts.run._journal.commit([self.draft(batch)])
