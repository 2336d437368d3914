"""Queries: named state read from an object's memory, without running or waking it.

An agent's code declares queries, plain functions of a ``MemoryView`` (and any
arguments the caller passes)::

    @app.define_query(agent=research)
    def sources(view: perdure.MemoryView) -> list[str]:
        return [url for found in view.steps("search") for url in found]

    handle.query("sources")                     # or app.query(object_id, "sources")
    # perdure query OBJECT_ID sources

A query runs in the caller's process over the object's memory as the store holds it,
after checking it: the chain links and every record's signature under a key this node
trusts, that memory reaches the head the object's row names, and that it has not moved
back from a head this node saw (``App.verify``'s checks). It takes no lease and writes
nothing, so it reads a running object (what it has recorded so far), a dormant one
(without waking it) and an ended one alike. A query must be pure: it sees memory only
through the view, and its answer is whatever it returns.

The view's records are opened with the App's data keys (``perdure.keys.opener``): step
results, emitted values, received events and the result hold ``Secret`` objects where
secrets were (and the whole value, for an agent that encrypts all); what the App
cannot open stays sealed (``{"perdure:sealed": ...}``). ``perdure query`` prints a
``Secret`` as ``Secret('***')``.
"""

from __future__ import annotations

import builtins
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from perdure.core.bodies import Instantiated, IntentRefined, decode
from perdure.core.codec import detached
from perdure.core.intent import Context, Intent
from perdure.core.names import check_name
from perdure.core.questions import Question, pending_questions
from perdure.core.records import Kind, Record
from perdure.errors import (
    ConfigurationError,
    ObjectNotFoundError,
    QueryFailedError,
    RecordDecodeError,
    UnknownQueryError,
)
from perdure.info import info_from_row
from perdure.keys.client import lookup_id

if TYPE_CHECKING:
    from perdure.app import App

__all__ = ["MemoryView", "QueryFn", "QueryRegistry", "run_query"]

QueryFn = Callable[..., Any]
"""A query: ``fn(view: MemoryView, *args) -> answer``."""

_STEP_DONE = Kind.STEP_DONE.value
_EMITTED = Kind.EMITTED.value
_PROGRESS = Kind.PROGRESS.value
_EVENT_RECEIVED = Kind.EVENT_RECEIVED.value
_TERMINATED = Kind.TERMINATED.value
_REFINED = Kind.INTENT_REFINED.value


@dataclass(frozen=True)
class MemoryView:
    """An object's checked memory, read-only, as a query sees it.

    ``records`` are all of them, in order; the methods pick out what agents record
    most: step results, emitted events, progress notes, received events, the questions
    it asks and its result. Values are copies: a query cannot change memory.
    """

    object_id: str
    agent: str
    agent_version: str
    status: str
    records: tuple[Record, ...]

    def _first(self) -> Instantiated:
        body = decode(self.records[0])
        if not isinstance(body, Instantiated):
            raise RecordDecodeError(self.object_id, 1, "the first record is not instantiated")
        return body

    @property
    def intent(self) -> Intent:
        """The intent as memory leaves it (after every refinement)."""
        for rec in reversed(self.records):
            if rec.kind == _REFINED:
                body = decode(rec)
                assert isinstance(body, IntentRefined)
                return body.intent
        return self._first().intent

    @property
    def context(self) -> Context:
        """Identity, lineage and labels (``forked_from`` for a fork)."""
        return self._first().context

    def steps(self, name: str | None = None) -> builtins.list[Any]:
        """The results of the steps done (named ``name``, or all), in order."""
        return [detached(rec.body.get("result")) for rec in self.records
                if rec.kind == _STEP_DONE and (name is None or rec.body.get("name") == name)]

    def step(self, name: str, default: Any = None) -> Any:
        """The result of the last step named ``name`` done, or ``default``."""
        found = self.steps(name)
        return found[-1] if found else default

    def emitted(self, name: str | None = None) -> builtins.list[Any]:
        """The data of the events emitted (``run.emit``) named ``name``, or all, in order."""
        return [detached(rec.body.get("data")) for rec in self.records
                if rec.kind == _EMITTED and (name is None or rec.body.get("name") == name)]

    def last_emitted(self, name: str, default: Any = None) -> Any:
        """The data of the last event emitted as ``name``, or ``default``."""
        found = self.emitted(name)
        return found[-1] if found else default

    def progress(self) -> builtins.list[dict[str, Any]]:
        """The progress notes (``run.progress``), in order."""
        return [detached(rec.body.get("fields")) for rec in self.records
                if rec.kind == _PROGRESS and isinstance(rec.body.get("fields"), dict)]

    def received(self, event: str | None = None) -> builtins.list[Any]:
        """The payloads of the events received (``run.wait_for``), named ``event`` or all."""
        return [detached(rec.body.get("payload")) for rec in self.records
                if rec.kind == _EVENT_RECEIVED
                and (event is None or rec.body.get("name") == event)]

    @property
    def asking(self) -> tuple[Question, ...]:
        """The questions the object asks and that have not been answered."""
        return tuple(pending_questions(self.records, self.agent))

    @property
    def ended(self) -> bool:
        """Whether memory holds the object's terminal record."""
        return bool(self.records) and self.records[-1].kind == _TERMINATED

    @property
    def result(self) -> Any:
        """A completed object's result (``None`` before, or for another ending)."""
        if not self.ended or self.records[-1].body.get("outcome") != "completed":
            return None
        return detached(self.records[-1].body.get("result"))


class QueryRegistry:
    """Queries declared for each agent, by name."""

    def __init__(self) -> None:
        self._by_agent: dict[str, dict[str, QueryFn]] = {}

    def copy(self) -> QueryRegistry:
        """An independent copy (``App.with_settings``)."""
        clone = QueryRegistry()
        clone._by_agent = {agent: dict(fns) for agent, fns in self._by_agent.items()}
        return clone

    def add(self, agent: str, name: str, fn: QueryFn) -> None:
        """Declare ``fn`` as query ``name`` of ``agent``; ``ConfigurationError`` for a
        name taken by another function, or a function that is not a plain ``def``."""
        check_name(name, "query name")
        if not callable(fn) or inspect.iscoroutinefunction(fn):
            raise ConfigurationError(
                f"query {name!r} must be a plain function of the memory view (not async): "
                "a query reads recorded memory and awaits nothing")
        known = self._by_agent.setdefault(agent, {})
        if name in known and known[name] is not fn:
            raise ConfigurationError(f"query {name!r} of agent {agent!r} is declared twice")
        known[name] = fn

    def names(self, agent: str) -> builtins.list[str]:
        """The queries declared for ``agent``, sorted."""
        return sorted(self._by_agent.get(agent, {}))

    def get(self, agent: str, name: str) -> QueryFn:
        """Query ``name`` of ``agent``; ``UnknownQueryError`` naming those there are."""
        fn = self._by_agent.get(agent, {}).get(name)
        if fn is None:
            known = ", ".join(self.names(agent)) or "none"
            raise UnknownQueryError(
                f"no query {name!r} for agent {agent!r} (declared: {known}); declare it "
                f"with @app.define_query(agent={agent!r})")
        return fn


def run_query(app: App, registry: QueryRegistry, object_id: str, name: str,
              args: Sequence[Any]) -> Any:
    """Answer query ``name`` of the object's agent over its checked memory."""
    if not isinstance(name, str):
        raise ConfigurationError(f"a query name is a string, not {type(name).__name__}")
    row = app.store.get(lookup_id(object_id))
    if row is None:
        raise ObjectNotFoundError(f"no object {object_id!r} in {app.store.url}")
    fn = registry.get(row.agent, name)
    row, records = app.client.checked_memory(object_id)
    status = str(info_from_row(row, app.clock()).status)

    view = MemoryView(object_id, row.agent, row.agent_version, status,
                      tuple(app.client.opener(app.open_sealed).records(records)))
    try:
        return fn(view, *args)
    except Exception as exc:
        raise QueryFailedError(
            f"query {name!r} of object {object_id!r} raised {type(exc).__name__}: {exc}"
        ) from exc
