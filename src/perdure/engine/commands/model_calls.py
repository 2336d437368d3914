"""How ``run.model`` replays a call, and how it starts one memory does not answer yet
(``model_attempts`` makes the attempts).

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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from perdure.core.backoff import RetryPolicy
from perdure.core.records import Kind, Record
from perdure.engine.commands.model_memory import ModelMemory
from perdure.engine.commands.positions import find
from perdure.engine.commands.steps import fresh_flags
from perdure.engine.journal import HistoryEnd
from perdure.engine.signals import Park
from perdure.errors import ConfigurationError, NonDeterminismError
from perdure.llm import (
    CallFailure,
    FlushPolicy,
    Message,
    ModelCallError,
    ModelClient,
    ModelParams,
    ModelReply,
    ModelRequest,
    PriceTable,
    Recovery,
    ToolSpec,
    request_hash,
)

if TYPE_CHECKING:
    from perdure.engine.run import Run

__all__ = [
    "CMD",
    "DEFAULT_MODEL_RETRY",
    "CallOptions",
    "Route",
    "call",
    "error_of",
    "reply_of",
    "request_of",
    "routes_of",
]

CMD = "model"  # the command name in the records of a model call
DEFAULT_MODEL_RETRY = RetryPolicy(max_attempts=5, base=1.0, cap=600.0)
"""Attempts per client and their pace, unless the call says otherwise."""

_MODEL_CALL = Kind.MODEL_CALL.value
_MODEL_FAILED = Kind.MODEL_FAILED.value


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


def reply_of(run: Run, body: Mapping[str, Any], seq: int = 0) -> ModelReply:
    """The reply a ``model_call`` body holds, as the agent gets it."""
    return ModelMemory.of(run).reply_of(body, object_id=run.object_id, seq=seq)


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
            return reply_of(run, done.body, done.seq)
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
    from perdure.engine.commands.model_attempts import Attempts

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
