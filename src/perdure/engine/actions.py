"""The six actions a cycle can select, as a table of handlers: ``HANDLERS[action]``.

Each handler performs its action on a claimed object and returns the records it
appended when the object stays with this node to be evaluated again (mutate,
delegate), or ``None`` once the node has let the object go (execute and reentry,
which run the agent; dormancy; terminate). Handlers decide from the decision's typed
fields (``status``, ``wake_at``), never from its words.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from perdure.core.bodies import IntentRefined, Nondeterminism, Parked, Progress, Terminated
from perdure.core.codec import decode
from perdure.core.cycle import Action, Decision, MemoryFacts, ReasonCode
from perdure.core.events import ACTION_NOTE, DEBOUNCED_START, REFINE_EVENT
from perdure.core.gc import gc_paused
from perdure.core.intent import Context, Intent
from perdure.core.lifecycle import Phase, Status
from perdure.core.questions import waiting_note
from perdure.core.records import Kind, Record, RecordDraft
from perdure.engine.budget_wake import wake_stopped
from perdure.engine.commands.step_failures import cannot_do, node_problem
from perdure.engine.ending import finish, finish_failed, park
from perdure.engine.invoke import invoke, served
from perdure.engine.journal import Journal, StoreUnavailable
from perdure.engine.leases import refresh_flags
from perdure.engine.lineage import fold_children, spawn
from perdure.engine.memory import event_refusal, pending_events
from perdure.engine.node import Node
from perdure.engine.opening import opened_memory
from perdure.engine.run import CHILD_EVENT, DeadlineExceeded, Park, Run, Suspend
from perdure.errors import (
    CancelRequestedError,
    CannotDo,
    LeaseLostError,
    NonDeterminismError,
    SerializationError,
    StoreError,
)
from perdure.hooks import ObjectDormant, ObjectWoke
from perdure.keys.sealer import Sealer
from perdure.stores.base import Claim, Event

__all__ = ["HANDLERS", "Handler", "by_deadline"]

log = logging.getLogger("perdure.worker")


#: ``handler(node, claim, records, decision, facts, events)``: the records it appended
#: if the object is to be evaluated again, or ``None`` once the node let it go.
Handler = Callable[[Node, Claim, list[Record], Decision, MemoryFacts, list[Event]],
                   Awaitable[list[Record] | None]]


def by_deadline(ready_at: float | None, deadline: float | None) -> float | None:
    """When a dormant object must be looked at again: no later than its deadline."""
    if deadline is None:
        return ready_at
    return deadline if ready_at is None else min(ready_at, deadline)


# -- execute and reentry: run the agent ----------------------------------------------


async def execute(node: Node, claim: Claim, records: list[Record], decision: Decision,
                  facts: MemoryFacts, events: list[Event]) -> None:
    """Run the agent against its memory (first run and reentry alike) and record how
    it stopped: ended, dormant, parked."""
    oid = claim.object_id
    intent: Intent = facts.intent
    agent = served(node.agents, intent)
    if agent is None:
        await _not_served(node, claim, intent)
        return None
    journal = node.journal(claim, records)
    if claim.crashes > node.policy.max_crashes:
        # Even replaying killed its workers (the agent's own code between steps):
        # park without running anything.
        reason = (f"the worker died {claim.crashes} times in a row while running this "
                  f"object after record #{records[-1].seq}; fix the cause, then run "
                  f"`perdure resume {oid}`")
        await park(journal, RuntimeError(reason),
                   Parked(reason, "worker_died", claim.crashes).draft())
        return None
    got = await opened_memory(node, claim, journal, records, facts, events, agent)
    if got is None:  # this node cannot open its memory: let go or parked, with why
        return None
    sealer, memory, facts = got
    run = _new_run(node, claim, journal, memory, facts, events, sealer)
    if node.hooks.active and facts.dormancy is not None:
        waited = facts.dormancy
        late = None if waited.wake_at is None else max(0.0, node.clock() - waited.wake_at)
        node.hooks.emit(ObjectWoke(node.signer.node_id, oid, waited.reason, late))
    active = node.active.get(oid)
    if active is not None:
        active.run = run
    try:
        try:
            result = await invoke(agent, run, node.code_pool)
        except (CannotDo, ModuleNotFoundError) as exc:  # this node's problem, not the object's
            cannot_do(run, f"agent {intent.agent}", run._pos, node_problem(exc) or str(exc))
        try:
            _, result_bytes = run._stored(result, what=f"result of agent {intent.agent!r}")
        except SerializationError as exc:
            await finish_failed(node, journal, records, exc)
            return None
        await finish(node, journal, records, Terminated.completed(decode(result_bytes)),
                     status=Status.COMPLETED, result=result_bytes)
    except Suspend as sus:
        await journal.commit(sus.drafts, status=Status(sus.status), phase=Phase.DORMANCY,
                             ready_at=by_deadline(sus.ready_at, run.intent.deadline),
                             running=False, waiting_event=sus.waiting_event, release=True,
                             consume_event_ids=sus.consume_event_ids,
                             requires=sus.requires,
                             # This process: restarted (its setting fixed), it tries again.
                             avoid_node=node.owner if sus.avoid_node else None,
                             note=sus.note)
        if node.hooks.active:
            node.hooks.emit(ObjectDormant(node.signer.node_id, oid, _suspended_for(sus),
                                          sus.ready_at))
    except Park as parking:
        err = parking.error
        record = parking.record
        if record is None and isinstance(err, NonDeterminismError):
            log.error("parked %s: %s", oid, err, extra={"action": "parked_nondeterminism"})
            record = Nondeterminism(str(err), err.position, err.recorded, err.found,
                                    agent.version).draft()
        await park(journal, err, record)
    except CancelRequestedError:
        await finish(node, journal, records, Terminated.cancelled("cancelled"),
                     status=Status.CANCELLED)
    except DeadlineExceeded as exc:
        await finish(node, journal, records, Terminated.failed(
            "deadline passed", {"type": "perdure:DeadlineExceeded", "message": str(exc)}),
            status=Status.FAILED)
    except (LeaseLostError, StoreUnavailable, asyncio.CancelledError):
        raise
    except Exception as exc:  # noqa: BLE001 - the agent's own failure ends the object
        await finish_failed(node, journal, records, exc)
    return None


async def _not_served(node: Node, claim: Claim, intent: Intent) -> None:
    """This node does not serve the agent version the object needs: leave it for one
    that does (a claim routes by version; this is a node whose agents changed)."""
    agent = node.agents.get(intent.agent)
    served_as = "not registered" if agent is None else f"served at version {agent.version}"
    log.warning("%s needs agent %s@%s, %s on this node; leaving it", claim.object_id,
                intent.agent, intent.version, served_as, extra={"action": "unknown_agent"})
    await node.release(
        claim, ready_at=node.clock() + node.settings.unknown_agent_retry, status=Status.READY,
        note=f"agent {intent.agent}@{intent.version} is {served_as} on node "
             f"{node.signer.node_id}",
    )


def _new_run(node: Node, claim: Claim, journal: Journal, records: list[Record],
             facts: MemoryFacts, events: list[Event], sealer: Sealer | None = None) -> Run:
    """The run of this claim: memory indexed, the inbox read at the claim handed on."""
    oid = claim.object_id

    async def load_events() -> list[Event]:
        try:
            return list(await node.read(pending_events, node, oid))
        except StoreError as exc:  # not the agent's failure: abandon the run, retry later
            raise StoreUnavailable(exc) from exc

    run: Run

    async def flags() -> None:
        await refresh_flags(node, run, claim.epoch)

    async def spawn_child(agent: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                          child_id: str, parent: Context, start_at: float | None) -> str:
        return await spawn(node, agent, args, kwargs, child_id, parent, start_at)

    async def cancel_child(child_id: str) -> None:
        now = node.clock()
        await node.write(lambda: node.store.control(child_id, now, cancel=True))

    async def lineage_budgets() -> list[Any]:
        from perdure.engine.commands.model_budget import lineage_budgets as gather

        try:
            found: list[Any] = await node.read(gather, node.store, facts.context)
        except StoreError as exc:  # not the agent's failure: abandon the run, retry later
            raise StoreUnavailable(exc) from exc
        return found

    with gc_paused():  # it indexes every record: as many new lists on a long history
        run = Run(journal=journal, intent=facts.intent, context=facts.context, records=records,
                  load_events=load_events, pending_events=events,
                  step_executor=node.run_step, clock=node.clock,
                  spawn=spawn_child, cancel=cancel_child, capabilities=node.capabilities,
                  check_event=node.verifier.check_event, refresh_flags=flags,
                  crashes=claim.crashes, max_crashes=node.policy.max_crashes,
                  model_prices=node.settings.model_prices, lineage_budgets=lineage_budgets,
                  sealer=sealer, quotas=node.quotas)
    run.cancel_requested = claim.cancel_requested
    return run


# -- mutate and delegate: fold the inbox into memory ---------------------------------


async def mutate(node: Node, claim: Claim, records: list[Record], decision: Decision,
                 facts: MemoryFacts, events: list[Event]) -> list[Record]:
    """Mutation phase: apply the pending intent refinements."""
    refinements = [e for e in events if e.name == REFINE_EVENT]
    journal = node.journal(claim, records)
    return await _folding(node, claim, records, _refine(node, journal, facts, refinements))


async def delegate(node: Node, claim: Claim, records: list[Record], decision: Decision,
                   facts: MemoryFacts, events: list[Event]) -> list[Record]:
    """Delegation phase: fold the children's terminal signals into memory."""
    signals = [e for e in events if e.name == CHILD_EVENT]
    journal = node.journal(claim, records)
    return await _folding(node, claim, records,
                          fold_children(node, journal, records, signals))


async def _folding(node: Node, claim: Claim, records: list[Record],
                   fold: Awaitable[list[Record]]) -> list[Record]:
    """The records ``fold`` appended (all that follow ``records`` if a cancel came)."""
    try:
        return await fold
    except CancelRequestedError:  # written; the next evaluation sees the cancel
        appended: list[Record] = await node.read(node.store.chain, claim.object_id,
                                                 records[-1].seq, records[-1].hash)
        return appended


async def _refine(node: Node, journal: Journal, facts: MemoryFacts,
                  refinements: list[Event]) -> list[Record]:
    intent = facts.intent
    drafts: list[RecordDraft] = []
    for event in refinements:
        digest, refused = event_refusal(node, event)
        if refused is not None:
            drafts.append(refused)
            continue
        try:
            changes = decode(event.payload)
            if isinstance(changes, dict) and set(changes) == {ACTION_NOTE}:
                # Who acted on the object from outside (a dashboard user), in its memory.
                drafts.append(Progress({"operator_action": changes[ACTION_NOTE],
                                        "event_id": event.event_id,
                                        "event_hash": digest}).draft())
                continue
            if isinstance(changes, dict) and set(changes) == {DEBOUNCED_START}:
                # A later start collapsed into this object: taken only before it ran
                # (the store refuses the event once a node claimed it; this is the rule).
                if facts.executed:
                    raise ValueError("a debounced start came after the object started")
                intent = intent.debounced(dict(changes[DEBOUNCED_START]))
            else:
                intent = intent.refined(dict(changes))
            # A seal that verifies always gives a digest (``check_event``).
            assert digest is not None
            drafts.append(IntentRefined(intent, changes, event_id=event.event_id,
                                        event_hash=digest).draft())
        except (ValueError, TypeError) as exc:
            drafts.append(Progress({"refinement_rejected": str(exc),
                                    "event_id": event.event_id}).draft())
    # A refined ``requires`` must reach the row too: claims route by it.
    routed = any(d.kind == Kind.INTENT_REFINED and "requires" in d.body["changes"]
                 for d in drafts)
    appended: list[Record] = await journal.commit(
        drafts, phase=Phase.MUTATION, consume_event_ids=[e.event_id for e in refinements],
        requires=tuple(intent.requires) if routed else None)
    if any(d.kind == Kind.INTENT_REFINED and "budget" in d.body["changes"] for d in drafts):
        await wake_stopped(node, facts.context.object_id)  # its lineage may go on
    return appended


# -- dormancy and terminate: let the object go ---------------------------------------


async def dormancy(node: Node, claim: Claim, records: list[Record], decision: Decision,
                   facts: MemoryFacts, events: list[Event]) -> None:
    """Nothing to do now: let the object go, ready again when the decision's status says."""
    status = decision.status
    if status is Status.PAUSED:
        ready_at: float | None = node.clock()
    elif status is Status.PARKED:
        ready_at = None
    elif status is Status.READY:  # not for this node: ready again later, for any node
        ready_at = node.clock() + node.settings.unknown_agent_retry
    else:
        ready_at = by_deadline(decision.wake_at, facts.intent.deadline)
    event = facts.dormancy.event if facts.dormancy is not None else None
    # Still waiting for what it went dormant for (woken by a control event, say): the
    # row says again what it waits for (the questions it asks, the approvals), from memory.
    note = waiting_note(records) if status in (Status.DORMANT, Status.PAUSED) else None
    if decision.code is ReasonCode.NOT_STARTED:
        note = decision.reason  # "waits to start at ..."
    journal = node.journal(claim, records)
    await journal.commit([], status=status, phase=Phase.DORMANCY, ready_at=ready_at,
                         running=False, waiting_event=event, release=True,
                         parked=status is Status.PARKED, note=note)
    if node.hooks.active:
        node.hooks.emit(ObjectDormant(node.signer.node_id, claim.object_id,
                                      decision.code.value, ready_at))
    return None


def _suspended_for(sus: Suspend) -> str:
    """What a suspended agent waits for, from its dormancy record (``sleep``, ``event``,
    ``retry``, ``budget``, ``children``, ``gather``)."""
    for draft in sus.drafts:
        if draft.kind == Kind.DORMANT:
            return str(draft.body.get("reason", "waiting"))
    return "event" if sus.waiting_event else "waiting"


async def terminate(node: Node, claim: Claim, records: list[Record], decision: Decision,
                    facts: MemoryFacts, events: list[Event]) -> None:
    """Write the terminal record the decision names (or just let go if memory has it)."""
    outcome = decision.status  # a terminate decision's status is its outcome
    if facts.terminated is not None:
        await node.release(claim, ready_at=None, status=outcome, phase=Phase.TERMINATION)
        return None
    # A terminate decision ends an object failed or cancelled, never completed.
    body = (Terminated.cancelled(decision.reason) if outcome is Status.CANCELLED else
            Terminated(outcome.value, reason=decision.reason,
                       error={"type": "perdure:Terminated", "message": decision.reason}))
    journal = node.journal(claim, records)
    await finish(node, journal, records, body, status=outcome)
    return None


HANDLERS: dict[Action, Handler] = {
    Action.EXECUTE: execute,
    Action.REENTRY: execute,
    Action.MUTATE: mutate,
    Action.DELEGATE: delegate,
    Action.DORMANCY: dormancy,
    Action.TERMINATE: terminate,
}
