"""Every body every writer can produce, with every option, decodes through every reader.

A writer getting ahead of the readers is how an object started with ``budget=`` became
unreadable: the engine wrote the intent's new key, and ``perdure show``, ``fork --at``
and queries refused the record. Here each record kind has a strategy that builds its
body the way the engine does (the typed constructors the writers call, ``Intent`` and
``Context`` with every optional field set or left out, model bodies from
``perdure.llm``'s own ``to_json`` and ``split_reply``); each body is stored as memory
holds it and read back by the typed decoder, by ``perdure show``'s and the dashboard's
renderings, by the fork's reading of a prefix, by queries' ``MemoryView``, by the
follower's stream, by the usage totals and by the engine's ``read_memory``.

``test_every_field_is_generated_both_ways`` keeps the strategies honest: every kind has
one, and every field with a default (an option: a key a body may leave out) is drawn
both set and unset, so a field added to a body, an intent or a context is written here
the day it is written by the engine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from perdure import describe as view
from perdure.core.backoff import ErrorClass
from perdure.core.bodies import (
    BODY_TYPES,
    CapabilityMissing,
    ChildFinished,
    Delegated,
    Dormant,
    Emitted,
    EventReceived,
    EventRefused,
    Instantiated,
    IntentRefined,
    Invalidated,
    ModelCall,
    ModelChunks,
    ModelFailed,
    ModelRecovered,
    ModelStarted,
    Nondeterminism,
    Parked,
    Patched,
    Progress,
    RecordBody,
    ResourceHeld,
    RestoreReport,
    StepCheckpoint,
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
    Value,
    WaitTimedOut,
    Woke,
    decode,
    decode_body,
)
from perdure.core.bodies.resources import REPORT_OUTCOMES, RESOURCE_STATES
from perdure.core.bodies.tools import DECISIONS, TOOL_OUTCOMES, VERDICTS
from perdure.core.codec import decode as decode_json
from perdure.core.codec import encode
from perdure.core.cycle import read_memory
from perdure.core.intent import Context, Intent, budget_body
from perdure.core.questions import forked_from, pending_questions
from perdure.core.records import Record
from perdure.core.usage import usage_totals
from perdure.follow import event_of
from perdure.fork import fork_problem, forked_first
from perdure.llm._failures import CallFailure, FailureKind
from perdure.llm._reply import ModelReply, StreamChunk, Usage
from perdure.llm._storage import split_reply
from perdure.queries import MemoryView
from perdure.web import _pages as pages
from tests.unit.builders import chain

READERS = settings(max_examples=25, deadline=None, database=None, derandomize=True,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# -- values ------------------------------------------------------------------------------

_text = st.text(max_size=8)
_name = st.text(min_size=1, max_size=8)
_hex = st.text(alphabet="0123456789abcdef", min_size=1, max_size=64)
_count = st.integers(min_value=0, max_value=10**6)
_attempt = st.integers(min_value=1, max_value=50)
_number = st.integers(min_value=-(10**9), max_value=10**12) | st.floats(
    allow_nan=False, allow_infinity=False, min_value=-1e15, max_value=1e15)
_seconds = st.floats(min_value=0, max_value=1e6, allow_nan=False)
_when = st.floats(min_value=0, max_value=4e9, allow_nan=False)
_json: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**53), max_value=2**53) | _text
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=6)
_object = st.dictionaries(_text, _json, max_size=3)
_pos = _count | st.lists(st.integers(min_value=0, max_value=99), min_size=2,
                         max_size=4).map(lambda parts: ".".join(map(str, parts)))
_cost = st.decimals(min_value=0, max_value=100, places=8).map(str)
_error = st.fixed_dictionaries(
    {"type": st.sampled_from(["builtins:ValueError", "x.y:Boom"]), "message": _text,
     "args": st.lists(_json, max_size=2), "attrs": _object,
     "dropped": st.lists(_text, max_size=2)})


def maybe(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """An option: left out (``None``) or set."""
    return st.none() | values


# -- intent and context, every option set or not ------------------------------------------

_budget = st.fixed_dictionaries(
    {}, optional={"tokens": maybe(_count), "cost": maybe(_cost), "lineage": st.booleans()}
).map(budget_body)

intents = st.builds(
    Intent, agent=_name, version=_name, args=st.lists(_json, max_size=3).map(tuple),
    kwargs=_object, deadline=maybe(_when),
    max_failures=maybe(st.integers(min_value=0, max_value=100) | _seconds),
    requires=st.lists(_name, max_size=3).map(tuple), goal=_object,
    version_no=st.integers(min_value=1, max_value=100), budget=_budget,
    start_at=maybe(_when))

contexts = st.builds(
    Context, object_id=_name, trace_id=_hex, parent_id=maybe(_name), root_id=maybe(_name),
    depth=st.integers(min_value=0, max_value=10), tenant=maybe(_name),
    trust_scope=st.just("default") | _name,
    labels=st.dictionaries(_name, _text, max_size=3),
    forked_from=maybe(st.fixed_dictionaries({"object_id": _name, "seq": _attempt,
                                             "hash": _hex})))


@st.composite
def _refinements(draw: st.DrawFn) -> IntentRefined:
    """A refinement as ``run.refine`` or ``App.refine`` records it: the changes as the
    caller gave them, the intent they make."""
    intent = draw(intents)
    changes: dict[str, Any] = {}
    for key in draw(st.sets(st.sampled_from(("deadline", "max_failures", "goal", "requires",
                                             "budget")))):
        value = getattr(intent, key)
        changes[key] = list(value) if isinstance(value, tuple) else value
    changes = decode_json(encode(changes))
    if draw(st.booleans()):
        return IntentRefined(intent, changes, pos=draw(_pos))
    return IntentRefined(intent, changes, event_id=draw(_attempt),
                         event_hash=draw(maybe(_hex)))


# -- model calls, from perdure.llm's own writers -------------------------------------------

_usage = st.builds(Usage, *[_count] * 5)
_reply = st.builds(ModelReply, text=_text, finish_reason=st.sampled_from(["stop", "length"]),
                   usage=_usage, model=_text, provider=_text, request_id=maybe(_name),
                   response_id=maybe(_name), latency=_seconds
                   ).map(lambda reply: decode_json(encode(split_reply(reply).body)))
_failure = st.builds(CallFailure, st.sampled_from(list(FailureKind)),
                     st.sampled_from(list(ErrorClass)), _text, maybe(_attempt),
                     maybe(_seconds), maybe(_name), maybe(_text)
                     ).map(lambda f: decode_json(encode(f.to_json())))
_chunk = st.builds(StreamChunk, _count, _text).map(lambda c: decode_json(encode(c.to_json())))
_skipped = st.fixed_dictionaries({"client": _count, "reason": _text, "until": maybe(_when)})


def _terminal_payload(ended: Terminated) -> dict[str, Any]:
    """The signal a child sends its parent when it ends (``engine.lineage``)."""
    body = ended.encode()
    payload = {"child_id": "kid", "outcome": body["outcome"]}
    payload.update({k: body[k] for k in ("result", "error") if k in body})
    return payload


_terminated = st.one_of(
    st.builds(Terminated.completed, _json), st.builds(Terminated.cancelled, _text),
    st.builds(Terminated.failed, _text, _error))

# The body of every record kind, as the engine's writers build it.
SHAPES: dict[type[Any], st.SearchStrategy[Any]] = {
    Instantiated: st.builds(Instantiated, intents, contexts),
    StepStarted: st.builds(StepStarted, _pos, _name, _attempt, _text),
    StepDone: st.builds(StepDone, _pos, _name, _attempt, _seconds, _json),
    StepFailed: st.builds(StepFailed, _pos, _name, _attempt, _error,
                          st.sampled_from([str(c) for c in ErrorClass]), _seconds,
                          maybe(_seconds), st.just(True))
    | st.builds(StepFailed, _pos, _name, _attempt, _error,
                st.sampled_from([str(c) for c in ErrorClass]), _seconds, maybe(_seconds),
                st.just(False), maybe(_when)),
    StepInDoubt: st.builds(StepInDoubt, _pos, _name, _text),
    Value: st.builds(Value, _pos, st.sampled_from(["now", "uuid", "random"]), _json),
    Dormant: st.one_of(
        st.builds(Dormant.sleep, _pos, _when, _seconds),
        st.builds(Dormant.retry, _pos, _name, _when),
        st.builds(Dormant.model_retry, _pos, _name, _when),
        st.builds(Dormant.model_budget, _pos, _name),
        st.builds(Dormant.approval, _pos, _name, _name, maybe(_when)),
        st.builds(Dormant.wait, _pos, _name, maybe(_when),
                  maybe(_json.filter(lambda v: v is not None)),
                  maybe(st.lists(_json, max_size=3).map(tuple)),
                  st.lists(_name, max_size=2)),
        st.builds(Dormant.join, _pos, st.lists(_name, min_size=1, max_size=3), _name),
        st.builds(Dormant.gather, _pos, maybe(_when), maybe(_name),
                  st.lists(_name, max_size=3))),
    Woke: st.builds(Woke, _pos),
    EventReceived: st.builds(EventReceived, _pos, _name, _attempt, _json,
                             maybe(st.just("") | _hex)),
    WaitTimedOut: st.builds(WaitTimedOut, _pos, _name),
    IntentRefined: _refinements(),
    Nondeterminism: st.builds(Nondeterminism, _text, _pos, _text, _text, _name),
    Delegated: st.builds(Delegated, _pos, _name, _name, _name),
    ChildFinished: st.builds(lambda ended, event_id, digest: ChildFinished.signalled(
        _terminal_payload(ended), event_id, digest), _terminated, _attempt,
        maybe(st.just("") | _hex)),
    CapabilityMissing: st.builds(CapabilityMissing.lacking, _name,
                                 st.lists(_name, min_size=1, max_size=3).map(sorted), _name,
                                 _pos, _when)
    | st.builds(CapabilityMissing.cannot, _name, _name, _text, _pos, _when),
    Patched: st.builds(Patched, _pos, _name),
    Progress: st.builds(Progress, _object)
    | st.builds(lambda who, extra: Progress({"operator_action": {
        "action": "pause", "by": who, "role": "operator", "method": "password",
        "via": "dashboard", "at": 1.7e9, **extra}}), _name, _object),
    EventRefused: st.builds(EventRefused, _attempt, _name, maybe(_hex), _text),
    Parked: st.builds(Parked, _text, _name, _count, maybe(_name), maybe(_pos)),
    Terminated: _terminated,
    ModelCall: st.builds(ModelCall, _pos, _name, _attempt, _count, _name, _hex,
                         st.fixed_dictionaries({"model": _name}, optional={"hash": _hex}),
                         st.dictionaries(_hex, _object, max_size=2), _reply, maybe(_cost),
                         st.lists(_skipped, max_size=2).map(tuple),
                         maybe(st.fixed_dictionaries({"recovery": st.sampled_from(
                             ["continue", "restart", "surface"]), "chunks": _count}))),
    ModelFailed: st.builds(ModelFailed, _pos, _name, _attempt, _count, _name, _name, _hex,
                           _failure, _seconds, maybe(_when), st.booleans(), maybe(_count)),
    ModelChunks: st.builds(ModelChunks, _pos, _name, _attempt, _count, _hex, _count,
                           st.lists(_chunk, min_size=1, max_size=3).map(tuple)),
    ModelRecovered: st.builds(ModelRecovered, _pos, _name, _attempt,
                              st.sampled_from(["continue", "restart", "surface"]), _name,
                              _count, _count, _text,
                              maybe(_usage.map(lambda u: decode_json(encode(u.to_json()))))),
    Emitted: st.builds(Emitted, _pos, _name, _json),
    ModelStarted: st.builds(ModelStarted, _pos, _name, _attempt, _count, _hex),
    ResourceHeld: st.builds(ResourceHeld, _name, _name, _attempt, _object,
                            st.sampled_from(RESOURCE_STATES), _name, pos=_pos)
    | st.builds(ResourceHeld, _name, _name, _attempt, _object,
                st.sampled_from(RESOURCE_STATES), _name, decl=_pos),
    RestoreReport: st.builds(RestoreReport, st.sampled_from(REPORT_OUTCOMES), _name, _seconds,
                             st.lists(_object, max_size=2), maybe(_when)),
    StepCheckpoint: st.builds(StepCheckpoint, _pos, _name, _attempt, _attempt, _json),
    Invalidated: st.builds(Invalidated, _count, _name, _name, _text),
    ToolProposed: st.builds(ToolProposed, _pos, _name, _name, _count, _name, _text, _hex,
                            _name, maybe(_name)),
    ToolGated: st.builds(ToolGated, _pos, _name, _name, _hex, st.sampled_from(VERDICTS),
                         _text, _name, _text, _name, st.lists(_name, max_size=2).map(tuple),
                         maybe(_when)),
    ToolDecided: st.builds(ToolDecided, _pos, _name, _name, _hex,
                           st.sampled_from([d for d in DECISIONS if d != "edit"]), _text,
                           _name, _hex, maybe(_hex), evidence=maybe(st.fixed_dictionaries(
                               {"payload": _text, "dedupe_key": maybe(_text),
                                "seal": _text})))
    | st.builds(ToolDecided, _pos, _name, _name, _hex, st.just("edit"), _text, _name, _hex,
                maybe(_hex), _text, maybe(st.fixed_dictionaries(
                    {"payload": _text, "dedupe_key": maybe(_text), "seal": _text}))),
    ToolStarted: st.builds(ToolStarted, _pos, _name, _name, _text),
    ToolResult: st.builds(ToolResult, _pos, _name, _name, st.just("done"), _json,
                          latency=maybe(_seconds))
    | st.builds(ToolResult, _pos, _name, _name,
                st.sampled_from([o for o in TOOL_OUTCOMES if o != "done"]), error=_text,
                latency=maybe(_seconds)),
}

# Options no writer of perdure's own sets: a child's signal in another shape than
# perdure's keeps what it carried there, and decoding refuses such a body on purpose.
NEVER_WRITTEN = {(ChildFinished, "others")}

KINDS = sorted(SHAPES, key=lambda cls: str(cls.kind.value))


# -- the readers -------------------------------------------------------------------------


def _memory(typed: RecordBody, first: Instantiated) -> list[Record]:
    """``typed`` sealed into memory as the engine stores it: after the object's first
    record, or as that record."""
    if isinstance(typed, Instantiated):
        return chain([], first=typed.draft())
    return chain([typed.draft()], first=first.draft())


def _no_refusal(text: object) -> None:
    assert "cannot be decoded" not in str(text), text


def _read_by_every_reader(records: list[Record]) -> None:
    """Every reader of memory outside the engine's step path, over ``records``."""
    last = records[-1]
    _no_refusal(view.describe(last))
    _no_refusal(view.Narrator().what(last))
    for reader in (view.timeline, view.tool_trail, view.restores, view.model_ledger):
        _no_refusal(reader(records))
    view.failure(records)
    usage_totals(records)
    event_of(last)
    pending_questions(records, "agent")
    forked_from(records)
    # perdure fork --at: what a prefix holds, and the fork's own first record
    for at in range(1, len(records) + 1):
        fork_problem(records, at)
    fork = forked_first(records[0], "fork-1", "f" * 32, {"object_id": last.object_id,
                                                        "seq": 1, "hash": records[0].hash})
    stored = decode_json(encode(fork.encode()))
    assert decode_body("instantiated", stored, object_id="fork-1", seq=1) == fork
    # queries
    memory = MemoryView(last.object_id, "agent", "1", "running", tuple(records))
    assert memory.intent.version_no >= 1
    assert memory.context.object_id
    memory.steps(), memory.emitted(), memory.progress(), memory.received()
    assert isinstance(memory.asking, tuple) and (memory.ended or memory.result is None)
    # the engine's reading of memory
    facts = read_memory(records)
    assert facts.intent == memory.intent
    # the dashboard's object page
    for section in (pages._intent_section(records), pages._timeline(records, len(records)),
                    pages._tools_section(records), pages._restores_section(records),
                    pages._ledger_section(records)):
        _no_refusal(section)


@pytest.mark.parametrize("cls", KINDS, ids=lambda cls: cls.kind.value)
@READERS
@given(data=st.data(), first=st.builds(Instantiated, intents, contexts))
def test_every_written_body_decodes_through_every_reader(cls: type[Any], data: st.DataObject,
                                                         first: Instantiated) -> None:
    """A body of each kind as the engine writes it decodes to itself, re-encodes to the
    same bytes, and every reader of memory reads the record without refusing it."""
    typed = data.draw(SHAPES[cls])
    written = typed.encode()
    stored = decode_json(encode(written))
    back = decode_body(typed.kind, stored, object_id="o-1", seq=2)
    assert back == typed
    assert encode(back.encode()) == encode(written)
    records = _memory(typed, first)
    assert decode(records[-1]) == typed
    _read_by_every_reader(records)


@READERS
@given(st.builds(Instantiated, intents, contexts), st.lists(_refinements(), max_size=3))
def test_an_intent_refined_any_way_reads_as_the_engine_reads_it(
        first: Instantiated, refinements: list[IntentRefined]) -> None:
    """Queries, the dashboard and the engine agree on the intent after refinements,
    whatever options each intent holds (a budget, a lineage budget, none)."""
    records = chain([r.draft() for r in refinements], first=first.draft())
    memory = MemoryView("o", "agent", "1", "running", tuple(records))
    expected = refinements[-1].intent if refinements else first.intent
    assert memory.intent == expected == read_memory(records).intent
    _no_refusal(pages._intent_section(records))


def _options(cls: type[Any]) -> list[tuple[str, object]]:
    """The fields of ``cls`` that have a default, with it: the options of a body."""
    found = []
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            found.append((f.name, f.default))
        elif f.default_factory is not dataclasses.MISSING:
            found.append((f.name, f.default_factory()))
    return found


_OPTIONS: list[tuple[type[Any], str, object, Callable[[Any], Any]]] = [
    (cls, name, default, lambda body, name=name: getattr(body, name))
    for cls in SHAPES for name, default in _options(cls) if (cls, name) not in NEVER_WRITTEN
] + [
    (Instantiated, f"{part}.{name}", default,
     lambda body, part=part, name=name: getattr(getattr(body, part), name))
    for part, holder in (("intent", Intent), ("context", Context))
    for name, default in _options(holder)
]


def test_every_kind_has_a_strategy() -> None:
    """Each record kind's body is generated above."""
    assert set(SHAPES) == set(BODY_TYPES.values())


@pytest.mark.parametrize("cls", KINDS, ids=lambda cls: cls.kind.value)
def test_every_option_is_generated_both_ways(cls: type[Any]) -> None:
    """Each option of each body (and of an intent and a context) is drawn both set and
    left at its default, so the readers meet every key a writer may write."""
    options = [(name, default, get) for holder, name, default, get in _OPTIONS
               if holder is cls]
    seen: set[tuple[str, bool]] = set()

    @settings(max_examples=150, phases=[Phase.generate], database=None, derandomize=True,
              deadline=None, suppress_health_check=list(HealthCheck))
    @given(SHAPES[cls])
    def draw(body: Any) -> None:
        seen.update((name, get(body) == default) for name, default, get in options)

    draw()
    missing = [f"{cls.__name__}.{name} is never generated "
               f"{'at its default' if at_default else 'set'}"
               for name, _, _ in options for at_default in (True, False)
               if (name, at_default) not in seen]
    assert not missing, "add to the strategy of its kind: " + "; ".join(missing)


def test_a_budget_is_read_back_and_bad_ones_refused() -> None:
    """The intent's budget, as ``budget_body`` writes it, decodes; a budget in another
    shape is refused, naming the key."""
    context = Context("o", "t")
    for budget in ({"tokens": 5, "cost": None}, {"tokens": None, "cost": "0.5"},
                   {"tokens": 1, "cost": "2", "lineage": True}):
        first = Instantiated(Intent("a", "1", budget=budget), context)
        assert decode_body("instantiated", first.encode(), object_id="o", seq=1) == first
    good = Instantiated(Intent("a", "1"), context).encode()
    for bad, says in (({"tokens": "5", "cost": None}, "'intent.budget.tokens' is a string"),
                      ({"tokens": None, "cost": None}, "sets neither tokens nor cost"),
                      ({"tokens": 1, "cost": None, "lineage": False}, "not True"),
                      ({"tokens": 1}, "no 'intent.budget.cost'"),
                      ({"tokens": 1, "cost": None, "extra": 1}, "unexpected key 'extra'"),
                      (None, "'intent.budget' is null")):
        body = {**good, "intent": {**good["intent"], "budget": bad}}
        with pytest.raises(Exception, match="cannot be decoded") as caught:
            decode_body("instantiated", body, object_id="o", seq=1)
        assert says in str(caught.value), caught.value
