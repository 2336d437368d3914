"""How one call of ``run.model`` is made: choosing a client, sending, recording the
outcome (``model_calls`` replays; this module runs what memory does not answer yet).

Each attempt tries the first client of the fallback list that may be tried now (one
that never failed at this position, or whose rest is over), within the budgets over the
object (``model_budget``: a client whose reservation does not fit is skipped). A failed
attempt is recorded (``model_failed``) with when that client may be tried again, the
step retry's pace; the object is dormant until then. A stateful request commits
``model_started`` before it leaves, and one found started with no outcome on resume
fails for good, in doubt. The reply is recorded (``model_call``) with only the values
memory does not hold yet (``model_memory``). Streaming attempts: ``model_streams``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NoReturn

from perdure.core.backoff import ErrorClass, Failure, next_delay
from perdure.core.bodies import Dormant, ModelCall, ModelFailed, ModelStarted
from perdure.core.records import Kind, Record, RecordDraft
from perdure.core.usage import decimal_text
from perdure.engine.commands.model_budget import (
    call_key,
    exhausted,
    held,
    lineage_of,
    refusal,
)
from perdure.engine.commands.model_calls import CallOptions, Route, error_of
from perdure.engine.commands.model_memory import ModelMemory, sealed_call
from perdure.engine.commands.step_failures import cannot_do
from perdure.engine.journal import StoreUnavailable
from perdure.engine.quotas import quota_provider
from perdure.engine.signals import Suspend
from perdure.errors import CannotDo, PerdureError, StoreError
from perdure.llm import (
    Budget,
    CallFailure,
    FailureKind,
    Ledger,
    ModelCallError,
    ModelReply,
    ModelRequest,
    PriceTable,
    classify_exception,
    counter_for_model,
    load_counter,
    reply_failure,
    reservation_for,
)

if TYPE_CHECKING:
    from perdure.engine.run import Run

__all__ = ["IN_FLIGHT", "Attempts", "failure_of"]

log = logging.getLogger("perdure.worker")

_MODEL_STARTED = Kind.MODEL_STARTED.value
_DORMANT = Kind.DORMANT.value
_RATE_LIMITED = FailureKind.RATE_LIMITED.value
_PERMANENT = FailureKind.PERMANENT.value
_JITTER = random.Random()
_MODEL_CHUNKS = Kind.MODEL_CHUNKS.value
IN_FLIGHT = "the worker was lost while a stateful request was in flight"
"""The reason recorded for a stateful call whose worker died before its outcome."""


def failure_of(exc: Exception, request: ModelRequest) -> tuple[CallFailure, str, int]:
    """What a client's exception means: the failure, the text a stream delivered, and
    how many chunks."""
    if isinstance(exc, ModelCallError):
        return exc.failure, exc.partial, exc.chunks
    if isinstance(exc, PerdureError):  # a setting (a missing key): trying again cannot help
        return (CallFailure(FailureKind.PERMANENT, ErrorClass.PERMANENT,
                            f"{type(exc).__name__}: {exc}"), "", 0)
    return classify_exception(exc, now=datetime.now(UTC), stateful=request.stateful), "", 0


class Attempts:
    """One call being made: its position, request, fallback list, what memory holds at
    its position and its failed attempts so far (bodies, in order). ``send`` makes one
    attempt (a streaming call overrides it: ``model_streams``)."""

    def __init__(self, run: Run, pos: int | str, name: str, asked: str,
                 request: ModelRequest, routes: list[Route], options: CallOptions,
                 failures: list[dict[str, Any]], recs: Sequence[Record]) -> None:
        self.run = run
        self.recs = recs
        self.pos = pos
        self.name = name
        self.asked = asked
        self.request = request
        self.routes = routes
        self.options = options
        self.failures = failures
        self.fresh = False  # a failure was recorded on this claim
        self.lineage: list[tuple[str, Budget, Ledger]] = []  # lineage budgets over it

    @property
    def attempt(self) -> int:
        """The number of the next attempt (failed attempts so far, plus one)."""
        return len(self.failures) + 1

    def choose(self) -> tuple[Route, list[dict[str, Any]]]:
        """The client to try now and those skipped (why); or dormant until one may be
        tried (``Suspend``)."""
        now = self.run._clock()
        latest = {int(f["client"]): f for f in self.failures}
        skipped: list[dict[str, Any]] = []
        soonest: float | None = None
        over: str | None = None  # why the first client over budget was
        for route in self.routes:
            last = latest.get(route.index)
            until = None if last is None else last["until"]
            if last is None or (until is not None and until <= now):
                why = self.over_budget(route)
                if why is None:
                    return route, skipped
                over = over or why
                skipped.append({"client": route.index, "provider": route.client.provider,
                                "reason": why, "until": None})
                continue
            if until is not None and until - now <= self.options.wait_up_to:
                self.dormant(until)
            if until is not None:
                soonest = until if soonest is None else min(soonest, until)
            skipped.append({"client": route.index, "provider": route.client.provider,
                            "reason": str(last["failure"]["reason"]), "until": until})
        if soonest is None and over is not None:  # what is left fits no client's call
            exhausted(self.pos, self.name, over)
        if soonest is None:  # every client gave up (memory says so in its last failure)
            raise error_of(self.failures[-1])
        self.dormant(soonest)

    def over_budget(self, route: Route) -> str | None:
        """Why ``route``'s call would go over a budget over the object (``None``: it
        fits, or there is none)."""
        return refusal(self.run, self.lineage, route.request(self.request),
                       self.options.prices or self.run._model_prices)

    def dormant(self, until: float) -> NoReturn:
        """Stay dormant until a client may be tried (the failures go with it)."""
        drafts = [Dormant.model_retry(self.pos, self.name, until).draft()] if self.fresh else []
        raise Suspend(drafts, ready_at=until,
                      reason=f"model call {self.name}: a client may be tried at {until:.3f}")

    async def make(self) -> ModelReply:
        """Try clients until one answers (recorded), the call rests (dormant) or fails."""
        await self.in_doubt()
        self.lineage = await lineage_of(self.run)
        if self.run.intent.budget is not None or self.lineage:
            for route in self.routes:  # a budget counts tokens: read encodings off the loop
                await load_counter(route.request(self.request).model)
        while True:
            route, skipped = self.choose()
            # The budget check (``choose``) and holding the reservation in the run's
            # ledger happen with no await between them: calls made at once (gather
            # branches) must each see the others' reservations. Only then may the call
            # wait on the store for its model quota.
            with held(self.run, call_key({"pos": self.pos, "name": self.name}),
                      route.request(self.request),
                      self.options.prices or self.run._model_prices, bool(self.lineage)):
                ticket = await self.reserve(route)
                before = len(self.failures)
                try:
                    reply = await self.attempt_on(route, skipped)
                except asyncio.CancelledError:
                    raise  # the reservation keeps its estimate until it leaves the window
                except BaseException:
                    await self.settle(route, ticket, None, before)
                    raise
                await self.settle(route, ticket, reply, before)
            if reply is not None:
                return reply

    async def reserve(self, route: Route) -> int | None:
        """Reserve the call's tokens against its model's quota, if it has one
        (``perdure.core.quotas``): the ticket to settle (``None``: no quota); dormant
        until the quota's window has room, when it has none now."""
        gate = self.run._quotas
        sent = route.request(self.request)
        provider = quota_provider(route.client.provider)
        if gate is None or not await gate.applies(provider, sent.model):
            return None
        await load_counter(sent.model)  # the encoding is read off the loop
        reserved, _ = reservation_for(sent, counter_for_model(sent.model), PriceTable())
        holder = f"{self.run.object_id}/{self.pos}/{self.name}/{self.attempt}"
        try:
            grant = await gate.reserve(provider, sent.model, reserved.total_tokens,
                                      self.run.object_id, holder)
        except StoreError as exc:  # not the agent's failure: abandon the run, retry later
            raise StoreUnavailable(exc) from exc
        if grant.granted:
            return grant.ticket
        until = float(grant.ready_at or self.run._clock())
        # Objects waiting for the same room do not all wake at the same instant.
        until += _JITTER.uniform(0.0, 0.05)
        drafts = [Dormant.model_retry(self.pos, self.name, until).draft()] if self.fresh else []
        if not any(r.kind == _DORMANT and r.body.get("reason") == "quota" for r in self.recs):
            drafts.append(Dormant(self.pos, "model", "quota", until, name=self.name).draft())
        raise Suspend(drafts, ready_at=until,
                      reason=f"model call {self.name}: waiting for the quota of "
                             f"{provider}/{sent.model} until {until:.3f}")

    async def settle(self, route: Route, ticket: int | None, reply: ModelReply | None,
                     before: int) -> None:
        """After an attempt: settle its reservation to what the provider reported (a
        reply's input and output tokens; none when it was refused or never sent; an
        attempt that failed on the way keeps its estimate), and adapt the quota when the
        provider answered 429."""
        gate = self.run._quotas
        if gate is None:
            return
        sent = route.request(self.request)
        provider = quota_provider(route.client.provider)
        kinds = [str(f["failure"]["kind"]) for f in self.failures[before:]]
        try:
            if ticket is not None:
                if reply is not None:
                    await gate.settle(ticket, reply.usage.input_tokens
                                      + reply.usage.output_tokens)
                elif not kinds or kinds[-1] in (_RATE_LIMITED, _PERMANENT):
                    await gate.settle(ticket, 0)
            if _RATE_LIMITED in kinds and await gate.applies(provider, sent.model):
                retry = next((f["failure"].get("retry_after") for f in self.failures[before:]
                              if f["failure"]["kind"] == _RATE_LIMITED), None)
                await gate.throttled(provider, sent.model,
                                     None if retry is None else float(retry))
        except StoreError:  # the reservation leaves the window all the same
            log.warning("model quota %s/%s: could not settle a reservation (store "
                        "unreachable); it leaves the window in time", provider, sent.model)

    async def in_doubt(self) -> None:
        """A stateful request sent (``model_started``) by an attempt that has no outcome
        and no chunks was in flight when its worker died: the provider may hold a
        response nobody saw, so the call fails for good, in doubt, never sent again."""
        done = {int(f["attempt"]) for f in self.failures}
        chunked = {int(r.body["attempt"]) for r in self.recs if r.kind == _MODEL_CHUNKS}
        for rec in self.recs:
            attempt = int(rec.body.get("attempt", 0))
            if rec.kind != _MODEL_STARTED or attempt in done or attempt in chunked:
                continue
            index = int(rec.body["client"])
            route = self.routes[index] if index < len(self.routes) else self.routes[0]
            sent = route.request(self.request)
            failure = CallFailure(FailureKind.IN_DOUBT, ErrorClass.PERMANENT, IN_FLIGHT)
            body = ModelFailed(self.pos, self.name, attempt, index, route.client.provider,
                               sent.model, self.asked, failure.to_json(), 0.0, None, True)
            await self.run._journal.commit([body.draft()])
            raise error_of(body.encode())

    async def started(self, route: Route, sent: ModelRequest) -> None:
        """Before a stateful request leaves, commit that it is being sent."""
        if sent.stateful:
            await self.run._journal.commit([ModelStarted(
                self.pos, self.name, self.attempt, route.index, self.asked).draft()])

    async def attempt_on(self, route: Route, skipped: list[dict[str, Any]]
                         ) -> ModelReply | None:
        """One attempt on ``route``: the reply, recorded; ``None`` when it failed (the
        failure is recorded; a streaming call overrides this: ``model_streams``)."""
        sent = route.request(self.request)
        await self.started(route, sent)
        began = time.perf_counter()
        try:
            reply = await route.client.complete(sent)
            refusal = reply_failure(reply)
            if refusal is not None:
                raise ModelCallError(refusal, model=sent.model, provider=route.client.provider)
        except CannotDo as exc:  # no key or SDK here (``NodeLacksError``): another node
            cannot_do(self.run, self.name, self.pos, exc.reason)
        except Exception as exc:  # noqa: BLE001 - recorded, then acted on as memory says
            failure, partial, chunks = failure_of(exc, sent)
            await self.failed(route, sent, failure, time.perf_counter() - began, chunks,
                              partial)
            return None
        return await self.record(route, sent, reply, skipped)

    async def failed(self, route: Route, sent: ModelRequest, failure: CallFailure,
                     latency: float, chunks: int, partial: str = "") -> None:
        """Record a failed attempt: with the next commit if another client or a later
        attempt may answer; committed, and raised into the agent, if none can."""
        mine = [f for f in self.failures if f["client"] == route.index]
        history = [Failure(int(f["attempt"]), ErrorClass(f["failure"]["error_class"]),
                           float(f["latency"]), f["failure"].get("retry_after"))
                   for f in mine]
        history.append(Failure(self.attempt, failure.error_class, latency,
                               failure.retry_after))
        delay = None
        if failure.kind is not FailureKind.IN_DOUBT:
            delay = next_delay(history, self.options.retry,
                               salt=f"{self.run.object_id}/{self.pos}/{self.name}/{route.index}")
        until = None if delay is None else self.run._clock() + delay
        others = {int(f["client"]): f["until"] for f in self.failures}
        others[route.index] = until
        final = failure.kind is FailureKind.IN_DOUBT or all(
            r.index in others and others[r.index] is None for r in self.routes)
        body = ModelFailed(self.pos, self.name, self.attempt, route.index,
                           route.client.provider, sent.model, self.asked, failure.to_json(),
                           round(latency, 6), until, final, chunks or None)
        self.failures.append(body.encode())
        self.fresh = True
        if final:
            await self.run._journal.commit([body.draft()])
            raise error_of(body.encode(), partial)
        self.run._journal.defer(body.draft(), volatile=False)

    async def record(self, route: Route, sent: ModelRequest, reply: ModelReply,
                     skipped: list[dict[str, Any]], recovery: dict[str, Any] | None = None,
                     before: Sequence[RecordDraft] = (), streamed: int | None = None,
                     prefix_from: int | None = None) -> ModelReply:
        """Record the reply (with the values memory does not hold yet, after the records
        ``before``; ``streamed``: the attempt whose chunks hold its text; ``prefix_from``:
        the attempt whose salvage is the request's prefix) and return it
        as memory holds it."""
        memory = ModelMemory.of(self.run)
        encoded = memory.table.encode(sent, self.asked, reply, base_url=route.client.base_url,
                                      provider=route.client.provider, streamed=streamed,
                                      prefix_from=prefix_from)
        cost = None
        prices = self.options.prices or self.run._model_prices
        if prices is not None:
            cost = prices.cost(sent.model, reply.usage)
            if cost is None and reply.model:
                cost = prices.cost(reply.model, reply.usage)
        request, blobs, recovery = sealed_call(self.run, self.name, encoded.request,
                                               encoded.blobs, recovery)
        body = ModelCall(self.pos, self.name, self.attempt, route.index,
                         route.client.provider, self.asked, request, blobs,
                         encoded.reply, None if cost is None else decimal_text(cost),
                         tuple(skipped), recovery)
        try:
            await self.run._journal.commit([*before, body.draft()])
        except BaseException:
            memory.table.forget(encoded.numbers)
            raise
        memory.learn(body.encode())
        from perdure.engine.commands.tools import count_model_call

        count_model_call(self.run, reply.usage.total_tokens, cost)  # for the tool gate
        return memory.reply_of(body.encode())
