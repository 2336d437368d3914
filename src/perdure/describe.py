"""Objects and their memory in words: one renderer for the CLI, the demo and a dashboard.

Everything here reads what the store says about an object (``ObjectInfo``) and its
memory through typed bodies (``perdure.core.bodies``), and returns plain text; styles
are names (``"green"``, ``"bold"``) the caller may apply. Laying the text out at a
terminal's width is the caller's business (the CLI does it with rich).

- ``describe(record)``: one record in words, and whether it is shown whole; the "what"
  column of ``perdure show``. ``timeline(records)`` is the whole table.
- ``usage(totals)``: what an object's model calls used and cost, in words (the
  ledger line of ``perdure show``; ``perdure.core.usage`` totals memory).
- ``failure(records)``: why a failed object failed (``Type: message``, or the reason).
- ``waiting_note(info, nodes)``: why a runnable object waits (no live node serves it).
- ``waiting_for(info)``: what a dormant object asks for before it goes on.
- ``headline(info)``, ``object_parts(info)``, ``listing_row(info)``: an object on one
  line, as ``perdure show``, ``tree`` and ``ls`` print it.
- ``lineage(root, children_of)``: the tree of an object's descendants.
- ``Narrator``: memory told as a story, a line per record, as ``perdure demo`` follows
  its object; subclass it to tell a domain's values in its own words.

A record whose body cannot be decoded is described as such, never guessed at.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, NamedTuple

from perdure.core.bodies import (
    JSON,
    Body,
    Dormant,
    Emitted,
    EventReceived,
    EventRefused,
    Instantiated,
    IntentRefined,
    ModelCall,
    ModelChunks,
    ModelFailed,
    ModelRecovered,
    ModelStarted,
    Nondeterminism,
    Progress,
    StepDone,
    StepFailed,
    StepInDoubt,
    StepStarted,
    Terminated,
    ToolDecided,
    ToolGated,
    ToolProposed,
    ToolResult,
    ToolStarted,
    Woke,
    decode,
)
from perdure.core.bodies.tools import DECIDED
from perdure.core.lifecycle import Status
from perdure.core.questions import asking_note
from perdure.core.questions import question_text as question
from perdure.core.records import Kind, Record
from perdure.core.sealing import SEALED, sealed_shown
from perdure.core.usage import UsageTotals, decimal_text
from perdure.errors import RecordDecodeError
from perdure.info import ObjectInfo
from perdure.resources.lines import RESOURCE_LINES
from perdure.stores.base import NodeInfo

__all__ = [
    "ARGS_SHOWN",
    "LISTING_COLUMNS",
    "STATUS_STYLE",
    "LedgerRow",
    "Line",
    "Narrator",
    "Segment",
    "TimelineRow",
    "TreeLine",
    "clip",
    "describe",
    "failure",
    "headline",
    "lineage",
    "listing_row",
    "model_ledger",
    "object_parts",
    "origin",
    "question",
    "refused",
    "refused_while_waiting",
    "restores",
    "short_type",
    "timeline",
    "tool_trail",
    "troubled",
    "usage",
    "waiting_for",
    "waiting_note",
    "when",
]

STATUS_STYLE: Mapping[str, str] = {
    "completed": "green", "failed": "red", "cancelled": "yellow", "parked": "bold red",
    "running": "cyan", "dormant": "blue", "paused": "magenta", "ready": "white",
}
"""The style each status is shown in."""

ARGS_SHOWN = 300
"""Characters of an intent's arguments shown before "…" (``--json`` has them all)."""

LISTING_COLUMNS = ("id", "agent", "status", "phase", "records", "epoch", "updated")
"""The columns of ``perdure ls``, in the order of ``listing_row``."""

Segment = tuple[str, str]
"""A piece of a line and the style it is shown in (``""``: none)."""


def when(ts: float | None) -> str:
    """A time as ``YYYY-MM-DD HH:MM:SS`` in local time; ``-`` for none."""
    if ts is None:
        return "-"
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def short_type(error_type: object) -> str:
    """``builtins:ValueError`` -> ``ValueError``: the name a person knows the error by."""
    return str(error_type).rpartition(":")[2]


def _json(value: JSON) -> str:
    return json.dumps(sealed_shown(value), sort_keys=True)


def _json_text(value: JSON, cap: int) -> str:
    text = json.dumps(sealed_shown(value), ensure_ascii=False, sort_keys=True)
    return text if len(text) <= cap else text[: cap - 1] + "…"


# -- one record in words: the "what" of ``perdure show`` ------------------------------------


def clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, the cut marked with an ellipsis."""
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


_TROUBLE = frozenset({Kind.STEP_FAILED, Kind.STEP_IN_DOUBT, Kind.MODEL_FAILED,
                      Kind.NONDETERMINISM, Kind.EVENT_REFUSED})


def troubled(record: Record) -> bool:
    """Whether ``record`` tells of something that went wrong (a failure, a step in doubt,
    divergence, a refused event, an object that ended failed): what displays draw in the
    error colour."""
    if record.kind in _TROUBLE:
        return True
    if record.kind == Kind.TERMINATED:
        return record.body.get("outcome") == "failed"
    return False


class Line(NamedTuple):
    """A record in words; ``whole`` when it is shown whole (wrapped) rather than cut to
    one line: the intent and anything that says why something failed."""

    text: str
    whole: bool


def _instantiated(body: Instantiated) -> Line:
    intent = body.intent
    return Line(f"{intent.agent}@{intent.version} "
                f"args={_json_text(list(intent.args), ARGS_SHOWN)} "
                f"kwargs={_json_text(intent.kwargs, ARGS_SHOWN)}", True)


def _step(body: StepStarted | StepDone | StepFailed | StepInDoubt) -> Line:
    attempt = "-" if isinstance(body, StepInDoubt) else body.attempt
    text = f"#{body.pos} {body.name} attempt {attempt}"
    if isinstance(body, StepDone):
        text += f" -> {clip(_json(body.result), 80)} ({body.latency:.4f}s)"
    if isinstance(body, StepFailed):
        text += (f" {body.error.get('type')}: {body.error.get('message')} "
                 f"[{body.error_class}]")
        text += " final" if body.final else f" retry at {when(body.retry_at)}"
    return Line(text, isinstance(body, StepFailed | StepInDoubt))


def _dormant(body: Dormant) -> Line:
    until = f" until {when(body.wake_at)}" if body.wake_at is not None else ""
    if body.event and body.cmd == "wait" and (body.prompt is not None or body.choices):
        return Line(f"#{body.pos} {asking_note(body.event, body.prompt, body.choices)}{until}",
                    False)
    if body.event:
        return Line(f"#{body.pos} waiting for event {body.event!r}{until}", False)
    return Line(f"#{body.pos} {body.reason}{until}", True)


def _emitted(body: Emitted) -> Line:
    return Line(f"#{body.pos} emitted {body.name!r} {_json_text(body.data, 200)}", False)


def _woke(body: Woke) -> Line:
    return Line(f"#{body.pos} timer due", False)


def _event(body: EventReceived) -> Line:
    return Line(f"#{body.pos} {body.name} = {clip(_json(body.payload), 80)}", False)


def _terminated(body: Terminated) -> Line:
    if body.outcome == "completed":
        return Line(f"completed: {clip(_json(body.result), 100)}", False)
    why = _why(body)
    return Line(f"{body.outcome}: {why}" if why else body.outcome, True)


def _refined(body: IntentRefined) -> Line:
    return Line(f"intent v{body.intent.version_no}: {_json(body.changes)}", True)


def _nondeterminism(body: Nondeterminism) -> Line:
    return Line(body.reason, True)


def _progress(body: Progress) -> Line:
    acted = body.fields.get("operator_action")
    if isinstance(acted, dict):  # who acted on the object from outside (the dashboard)
        details = {k: v for k, v in acted.items()
                   if k not in ("action", "by", "role", "method", "via", "at")}
        extra = f" {_json(details)}" if details else ""
        return Line(f"{acted.get('action')} by {acted.get('by')} ({acted.get('role')}, "
                    f"{acted.get('method')}) via {acted.get('via')}{extra}", False)
    return Line(_json(body.fields), False)


def _dollars(cost: Decimal) -> str:
    """An exact cost without trailing zeros: ``0.0025``, ``0``."""
    return decimal_text(cost.normalize())


def _tokens(usage: Mapping[str, Any]) -> str:
    cached = usage.get("cached_input_tokens")
    text = f"{usage.get('input_tokens', 0)} in"
    if cached:
        text += f" ({cached} cached)"
    return f"{text} + {usage.get('output_tokens', 0)} out"


def _model_call(body: ModelCall) -> Line:
    reply = body.reply
    cost = f"${_dollars(Decimal(body.cost))}" if body.cost is not None else "cost unknown"
    what = f"{len(reply.get('tool_calls', ()))} tool call(s) proposed" if reply.get(
        "tool_calls") else f"finish {reply.get('finish_reason')}"
    text = (f"#{body.pos} {body.name} via {body.provider} attempt {body.attempt}: {what}, "
            f"{_tokens(reply.get('usage', {}))} tokens, {cost}, "
            f"{float(reply.get('latency', 0.0)):.3f}s")
    for skipped in body.skipped:
        text += f"; skipped client {skipped.get('client')}: {skipped.get('reason')}"
    if body.recovery is not None:
        text += f"; stream recovered: {body.recovery.get('recovery')}"
    return Line(text, bool(body.skipped))


def _model_failed(body: ModelFailed) -> Line:
    failure = body.failure
    text = (f"#{body.pos} {body.name} via {body.provider} attempt {body.attempt}: "
            f"{failure.get('reason')} [{failure.get('kind')}]")
    text += " final" if body.final else (
        f" client rests until {when(body.until)}" if body.until is not None else
        " client gave up")
    return Line(text, True)


def _model_chunks(body: ModelChunks) -> Line:
    chars = sum(len(str(c.get("text", ""))) for c in body.chunks)
    last = body.start + len(body.chunks) - 1
    size = "sealed" if any(SEALED in c for c in body.chunks) else f"{chars} chars"
    return Line(f"#{body.pos} {body.name} attempt {body.attempt} stream chunks "
                f"{body.start}-{last} ({size})", False)


def _model_recovered(body: ModelRecovered) -> Line:
    return Line(f"#{body.pos} {body.name} attempt {body.attempt}: {body.recovery} "
                f"(policy {body.policy}) after {body.chunks} chunk(s), {body.chars} chars: "
                f"{body.reason}", True)


def _model_started(body: ModelStarted) -> Line:
    return Line(f"#{body.pos} {body.name} attempt {body.attempt}: stateful request sent "
                f"to client {body.client} (in doubt if no outcome follows)", False)


def _said(text: Any) -> str:
    """A text of a tool call's record (``<sealed>`` for an agent that encrypts all)."""
    shown = sealed_shown(text)
    return shown if isinstance(shown, str) else json.dumps(shown, sort_keys=True)


def _tool_proposed(body: ToolProposed) -> Line:
    edit = f" (edit of {body.edited_from})" if body.edited_from else ""
    return Line(f"#{body.pos} proposal {body.proposal} {body.name}("
                f"{clip(_said(body.args), ARGS_SHOWN)}) args {body.args_hash[:12]} from model call "
                f"#{body.model_call}{edit}", False)


def _tool_gated(body: ToolGated) -> Line:
    who = f" by {', '.join(body.approvers)}" if body.approvers else ""
    until = f" until {when(body.expires_at)}" if body.expires_at is not None else ""
    verdict = {"allow": "allowed", "deny": "DENIED",
               "approval": f"needs approval{who}{until}"}.get(body.verdict, body.verdict)
    return Line(f"#{body.pos} proposal {body.proposal} {body.name} {verdict}: "
                f"{_said(body.reason)} "
                f"[policy {body.policy}, rule {body.rule or '-'}, risk {body.risk}]",
                body.verdict != "allow")


def _tool_decided(body: ToolDecided) -> Line:
    if body.decision == "expire":
        return Line(f"#{body.pos} proposal {body.proposal} {body.name} expired: "
                    f"{body.reason}", True)
    edit = f" -> {clip(_said(body.edit), ARGS_SHOWN)}" if body.edit else ""
    reason = f": {body.reason}" if body.reason else ""
    return Line(f"#{body.pos} proposal {body.proposal} {body.name} {DECIDED[body.decision]} by "
                f"{body.identity} (key {body.key[:16]}){edit}{reason}", True)


def _tool_started(body: ToolStarted) -> Line:
    return Line(f"#{body.pos} proposal {body.proposal} {body.name} started (key {body.key})",
                False)


def _tool_result(body: ToolResult) -> Line:
    took = f" ({body.latency:.4f}s)" if body.latency is not None else ""
    if body.outcome == "done":
        return Line(f"#{body.pos} {body.name} -> {clip(_json(body.result), 80)}{took}", False)
    return Line(f"#{body.pos} {body.name} {body.outcome}: {_said(body.error)}{took}", True)


_DESCRIBE: dict[type[Body], Callable[[Any], Line]] = {
    Instantiated: _instantiated,
    StepStarted: _step, StepDone: _step, StepFailed: _step, StepInDoubt: _step,
    Dormant: _dormant,
    Woke: _woke,
    EventReceived: _event,
    Terminated: _terminated,
    IntentRefined: _refined,
    Nondeterminism: _nondeterminism,
    Progress: _progress,
    Emitted: _emitted,
    ModelCall: _model_call,
    ModelFailed: _model_failed,
    ModelChunks: _model_chunks,
    ModelRecovered: _model_recovered,
    ModelStarted: _model_started,
    ToolProposed: _tool_proposed, ToolGated: _tool_gated, ToolDecided: _tool_decided,
    ToolStarted: _tool_started, ToolResult: _tool_result,
}


def _resource_line(say: Callable[[Any], tuple[str, bool]]) -> Callable[[Any], Line]:
    return lambda body: Line(*say(body))


_DESCRIBE.update({cls: _resource_line(say) for cls, say in RESOURCE_LINES.items()})


def _event_refused(body: EventRefused) -> Line:
    """A refused event, whole: the reason is what the sender needs to read."""
    return Line(f"refused event {body.name!r} (#{body.event_id}): {body.reason}", True)


_DESCRIBE[EventRefused] = _event_refused


def describe(record: Record) -> Line:
    """``record`` in words; other kinds than those with words of their own show their
    body's JSON, cut short. A body that cannot be decoded says so (and is whole)."""
    try:
        body = decode(record)
    except RecordDecodeError as exc:
        return Line(f"cannot be decoded: {exc.reason}", True)
    handler = _DESCRIBE.get(type(body))
    if handler is None:
        return Line(clip(_json(body.encode()), 100), False)
    return handler(body)


class TimelineRow(NamedTuple):
    """One row of ``perdure show``'s memory table."""

    seq: str
    time: str  # HH:MM:SS, local time
    node: str
    kind: str
    what: str
    whole: bool


def timeline(records: Sequence[Record]) -> list[TimelineRow]:
    """The memory timeline of an object, one row per record."""
    return [TimelineRow(str(rec.seq), when(rec.ts)[11:], rec.node_id, str(rec.kind),
                        *describe(rec)) for rec in records]


_TOOL_KINDS = frozenset({Kind.TOOL_PROPOSED, Kind.TOOL_GATED, Kind.TOOL_DECIDED,
                         Kind.TOOL_STARTED, Kind.TOOL_RESULT})


def tool_trail(records: Sequence[Record]) -> list[TimelineRow]:
    """The tool calls in memory, record by record: each proposal, the gate's verdict
    (policy, rule, risk, who may approve), who decided (identity and key) and how the
    call ended."""
    return timeline([r for r in records if r.kind in _TOOL_KINDS])


def refused(records: Sequence[Record]) -> list[TimelineRow]:
    """The events memory says were refused (each with its reason, whole): an answer, a
    decision or a note whose sender's key the object's workers do not accept."""
    return timeline([r for r in records if r.kind == Kind.EVENT_REFUSED])


def refused_while_waiting(records: Sequence[Record]) -> list[TimelineRow]:
    """The events refused since the object last went dormant: what was sent to its
    current wait and did not count."""
    last = max((r.seq for r in records if r.kind == Kind.DORMANT), default=0)
    return refused([r for r in records if r.seq > last])


def restores(records: Sequence[Record]) -> list[TimelineRow]:
    """The restore reports in memory: on each reentry, what came back (each resource,
    how long it took) or what failed."""
    return timeline([r for r in records if r.kind == Kind.RESTORE_REPORT])


class LedgerRow(NamedTuple):
    """One model call of an object's ledger (``model_ledger``)."""

    seq: str
    call: str  # the call's name and position
    model: str
    attempt: str
    input_tokens: str
    output_tokens: str
    cost: str  # dollars, exact; "-" when the call was not priced
    latency: str


def model_ledger(records: Sequence[Record]) -> list[LedgerRow]:
    """The model calls in memory with their tokens, cost and latency, one row each (a
    record that cannot be decoded says so in the call's cell)."""
    rows = []
    for rec in records:
        if rec.kind != Kind.MODEL_CALL:
            continue
        try:
            body = decode(rec)
        except RecordDecodeError as exc:
            rows.append(LedgerRow(str(rec.seq), f"cannot be decoded: {exc.reason}",
                                  "", "", "", "", "", ""))
            continue
        assert isinstance(body, ModelCall)
        reply, used = body.reply, body.reply.get("usage")
        used = used if isinstance(used, dict) else {}
        model = reply.get("model") or body.request.get("model") or "?"
        cached = used.get("cached_input_tokens")
        tokens_in = f"{used.get('input_tokens', 0)}" + (f" ({cached} cached)" if cached
                                                        else "")
        cost = f"${_dollars(Decimal(body.cost))}" if body.cost is not None else "-"
        rows.append(LedgerRow(str(rec.seq), f"#{body.pos} {body.name}",
                              f"{model} via {body.provider}", str(body.attempt), tokens_in,
                              str(used.get("output_tokens", 0)), cost,
                              f"{float(reply.get('latency') or 0.0):.3f}s"))
    return rows


def usage(totals: UsageTotals) -> str | None:
    """What model calls used and cost, in one line (``None`` when there were none)."""
    if not totals.calls and not totals.failed_attempts:
        return None
    cached = f" ({totals.cached_input_tokens} cached)" if totals.cached_input_tokens else ""
    text = (f"model calls: {totals.calls}, {totals.failed_attempts} failed attempt(s); "
            f"tokens {totals.input_tokens} in{cached} + {totals.output_tokens} out; "
            f"cost ${_dollars(totals.cost)}")
    if totals.unpriced:
        text += f" (+ {totals.unpriced} call(s) not priced)"
    if totals.in_doubt_tokens:
        text += f"; about {totals.in_doubt_tokens} tokens of lost attempts in doubt"
    if totals.objects > 1:
        text += f"; over {totals.objects} objects"
    return text


# -- explanations: why it failed, why it waits, what it asks --------------------------------


def _why(body: Terminated) -> str | None:
    error = body.error or {}
    if error.get("type") is not None:
        message = error.get("message")
        name = short_type(error["type"])
        return f"{name}: {message}" if message else name
    return body.reason


def failure(records: Sequence[Record]) -> str | None:
    """Why a failed object failed (``Type: message``, or the reason it was ended), from
    its last terminal record; ``None`` if it holds none. ``RecordDecodeError`` if that
    record's body cannot be decoded."""
    last = next((r for r in reversed(records) if r.kind == Kind.TERMINATED), None)
    if last is None:
        return None
    body = decode(last)
    assert isinstance(body, Terminated)
    return _why(body)


def waiting_note(info: ObjectInfo, nodes: Sequence[NodeInfo]) -> str | None:
    """Why a runnable object (status ready) waits when none of the live ``nodes`` can
    take it: none serves its agent version, none that does has the capabilities it
    requires, or every one that could said it cannot do its next step (it cannot
    restore a resource, lacks a key or a package: the object's own note says which).
    ``None`` when one can, or the object is not waiting so."""
    if info.status is not Status.READY or (info.note and not info.avoid):
        return None
    wanted = f"{info.agent}@{info.agent_version}"
    serving = [n for n in nodes if wanted in n.serves]
    if not serving:
        return f"waiting: no live node serves {wanted}" if not info.note else None
    needs = set(info.requires)
    able = [n for n in serving if needs <= set(n.capabilities)]
    if not able:
        return (f"waiting: no live node serving {wanted} has {', '.join(sorted(needs))}"
                if not info.note else None)
    refused = {owner.rpartition("/")[0] or owner for owner in info.avoid}
    if any(n.node_id not in refused for n in able):
        return None
    why = info.note or f"{', '.join(sorted(refused))} cannot do its next step"
    return (f"waiting: no live node can take it: {why}; fix that node and restart it, "
            f"or start another")


def waiting_for(info: ObjectInfo) -> str | None:
    """What the object waits for before it goes on (an event, and the question it asks
    if it asks one: ``ObjectInfo.asking``), or ``None`` (also when its note says it)."""
    if info.asking:
        text = "; ".join(asking_note(q.event, q.prompt, q.choices)
                         if q.prompt is not None or q.choices is not None
                         else f"waiting for event {q.event!r}" for q in info.asking)
        return None if text == info.note else text  # the note says it already
    return f"waiting for event {info.waiting_event!r}" if info.waiting_event else None


def origin(info: ObjectInfo) -> str | None:
    """Where a fork was forked from (``forked from ID at #SEQ``), or ``None``."""
    source = info.forked_from
    if not source:
        return None
    return f"forked from {source.get('object_id')} at #{source.get('seq')}"


# -- an object on one line, and its lineage ---------------------------------------------------


def object_parts(info: ObjectInfo) -> list[Segment]:
    """``ID  AGENT@VERSION  STATUS  phase PHASE``: an object in ``tree`` and among
    ``show``'s children, its status styled."""
    return [(f"{info.object_id}  {info.agent}@{info.agent_version}  ", ""),
            (str(info.status), STATUS_STYLE.get(info.status, "white")),
            (f"  phase {info.phase}", "")]


def headline(info: ObjectInfo) -> list[Segment]:
    """The parts of ``perdure show``'s first line, each kept whole when it wraps."""
    return [(info.object_id, "bold"), (f"{info.agent}@{info.agent_version}", ""),
            (str(info.status), STATUS_STYLE.get(info.status, "white")),
            (f"phase {info.phase}", ""), (f"epoch {info.epoch}", ""),
            (f"created {when(info.created_at)}", "")]


def listing_row(info: ObjectInfo) -> tuple[str, ...]:
    """An object's cells under ``LISTING_COLUMNS`` (``perdure ls``)."""
    return (info.object_id, f"{info.agent}@{info.agent_version}", str(info.status),
            info.phase, str(info.records), str(info.epoch), when(info.updated_at))


@dataclass(frozen=True, slots=True)
class TreeLine:
    """One object of a lineage tree: the branch drawing before it, and the object."""

    prefix: str
    info: ObjectInfo


def lineage(root: ObjectInfo, children_of: Callable[[str], Sequence[ObjectInfo]]
            ) -> list[TreeLine]:
    """``root`` and its descendants, depth first, each under its parent with ``├──`` and
    ``└──`` branches; ``children_of(object_id)`` lists an object's children in the order
    they are drawn."""
    lines: list[TreeLine] = []

    def walk(info: ObjectInfo, prefix: str, last: bool, top: bool) -> None:
        branch = "" if top else ("└── " if last else "├── ")
        lines.append(TreeLine(prefix + branch, info))
        kids = list(children_of(info.object_id))
        inner = prefix if top else prefix + ("    " if last else "│   ")
        for index, kid in enumerate(kids):
            walk(kid, inner, index == len(kids) - 1, False)

    walk(root, "", True, True)
    return lines


# -- memory as a story ----------------------------------------------------------------------


class Narrator:
    """Memory told as a story, one line per record, as ``perdure demo`` follows its
    object while workers write to it.

    ``who(record)`` says who wrote a record and ``what(record)`` what it says. Subclass
    to tell a domain's values in its own words: override ``who``, ``result`` (a step's
    result), ``progress`` (a progress note) or ``outcome`` (a completed object's result).
    """

    def who(self, record: Record) -> str:
        """Who wrote ``record``: its node."""
        return record.node_id

    def result(self, value: JSON) -> str:
        """A step's result, in a few words."""
        return clip(_json(value), 60)

    def progress(self, fields: Mapping[str, JSON]) -> str:
        """A progress note, in a few words."""
        return clip(_json(fields), 60)

    def outcome(self, result: JSON) -> str | None:
        """A completed object's result, shown after its outcome; ``None``: not shown."""
        result = sealed_shown(result)
        if isinstance(result, dict):
            return ", ".join(f"{k}={v}" for k, v in result.items())
        return None

    def what(self, record: Record) -> str:
        """What ``record`` says, in words."""
        try:
            body = decode(record)
        except RecordDecodeError as exc:
            return f"{record.kind} cannot be decoded: {exc.reason}"
        if isinstance(body, Instantiated):
            return f"object {record.object_id} created: agent {body.intent.agent!r}"
        if isinstance(body, StepDone):
            return f"step done  {body.name}  ({self.result(body.result)})"
        if isinstance(body, Progress):
            return f"progress   {self.progress(body.fields)}"
        if isinstance(body, Dormant):
            return self._dormant(body)
        if isinstance(body, Woke):
            return "woke       timer due"
        if isinstance(body, EventReceived):
            return f"event      {body.name!r} received: {_json(body.payload)}"
        if isinstance(body, Terminated):
            shown = self.outcome(body.result) if body.outcome == "completed" else None
            return f"terminated {body.outcome}" + (f": {shown}" if shown is not None else "")
        return f"{record.kind} {clip(_json(body.encode()), 70)}"

    @staticmethod
    def _dormant(body: Dormant) -> str:
        if body.event:
            return f"dormant    waiting for event {body.event!r}"
        if body.cmd == "sleep":
            return f"dormant    sleeping {body.seconds or 0:g}s (the object is released)"
        return f"dormant    {body.reason}"
