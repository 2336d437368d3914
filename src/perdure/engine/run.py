"""``Run``: what an agent holds while it runs, replaying memory and recording new work.

Every command an agent issues (step, sleep, wait_for, now, uuid, random) takes
the next *position*. On resume the agent function runs again from the top; a
command whose position already has records returns what they say without
doing the work again. A command that does not match what its position
recorded parks the object with a non-determinism record.

``Run`` itself is the replay cursor: it indexes memory by position once, hands out
positions (``_take``), checks at each command boundary that the run may go on
(``_boundary``) and holds what every command needs (the journal, the intent, the
node's hooks). The commands live in ``perdure.engine.commands``, one family per
module with its replay rule beside its execution rule, and are bound here as
methods. ``SyncRun``, for plain ``def`` agents, is in ``perdure.engine.sync_run``;
the signals that unwind the agent (``Suspend``, ``Park``, ``DeadlineExceeded``)
in ``perdure.engine.signals``.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from perdure.core.codec import MAX_DEPTH, encode
from perdure.core.intent import Context, Intent
from perdure.core.lifecycle import Status
from perdure.core.records import Kind, Record
from perdure.engine.commands import agent_loop, emits, lineage, steps, updates, values, waits
from perdure.engine.commands import intent as intent_commands
from perdure.engine.commands import model as model_command
from perdure.engine.commands import resources as resource_commands
from perdure.engine.commands.lineage import (
    CHILD_EVENT,
    ChildHandle,
    ChildStarter,
    Spawn,
    child_finished_body,
)
from perdure.engine.commands.positions import branch, top
from perdure.engine.journal import Journal
from perdure.engine.signals import DeadlineExceeded, Park, Suspend
from perdure.engine.sync_run import SyncChildHandle, SyncRun, is_async
from perdure.errors import CancelRequestedError, LeaseLostError, NonDeterminismError
from perdure.keys.verifier import EventCheck
from perdure.stores.base import Event

if TYPE_CHECKING:
    from perdure.engine.commands.model_memory import ModelMemory
    from perdure.engine.quotas import QuotaGate
    from perdure.keys.sealer import Sealer
    from perdure.llm import PriceTable

__all__ = [
    "CHILD_EVENT",
    "ChildHandle",
    "ChildStarter",
    "DeadlineExceeded",
    "Park",
    "Run",
    "Suspend",
    "SyncChildHandle",
    "SyncRun",
    "child_finished_body",
    "is_async",
]

# Compared as the plain strings a record holds (the index pass sees every record).
_CHILD_FINISHED = Kind.CHILD_FINISHED.value
_CAPABILITY_MISSING = Kind.CAPABILITY_MISSING.value
_INSTANTIATED = Kind.INSTANTIATED.value
_STEP_DONE = Kind.STEP_DONE.value
_INVALIDATED = Kind.INVALIDATED.value
_SPECIAL_KINDS = frozenset((_CHILD_FINISHED, _CAPABILITY_MISSING, _INSTANTIATED, _INVALIDATED))
_INTENT_REFINED = Kind.INTENT_REFINED.value


class Run:
    """The handle an ``async def`` agent receives. Plain ``def`` agents get ``SyncRun``."""

    def __init__(
        self,
        *,
        journal: Journal,
        intent: Intent,
        context: Context,
        records: Sequence[Record],
        load_events: Callable[[], Awaitable[list[Event]]],
        pending_events: Sequence[Event] = (),
        step_executor: Callable[..., Awaitable[Any]],
        clock: Callable[[], float] = time.time,
        spawn: Spawn | None = None,
        cancel: Callable[[str], Awaitable[None]] | None = None,
        capabilities: frozenset[str] = frozenset(),
        check_event: Callable[[Event], EventCheck] | None = None,
        refresh_flags: Callable[[], Awaitable[None]] | None = None,
        crashes: int = 0,
        max_crashes: int | None = None,
        model_prices: PriceTable | None = None,
        lineage_budgets: Callable[[], Awaitable[list[Any]]] | None = None,
        sealer: Sealer | None = None,
        quotas: QuotaGate | None = None,
    ) -> None:
        # What the node hands every command.
        self._journal = journal
        #: Seals secrets in the payloads commands write (``perdure.keys.sealer``).
        self._sealer = sealer
        self._check_event = check_event
        self._refresh_flags = refresh_flags
        self._intent = intent
        self._context = context
        self._load_events = load_events
        self._pending: Sequence[Event] = pending_events
        self._step_executor = step_executor
        self._clock = clock
        self._spawn = spawn
        self._cancel = cancel  # asks another object to cancel (a schedule's previous run)
        self._capabilities = capabilities
        self._model_prices = model_prices  # the App's price table for ``run.model``
        # Lineage budgets over this object, with their lineages' records (``model_budget``)
        self._lineage_budgets = lineage_budgets
        # Model quotas shared through the store (``engine.quotas``; ``None``: none apply)
        self._quotas = quotas
        # The cursor and memory by position.
        self._pos = 0
        # A gather ran: commands may run in its branches. Until then every command is on
        # the main line, and the hot path need not ask the branch context variable.
        self._branched = False
        self._history: dict[int | str, list[Record]] = {}
        self._done: dict[int | str, Record] = {}
        self._children: dict[str, dict[str, Any]] = {}
        self._refusals: set[str] = set()
        self._refined: list[str] = []  # digests of intent refinements sent from outside
        self._records = records  # what a reentry restores resources from (engine.restore)
        self._held: dict[str, resource_commands.Held] = {}  # resources held, by name
        self._replayed: dict[str, resource_commands.Held] = {}  # released ones, replayed
        # The object's checkpoint slots as the reentry read and verified them (by slot:
        # ``engine.slots.Slot``): resources' latest descriptors, steps' latest markers.
        self._slots: dict[str, Any] = {}
        self._max_recorded, self._rerouted = self._index(records)
        # What the commands learn as the agent runs (see their modules).
        self._crashes = crashes
        # Workers died in a row at this point often enough: the next new step parks.
        self._poisoned_at = max_crashes is not None and crashes >= max_crashes
        self._patches: dict[str, bool] = {}  # patch name -> the path this object takes
        self._last_fn: Any = None  # the function of the last step without a name, and
        self._last_name = ""  # the name it is recorded under
        self._started_here: set[int | str] = set()
        self._consumed: set[int] = set()
        self._digests: set[str] | None = None
        self._models: ModelMemory | None = None  # messages memory holds (``run.model``)
        # Updates (``engine.commands.updates``): handlers the agent set, validators declared.
        self._update_handlers: dict[str, tuple[Callable[..., Any],
                                               Callable[..., Any] | None]] = {}
        self._update_validators: Mapping[str, Callable[..., Any] | None] = {}
        #: Events refused on this claim: ``(event_id, name, reason)`` (the node logs them).
        self.refused: list[tuple[int, str, str]] = []
        self.cancel_requested = False
        self.pause_requested = False
        self.release_requested = False
        self.lease_lost = False

    def _index(self, records: Sequence[Record]) -> tuple[int, bool]:
        """Index memory by position, in one pass (10,000 records on a long resume).

        A position whose only record is a step's result (most of a long memory) is
        kept in ``_done``, the rest in ``_history``; replay of such a step takes the
        result from there in a few lookups. Returns the highest top-level position
        recorded and whether a step was rerouted for a capability.
        """
        history = self._history
        done = self._done
        children = self._children
        refined = self._refined
        top_pos = -1
        rerouted = False
        special = _SPECIAL_KINDS
        step_done = _STEP_DONE
        for rec in records:
            kind = rec.kind
            body = rec.body
            if kind in special:
                if kind == _CHILD_FINISHED:
                    children[str(body["child_id"])] = body
                elif kind == _CAPABILITY_MISSING:
                    self._refusals.add(str(body.get("refusal")))
                    rerouted = True
                elif kind == _INVALIDATED:
                    top_pos = self._invalidate(int(body["from_pos"]))
                continue
            pos = body.get("pos")
            if type(pos) is int:
                if pos > top_pos:
                    top_pos = pos
            elif type(pos) is str:
                top_pos = max(top_pos, top(pos))
            else:
                if kind == _INTENT_REFINED and body.get("event_hash"):  # from outside
                    refined.append(str(body["event_hash"]))
                continue
            recs = history.get(pos)
            if recs is not None:
                recs.append(rec)
            elif pos in done:  # a second record where a step's result stood alone
                history[pos] = [done.pop(pos), rec]
            elif kind == step_done and body.get("cmd") == "step":
                done[pos] = rec
            else:
                history[pos] = [rec]
        return top_pos, rerouted

    # -- payloads: the one path values take into memory -------------------------

    def _stored(self, value: Any, *, what: str, max_depth: int = MAX_DEPTH
                ) -> tuple[Any, bytes]:
        """``value`` as a record body keeps it, and its canonical bytes: secrets (or,
        for an agent that encrypts all, the whole value) sealed by the run's sealer
        (``Sealer.store_value``, whose docstring tells a new command how to use it)."""
        if self._sealer is None:
            return value, encode(value, what=what, max_depth=max_depth)
        return self._sealer.store_value(value, what=what, max_depth=max_depth)

    def _opened(self, value: Any) -> Any:
        """A stored value as the agent gets it: sealed parts opened."""
        if self._sealer is None:
            return value
        return self._sealer.open(value)
    def _invalidate(self, from_pos: int) -> int:
        """Forget what memory holds at top-level positions ``from_pos`` and later (an
        ``invalidated`` record: those commands run again); the highest position left."""
        for index in (self._history, self._done):
            for pos in [p for p in index if top(p) >= from_pos]:
                del index[pos]
        self._max_recorded = max((top(p) for p in (*self._history, *self._done)), default=-1)
        return self._max_recorded

    # -- what the agent can read ---------------------------------------------

    @property
    def object_id(self) -> str:
        """This object's id."""
        return self._context.object_id

    @property
    def intent(self) -> Intent:
        """The current intent (after any refinements)."""
        return self._intent

    @property
    def context(self) -> Context:
        """Identity, lineage and labels."""
        return self._context

    @property
    def epoch(self) -> int:
        """The fencing epoch this node holds the object with."""
        return self._journal.epoch

    @property
    def replaying(self) -> bool:
        """True while the agent is still re-running recorded commands."""
        return self._pos <= self._max_recorded

    # -- commands: each is a function of its module in engine/commands, bound here -----

    step = steps.step
    sleep = waits.sleep
    wait_for = waits.wait_for
    now = values.now
    uuid = values.uuid
    random = values.random
    progress = values.progress
    emit = emits.emit
    refine = intent_commands.refine  # (the module's name is taken: ``Run.intent``)
    patched = intent_commands.patched
    deprecate_patch = intent_commands.deprecate_patch
    delegate = lineage.delegate
    options = lineage.options
    join = lineage.join
    gather = lineage.gather
    model = model_command.model
    resource = resource_commands.resource
    holding = resource_commands.holding
    release = resource_commands.release
    checkpoint_resources = resource_commands.checkpoint_resources
    agent = agent_loop.agent
    on_update = updates.on_update
    _take_updates = updates.take_updates

    # -- the cursor: what every command does first -----------------------------

    def _boundary(self) -> None:
        if self.lease_lost:
            raise LeaseLostError(f"object {self.object_id!r}: lease lost")
        if self.cancel_requested or self._journal.cancel_seen:
            raise CancelRequestedError(f"object {self.object_id!r} was cancelled")
        deadline = self._intent.deadline
        if deadline is not None and self._clock() >= deadline:
            raise DeadlineExceeded(f"deadline {deadline} passed")
        if self.pause_requested:
            raise Suspend([], ready_at=self._clock(), status=Status.PAUSED, reason="paused")
        if self.release_requested:
            raise Suspend([], ready_at=self._clock(), status=Status.READY,
                          reason="node stopping")

    def next_position(self) -> str:
        """The position the agent's next command will take (``"7"``, or ``"5.1.0"`` in a
        gathered branch), without taking it: an adapter names what it is about to record
        (a model call whose tool calls follow) by it."""
        return str(self._key(consume=False))

    def _key(self, *, consume: bool = True) -> int | str:
        at = branch.get()
        if at is None:
            key: int | str = self._pos
            if consume:
                self._pos += 1
        else:
            key = f"{at.prefix}.{at.counter}"
            if consume:
                at.counter += 1
        return key

    def _recorded(self, pos: int | str) -> Sequence[Record]:
        """What memory holds for position ``pos`` (empty if nothing)."""
        recs = self._history.get(pos)
        if recs is not None:
            return recs
        rec = self._done.get(pos)
        return () if rec is None else (rec,)

    def _take(self, cmd: str, name: str | None) -> tuple[int | str, Sequence[Record]]:
        """The next position and what memory holds for it, which must be this command."""
        if not self._branched or branch.get() is None:  # the main line (``_key`` inline)
            pos: int | str = self._pos
            self._pos += 1
        else:
            pos = self._key()
        recs = self._recorded(pos)
        if not recs:
            return pos, ()
        first = recs[0].body
        rec_cmd, rec_name = first.get("cmd"), first.get("name")
        if rec_cmd != cmd or (name is not None and rec_name != name):
            raise Park(
                NonDeterminismError(
                    pos, f"{rec_cmd}({rec_name!r})", f"{cmd}({name!r})"
                )
            )
        return pos, recs

    def check_finished(self) -> None:
        """At the agent's end, memory must not hold commands the code no longer issues."""
        if self._pos <= self._max_recorded:
            last = max((p for p in (*self._history, *self._done)
                        if top(p) == self._max_recorded), key=str)
            first = self._recorded(last)[0].body
            raise Park(
                NonDeterminismError(
                    self._pos,
                    f"{first.get('cmd')}({first.get('name')!r}) at #{self._max_recorded}",
                    "the agent returning",
                )
            )
