"""How ``run.model`` replays and runs a call: choosing a client, recording the outcome.

Memory holds, at the call's position, one ``model_failed`` per failed attempt (which
client, what failure, until when that client rests) and at most one ``model_call`` (the
reply). From them, each time the agent reaches the call:

- a ``model_call`` is the answer: its reply comes back, rebuilt, and nothing is sent;
- a final ``model_failed`` is the answer too: the same ``ModelCallError`` is raised;
- else the first client of the list that may be tried now is tried (one that never
  failed here, or whose rest is over). One resting no longer than ``wait_up_to`` is
  waited for (the object goes dormant until then) rather than passed over; one resting
  longer, or that gave up (its attempts spent, or a permanent failure), is skipped, and
  the reply's record says which were skipped and why. When every client rests, the
  object is dormant until the first may be tried; when every one gave up, or a failure
  is in doubt, the call fails for good.

A client's rest after a failure is the step retry's pace (``core.backoff.next_delay``
over that client's failures here, the provider's ``retry-after`` first), so a model call
and a step back off alike. Each message is stored once per object (``model_memory``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NoReturn

from perdure.core.backoff import ErrorClass, Failure, RetryPolicy, next_delay
from perdure.core.bodies import Dormant, ModelCall, ModelFailed, ModelStarted
from perdure.core.records import Kind, Record, RecordDraft
from perdure.engine.commands.model_budget import (
    call_key,
    exhausted,
    held,
    lineage_of,
    refusal,
)
from perdure.engine.commands.model_memory import ModelMemory
from perdure.engine.commands.positions import find
from perdure.engine.commands.steps import fresh_flags
from perdure.engine.journal import HistoryEnd
from perdure.engine.signals import Park, Suspend
from perdure.errors import ConfigurationError, NonDeterminismError, PerdureError
from perdure.llm import (
    Budget,
    CallFailure,
    FailureKind,
    FlushPolicy,
    Ledger,
    Message,
    ModelCallError,
    ModelClient,
    ModelParams,
    ModelReply,
    ModelRequest,
    PriceTable,
    Recovery,
    ToolSpec,
    classify_exception,
    reply_failure,
    request_hash,
)

if TYPE_CHECKING:
    from perdure.engine.run import Run

__all__ = [
    "CMD",
    "DEFAULT_MODEL_RETRY",
    "Attempts",
    "CallOptions",
    "Route",
    "call",
    "error_of",
    "failure_of",
    "reply_of",
    "request_of",
    "routes_of",
]

CMD = "model"  # the command name in the records of a model call
DEFAULT_MODEL_RETRY = RetryPolicy(max_attempts=5, base=1.0, cap=600.0)
"""Attempts per client and their pace, unless the call says otherwise."""

_MODEL_CALL = Kind.MODEL_CALL.value
_MODEL_FAILED = Kind.MODEL_FAILED.value
_MODEL_STARTED = Kind.MODEL_STARTED.value
_MODEL_CHUNKS = Kind.MODEL_CHUNKS.value
IN_FLIGHT = "the worker was lost while a stateful request was in flight"
"""The reason recorded for a stateful call whose worker died before its outcome."""


@dataclass(frozen=True, slots=True)
class CallOptions:
    """How one ``run.model`` call is made (see its docstring)."""

    name: str | None
    stream: bool
    prices: PriceTable | None
    retry: RetryPolicy
    wait_up_to: float
    recovery: Recovery
    flush: FlushPolicy

    @classmethod
    def build(cls, *, name: str | None, stream: bool, prices: PriceTable | None,
              retry: RetryPolicy | None, wait_up_to: float, recovery: Recovery | str,
              flush: FlushPolicy | None) -> CallOptions:
        """The options, checked (``ConfigurationError`` for a wrong one)."""
        if wait_up_to < 0:
            raise ConfigurationError("wait_up_to must be 0 or more seconds")
        try:
            policy = Recovery(recovery)
        except ValueError:
            raise ConfigurationError(f"recovery must be continue, restart or surface, "
                                     f"not {recovery!r}") from None
        return cls(name, stream, prices, retry or DEFAULT_MODEL_RETRY, wait_up_to, policy,
                   flush or FlushPolicy())


@dataclass(frozen=True, slots=True)
class Route:
    """One client of a call's fallback list: its place, the client, and the model to ask
    it for (``None``: the request's)."""

    index: int
    client: ModelClient
    model: str | None = None

    def request(self, request: ModelRequest) -> ModelRequest:
        """``request`` as this client is sent it."""
        return request if self.model is None else replace(request, model=self.model)


def routes_of(clients: ModelClient | Sequence[ModelClient | tuple[ModelClient, str]]
              ) -> list[Route]:
    """The fallback list of a call: one client, or several tried in order."""
    if not isinstance(clients, Sequence):
        return [Route(0, clients)]
    routes = []
    for index, entry in enumerate(clients):
        if isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], str):
            routes.append(Route(index, entry[0], entry[1]))
        elif isinstance(entry, str) or not hasattr(entry, "complete"):
            raise ConfigurationError(f"run.model takes clients, or a list of clients and "
                                     f"(client, model) pairs, not {entry!r} at {index}")
        else:
            routes.append(Route(index, entry))
    if not routes:
        raise ConfigurationError("run.model needs at least one client")
    return routes


def request_of(request: ModelRequest | None, *, model: str | None,
               messages: Sequence[Message], tools: Sequence[ToolSpec],
               params: ModelParams | None) -> ModelRequest:
    """The request a call makes: the one given, or one built from its parts."""
    if request is not None:
        if model is not None or messages or tools or params is not None:
            raise ConfigurationError("give run.model a ModelRequest or model=, messages=, "
                                     "tools= and params=, not both")
        return request
    if not model:
        raise ConfigurationError("run.model needs a ModelRequest or model= and messages=")
    return ModelRequest(model, tuple(messages), tuple(tools), params or ModelParams())


# -- replay -----------------------------------------------------------------------------


def _check_asked(pos: int | str, name: str, asked: str, recs: Sequence[Record]) -> None:
    """The agent must ask what memory answered, else the object parks."""
    for rec in recs:
        recorded = rec.body.get("asked")
        if recorded is not None and recorded != asked:
            raise Park(NonDeterminismError(
                pos, f"model({name!r}) asking request {str(recorded)[:12]}",
                f"model({name!r}) asking request {asked[:12]}"))


def reply_of(run: Run, body: Mapping[str, Any]) -> ModelReply:
    """The reply a ``model_call`` body holds, as the agent gets it."""
    return ModelMemory.of(run).reply_of(body)


def error_of(body: Mapping[str, Any], partial: str = "") -> ModelCallError:
    """The error a ``model_failed`` body describes, as the agent gets it."""
    return ModelCallError(CallFailure.from_json(body["failure"]), model=str(body["model"]),
                          provider=str(body["provider"]), partial=partial,
                          chunks=int(body.get("chunks") or 0))


# -- execution ----------------------------------------------------------------------------


async def call(run: Run, clients: ModelClient | Sequence[ModelClient | tuple[ModelClient, str]],
               request: ModelRequest, options: CallOptions) -> ModelReply:
    """``run.model``: replay the call at the next position, or make it (see the module)."""
    routes = routes_of(clients)
    name = options.name or request.model
    asked = request_hash(request)
    pos, recs = run._take(CMD, name)
    if recs:
        _check_asked(pos, name, asked, recs)
        done = find(recs, Kind.MODEL_CALL)
        if done is not None:
            return reply_of(run, done.body)
    failures = [dict(r.body) for r in recs if r.kind == _MODEL_FAILED]
    if failures and failures[-1]["final"]:
        raise _final_error(recs, failures[-1])
    # Execute: only once the run may go on, here and now, and never in a replay check.
    if run._journal.committer is None:
        raise HistoryEnd(run.object_id)
    run._boundary()
    await fresh_flags(run)
    run._boundary()
    if run._journal.volatile:  # values drawn since the last commit may be in the request
        await run._journal.commit()
    kind = Attempts
    if options.stream:
        from perdure.engine.commands.model_streams import StreamAttempts

        kind = StreamAttempts
    attempts = kind(run, pos, name, asked, request, routes, options, failures, recs)
    return await attempts.make()


def _final_error(recs: Sequence[Record], body: Mapping[str, Any]) -> ModelCallError:
    """The error of a call that failed for good, with the text its stream delivered."""
    from perdure.engine.commands.model_streams import salvage_of

    salvage = salvage_of(recs, int(body["attempt"]))
    return error_of(body, salvage.text if salvage is not None else "")


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
        while True:
            route, skipped = self.choose()
            with held(self.run, call_key({"pos": self.pos, "name": self.name}),
                      route.request(self.request),
                      self.options.prices or self.run._model_prices, bool(self.lineage)):
                reply = await self.attempt_on(route, skipped)
            if reply is not None:
                return reply

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
                     before: Sequence[RecordDraft] = (), streamed: int | None = None
                     ) -> ModelReply:
        """Record the reply (with the values memory does not hold yet, after the records
        ``before``; ``streamed``: the attempt whose chunks hold its text) and return it
        as memory holds it."""
        memory = ModelMemory.of(self.run)
        encoded = memory.table.encode(sent, self.asked, reply, base_url=route.client.base_url,
                                      provider=route.client.provider, streamed=streamed)
        cost = None
        prices = self.options.prices or self.run._model_prices
        if prices is not None:
            cost = prices.cost(sent.model, reply.usage)
            if cost is None and reply.model:
                cost = prices.cost(reply.model, reply.usage)
        body = ModelCall(self.pos, self.name, self.attempt, route.index,
                         route.client.provider, self.asked, encoded.request, encoded.blobs,
                         encoded.reply, None if cost is None else str(cost),
                         tuple(skipped), recovery)
        try:
            await self.run._journal.commit([*before, body.draft()])
        except BaseException:
            memory.table.forget(encoded.numbers)
            raise
        memory.learn(body.encode())
        return memory.reply_of(body.encode())
