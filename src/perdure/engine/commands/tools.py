"""``run.tool``: one tool call a model proposed, through the gate, a person if need be,
and then, only if authorised, run once as a recorded call.

A call takes one position (``cmd`` ``tool``) and its records follow each other there
(see ``perdure.core.bodies.tools``). The replay rule: a ``tool_result`` at the position
is the outcome, and nothing runs or is asked again; a proposal, a verdict or a person's
decision already recorded is taken as it is (the gate is not asked twice, so a policy
changed since does not rewrite what was decided). The execution rule, from where memory
stops:

1. record the proposal (tool, canonical arguments, hash, the model call) and the gate's
   verdict, in one commit;
2. denied: record the result ``denied`` with the reason (the model is told; nothing
   runs);
3. needs a person: look in the inbox for a decision on this proposal (an event
   ``perdure:approval`` sealed by the approving client); none yet: the object goes
   dormant (no process, no lease) until one arrives or the approval expires (which
   counts as rejected). A decision must name the arguments' hash the gate decided on
   and come from an identity the decision allows, else it is refused on record and the
   call keeps waiting. ``reject`` becomes the result; ``edit`` is a new proposal of the
   same tool (another tool cannot be named) that goes through the gate again, approved
   by the editor if the editor may approve it;
4. allowed or approved: a non-idempotent tool records ``tool_started`` first (after a
   crash the call is in doubt, never run twice); the tool runs with the call's
   idempotency key and its result (or failure) is recorded.

Sealing: for an agent that encrypts all, what a call says goes to memory sealed under
the object's data key (the proposal's arguments, the gate's reason, an edit, the result
and the error), and the arguments' hash is keyed under it (``args_digest``); the gate,
the checks of a decision and the tool itself work on the opened values, and replay reads
the run's records opened, so nothing runs or is asked again. For any agent, a
``perdure.Secret`` in a tool's result is sealed on its own, as a step's is: the agent
gets it back in ``ToolOutcome.result``, and the model is told ``[secret]`` in its place.
"""

from __future__ import annotations

import dataclasses
import json
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from perdure.core.bodies import (
    Dormant,
    ToolDecided,
    ToolGated,
    ToolProposed,
    ToolResult,
    ToolStarted,
)
from perdure.core.codec import decode, encode
from perdure.core.events import APPROVAL_EVENT
from perdure.core.gate import (
    ALLOW,
    APPROVAL,
    DENY,
    Facts,
    GateDecision,
    Policy,
    Proposal,
    approval_problem,
    args_digest,
    canonical_args,
    decide,
)
from perdure.core.records import Kind, Record, RecordDraft
from perdure.core.sealing import SHOWN, marked
from perdure.core.secret import Secret
from perdure.core.usage import usage_totals
from perdure.engine.commands.tool_approvals import take_decision
from perdure.engine.context import StepInfo
from perdure.engine.signals import Suspend
from perdure.errors import SerializationError
from perdure.tools import Tool

if TYPE_CHECKING:
    from perdure.engine.run import Run

__all__ = ["APPROVAL_EVENT", "ToolOutcome", "call_tool", "count_model_call", "proposal_id"]

_RAN = ("done", "failed", "in_doubt")


def proposal_id(pos: int | str, revision: int) -> str:
    """A proposal's id: its position and revision, ``"4:0"`` (``"4.1.0:1"`` in a gather)."""
    return f"{pos}:{revision}"


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """How a tool call ended: ``outcome`` (``done``, ``failed``, ``denied``,
    ``rejected``, ``expired`` or ``in_doubt``), the ``result`` of a call that ran, and
    ``error``, why it did not (what the model is told)."""

    proposal: str
    tool: str
    call_id: str
    outcome: str
    result: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the tool ran and returned."""
        return self.outcome == "done"

    def text(self) -> str:
        """The tool message the model gets: the result as text, or what happened."""
        if self.outcome == "done":
            return self.result if isinstance(self.result, str) else json.dumps(
                self.result, ensure_ascii=False, sort_keys=True, default=_unshown)
        return f"[{self.outcome}] {self.error or ''}".rstrip()


def _unshown(value: Any) -> str:
    """A ``Secret`` in a result, as the model is told it: ``[secret]`` (the value stays
    out of the conversation, which memory keeps)."""
    if isinstance(value, Secret):
        return SHOWN
    raise TypeError(f"{type(value).__name__} is not JSON")


@dataclass
class _Tally:
    """What the gate counts over one run: the calls let through, and the tokens and
    dollars of this object's model calls (those in memory when the run began, then each
    call the run records, ``count_model_call``)."""

    calls: list[tuple[str, float]]
    tokens: int
    cost: Decimal
    fresh_tokens: int = 0


_TALLIES: weakref.WeakKeyDictionary[Any, _Tally] = weakref.WeakKeyDictionary()


def tally(run: Run) -> _Tally:
    """The run's tally, read from memory the first time."""
    found = _TALLIES.get(run)
    if found is None:
        records = [rec for recs in run._history.values() for rec in recs]
        calls = [(str(rec.body["name"]), rec.ts) for rec in records
                 if rec.kind == Kind.TOOL_RESULT and rec.body.get("outcome") in _RAN]
        totals = usage_totals(records)
        found = _Tally(calls, totals.total_tokens, totals.cost)
        _TALLIES[run] = found
    return found


def count_model_call(run: Run, tokens: int, cost: Decimal | None) -> None:
    """Count a model call ``run`` just recorded against its policies' token and cost
    budgets (the memory the tally was read from did not hold it). An unknown cost adds
    nothing, as in ``usage_totals``."""
    found = tally(run)
    found.fresh_tokens += tokens
    if cost is not None:
        found.cost += cost


@dataclass
class _State:
    proposal: ToolProposed | None = None
    gated: ToolGated | None = None
    decided: ToolDecided | None = None
    started: bool = False
    dormant: bool = False
    result: ToolResult | None = None


def _state(recs: Sequence[Record]) -> _State:
    state = _State()
    for rec in recs:
        kind, body = rec.kind, rec.body
        if kind == Kind.TOOL_PROPOSED:
            state = _State(proposal=_proposed(body))
        elif kind == Kind.TOOL_GATED:
            state.gated = _gated(body)
        elif kind == Kind.TOOL_DECIDED:
            state.decided = _decided(body)
        elif kind == Kind.TOOL_STARTED:
            state.started = True
        elif kind == Kind.DORMANT:
            state.dormant = True
        elif kind == Kind.TOOL_RESULT:
            state.result = _result(body)
    return state


def _proposed(body: Mapping[str, Any]) -> ToolProposed:
    return ToolProposed(body["pos"], body["name"], body["proposal"], body["revision"],
                        body["call_id"], body["args"], body["args_hash"], body["model_call"],
                        body.get("edited_from"))


def _gated(body: Mapping[str, Any]) -> ToolGated:
    return ToolGated(body["pos"], body["name"], body["proposal"], body["args_hash"],
                     body["verdict"], body["reason"], body["policy"], body["rule"],
                     body["risk"], tuple(body.get("approvers", ())), body.get("expires_at"))


def _decided(body: Mapping[str, Any]) -> ToolDecided:
    return ToolDecided(body["pos"], body["name"], body["proposal"], body["args_hash"],
                       body["decision"], body["reason"], body["identity"], body["key"],
                       body.get("event_hash"), body.get("edit"), body.get("evidence"))


def _text(value: Any) -> str:
    """A text field of a record the run reads (opened already)."""
    return value if isinstance(value, str) else str(value)


def _seals_all(run: Run) -> bool:
    return run._sealer is not None and run._sealer.seal_all


def _kept(run: Run, text: str | None, what: str) -> Any:
    """A text of a tool call as memory keeps it: sealed for an agent that encrypts
    all, as it is otherwise."""
    if text is None or not _seals_all(run):
        return text
    return run._stored(text, what=what)[0]


def stored_decided(run: Run, decided: ToolDecided) -> ToolDecided:
    """A decision as memory keeps it (its edit sealed for an agent that encrypts all)."""
    if decided.edit is None or not _seals_all(run):
        return decided
    return dataclasses.replace(decided, edit=_kept(run, _text(decided.edit),
                                                   f"edit of tool call {decided.name!r}"))


def _result(body: Mapping[str, Any]) -> ToolResult:
    return ToolResult(body["pos"], body["name"], body["proposal"], body["outcome"],
                      body.get("result"), body.get("error"), body.get("latency"))


def _outcome(result: ToolResult, call_id: str) -> ToolOutcome:
    return ToolOutcome(result.proposal, result.name, call_id, result.outcome, result.result,
                       None if result.error is None else _text(result.error))


def _decision_of(gated: ToolGated) -> GateDecision:
    return GateDecision(gated.verdict, _text(gated.reason), gated.policy, gated.rule,
                        gated.approvers, gated.expires_at, gated.risk)


@dataclass
class _Call:
    """One call being carried forward at ``pos``: what to commit next, and events to
    mark consumed with it."""

    run: Run
    pos: int | str
    name: str
    call_id: str
    tool: Tool | None
    policy: Policy
    model_call: str
    drafts: list[RecordDraft] = field(default_factory=list)
    consumed: list[int] = field(default_factory=list)

    async def commit(self, *extra: RecordDraft) -> None:
        drafts = [*self.drafts, *extra]
        self.drafts = []
        consumed, self.consumed = self.consumed, []
        await self.run._journal.commit(drafts, consume_event_ids=consumed)

    async def end(self, proposal: str, outcome: str, error: str) -> ToolOutcome:
        result = ToolResult(self.pos, self.name, proposal, outcome, error=error)
        await self.commit(self.kept(result).draft())
        return _outcome(result, self.call_id)

    def kept(self, result: ToolResult) -> ToolResult:
        """A result as memory keeps it: its error sealed for an agent that encrypts
        all, else with the texts of the secrets the run met redacted."""
        if result.error is None:
            return result
        sealer = self.run._sealer
        if not _seals_all(self.run):
            return (result if sealer is None
                    else dataclasses.replace(result, error=sealer.redact(result.error)))
        return dataclasses.replace(result, error=_kept(
            self.run, _text(result.error), f"error of tool call {self.name!r}"))

    def propose(self, args: Any, args_json: str, revision: int, edited_from: str | None
                ) -> tuple[ToolProposed, GateDecision]:
        """Record a proposal and the gate's verdict on it (with the next commit)."""
        run = self.run
        pid = proposal_id(self.pos, revision)
        sealer = run._sealer if _seals_all(run) else None
        digest = args_digest(args_json, None if sealer is None
                             else sealer.data_key(create=True))
        proposed = ToolProposed(self.pos, self.name, pid, revision, self.call_id, args_json,
                                digest, self.model_call, edited_from)
        counted = tally(run)
        if not isinstance(args, dict):
            decision = GateDecision(DENY, "the arguments are not a JSON object",
                                    self.policy.ref)
        else:
            facts = Facts(agent=run.intent.agent, scope=run.context.trust_scope,
                          tool=self.tool.info if self.tool is not None else None,
                          now=run._clock(), calls=tuple(counted.calls),
                          tokens_used=counted.tokens + counted.fresh_tokens,
                          cost_used=counted.cost)
            decision = decide(Proposal(self.name, args, args_json, digest, self.call_id,
                                       self.model_call), self.policy, facts)
            if decision.verdict == ALLOW:  # a call let through counts against the caps
                counted.calls.append((self.name, facts.now))
        what = f"arguments of tool call {self.name!r}"
        kept = (proposed if sealer is None
                else dataclasses.replace(proposed, args=_kept(run, args_json, what)))
        self.drafts += [kept.draft(), ToolGated(
            self.pos, self.name, pid, digest, decision.verdict,
            _kept(run, decision.reason, f"the gate's reason on tool call {self.name!r}"),
            decision.policy, decision.rule, decision.risk, decision.approvers,
            decision.expires_at).draft()]
        return proposed, decision


def _arguments(text: str) -> tuple[Any, str]:
    """The model's argument text parsed, and its canonical JSON (the text as a JSON
    string when it is not a JSON object)."""
    try:
        args = json.loads(text or "{}")
    except ValueError:
        return None, encode(text).decode()
    if not isinstance(args, dict):
        return None, encode(args).decode()
    try:
        return args, canonical_args(args)
    except SerializationError:
        return None, encode(text).decode()


async def call_tool(run: Run, name: str, arguments: str, call_id: str,
                    tools: Mapping[str, Tool], policy: Policy, *, model_call: str = ""
                    ) -> ToolOutcome:
    """Carry the model's call of tool ``name`` with ``arguments`` (the JSON text the model
    wrote) as far as it can go now (see the module); its outcome, or ``Suspend`` while a
    person has not decided."""
    pos, recs = run._take("tool", name)
    state = _state(recs)
    if state.result is not None:
        return _outcome(state.result, call_id)
    run._boundary()
    call = _Call(run, pos, name, call_id, tools.get(name), policy, model_call)
    if state.proposal is None or state.gated is None:
        args, text = _arguments(arguments)
        proposal, decision = call.propose(args, text, 0, None)
        state = _State(proposal=proposal)
    else:
        proposal, decision = state.proposal, _decision_of(state.gated)
    decided = state.decided
    while True:
        if decision.verdict == DENY:
            return await call.end(proposal.proposal, "denied",
                                  f"denied by policy {decision.policy}: {decision.reason}; "
                                  "the call did not run")
        if decision.verdict == APPROVAL and decided is None:
            decided = await take_decision(run, call, proposal, decision)
            if decided is None:
                return await _wait(call, proposal, decision, state.dormant)
            call.drafts.append(stored_decided(run, decided).draft())
            if decided.decision == "approve":  # let through by a person: counted too
                tally(run).calls.append((name, run._clock()))
            if decided.decision == "reject":
                return await call.end(proposal.proposal, "rejected",
                                      f"rejected by {decided.identity}: {decided.reason}; "
                                      "the call did not run")
            if decided.decision == "edit":
                edit = decode(_text(decided.edit).encode())
                proposal, decision = call.propose(edit, _text(decided.edit),
                                                  proposal.revision + 1, proposal.proposal)
                state = _State(proposal=proposal)
                editor = decided
                decided = None
                if decision.verdict == APPROVAL and approval_problem(
                        decision, proposal.args_hash, proposal.args_hash,
                        editor.identity) is None:
                    decided = ToolDecided(pos, name, proposal.proposal, proposal.args_hash,
                                          "approve", "approved with the edit",
                                          editor.identity, editor.key, editor.event_hash,
                                          evidence=editor.evidence)
                    call.drafts.append(decided.draft())
                    tally(run).calls.append((name, run._clock()))
                continue
        break
    return await _execute(call, proposal, state.started)


async def _wait(call: _Call, proposal: ToolProposed, decision: GateDecision,
                dormant: bool) -> ToolOutcome:
    """No decision yet: expire the proposal if its deadline passed, else go dormant."""
    run = call.run
    expires = decision.expires_at
    if expires is not None and run._clock() >= expires:
        call.drafts.append(ToolDecided(call.pos, call.name, proposal.proposal,
                                       proposal.args_hash, "expire",
                                       "no decision before the deadline", "", "").draft())
        return await call.end(proposal.proposal, "expired",
                              "nobody approved the call before its deadline; it counts as "
                              "rejected and did not run")
    if not dormant:
        call.drafts.append(Dormant.approval(call.pos, call.name, APPROVAL_EVENT,
                                            expires).draft())
    raise Suspend(call.drafts, ready_at=expires, waiting_event=APPROVAL_EVENT,
                  consume_event_ids=call.consumed,
                  reason=f"tool {call.name!r} waits for a person to approve proposal "
                         f"{proposal.proposal}",
                  note=f"approval needed: {call.name} ({proposal.proposal})")


async def _execute(call: _Call, proposal: ToolProposed, started: bool) -> ToolOutcome:
    """Run an authorised call once (in doubt if a non-idempotent one started before)."""
    run, tool = call.run, call.tool
    pid = proposal.proposal
    if started:
        return await call.end(pid, "in_doubt",
                              "the call started but its worker was lost before it "
                              "finished; it may or may not have taken effect and was not "
                              "run again")
    if tool is None:  # an allow for a tool this worker does not have (not registered here)
        return await call.end(pid, "failed", f"tool {call.name!r} is not registered here")
    key = f"{run.object_id}/tool/{pid}"
    if not tool.idempotent:
        call.drafts.append(ToolStarted(call.pos, call.name, pid, key).draft())
    if call.drafts:
        await call.commit()
    args = decode(_text(proposal.args).encode())
    info = StepInfo(run.object_id, call.name, call.pos, 1, key, run.epoch)
    began = time.perf_counter()
    kept: ToolResult | None = None
    try:
        value = await run._step_executor(info, tool.fn, (), tool.arguments(args, key))
        data = run._stored(value, what=f"result of tool {call.name!r}")[1]
    except Exception as exc:  # noqa: BLE001 - recorded: the model is told it failed
        latency = round(time.perf_counter() - began, 6)
        result = ToolResult(call.pos, call.name, pid, "failed",
                            error=f"{type(exc).__name__}: {exc}", latency=latency)
    else:
        latency = round(time.perf_counter() - began, 6)
        recorded = decode(data)  # canonical: what replay gets back
        result = ToolResult(call.pos, call.name, pid, "done",
                            run._opened(recorded) if marked(data) else recorded,
                            latency=latency)
        kept = dataclasses.replace(result, result=recorded)
    await call.commit(call.kept(kept or result).draft())
    return _outcome(result, call.call_id)
