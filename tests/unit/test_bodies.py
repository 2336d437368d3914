"""Typed record bodies encode to exactly what the engine writes and decode failing closed.

Each case below pairs a body dict written the way ``engine/run.py``, ``engine/worker.py``
and ``engine/instantiate.py`` build it with the typed body that must encode to it. Every
record of the golden logs decodes and re-encodes to the same canonical bytes. Unknown
kinds, missing or unexpected keys and values of the wrong type raise
``RecordDecodeError`` naming the record and the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

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
from perdure.core.codec import decode as decode_json
from perdure.core.codec import encode
from perdure.core.intent import Context, Intent
from perdure.core.records import Kind
from perdure.errors import RecordDecodeError
from tests.golden.logs import golden_files, load_log

INTENT = Intent("review", "1", args=("a", 2), kwargs={"k": [1]}, deadline=1.5e9,
                max_failures=3, requires=("gpu",), goal={"aim": "x"}, version_no=2)
CONTEXT = Context("o-1", "t" * 32, parent_id="p", root_id="p", depth=1, tenant=None,
                  trust_scope="default", labels={"team": "a"})
ERROR = {"type": "builtins:ValueError", "message": "bad", "args": ["bad"], "attrs": {},
         "dropped": []}

# (typed body, the dict the engine writes for it)
_SEALED_TEXT = {"perdure:sealed": {"v": 1, "of": "o-1", "data": "AAAA"}}

CASES: list[tuple[RecordBody, dict[str, Any]]] = [
    (Instantiated(INTENT, CONTEXT),
     {"intent": INTENT.to_body(), "context": CONTEXT.to_body()}),
    (StepStarted(3, "charge", 1, "o-1/3/charge"),
     {"pos": 3, "cmd": "step", "name": "charge", "attempt": 1, "key": "o-1/3/charge"}),
    (StepDone("4.1.0", "fetch", 2, 0.0012, {"rows": [1, None]}),
     {"pos": "4.1.0", "cmd": "step", "name": "fetch", "attempt": 2, "latency": 0.0012,
      "result": {"rows": [1, None]}}),
    (StepDone(0, "nothing", 1, 0.0, None),
     {"pos": 0, "cmd": "step", "name": "nothing", "attempt": 1, "latency": 0.0,
      "result": None}),
    (StepFailed(1, "flaky", 1, ERROR, "transient", 0.25, None, False, 1.7e9),
     {"pos": 1, "cmd": "step", "name": "flaky", "attempt": 1, "error": ERROR,
      "error_class": "transient", "latency": 0.25, "retry_after": None, "final": False,
      "retry_at": 1.7e9}),
    (StepFailed(1, "flaky", 3, ERROR, "permanent", 0.5, 30, True),
     {"pos": 1, "cmd": "step", "name": "flaky", "attempt": 3, "error": ERROR,
      "error_class": "permanent", "latency": 0.5, "retry_after": 30, "final": True}),
    (StepInDoubt(2, "charge", "o-1/2/charge"),
     {"pos": 2, "cmd": "step", "name": "charge", "key": "o-1/2/charge"}),
    (Value(5, "uuid", "0f0e"), {"pos": 5, "cmd": "uuid", "value": "0f0e"}),
    (Value(6, "now", 1700000000.25), {"pos": 6, "cmd": "now", "value": 1700000000.25}),
    (Dormant.sleep(7, 1.7e9, 2.0),
     {"pos": 7, "cmd": "sleep", "reason": "sleep", "wake_at": 1.7e9, "seconds": 2.0}),
    (Dormant.retry(1, "flaky", 1.7e9),
     {"pos": 1, "cmd": "step", "name": "flaky", "reason": "retry", "wake_at": 1.7e9}),
    (Dormant.wait(8, "approval", None),
     {"pos": 8, "cmd": "wait", "name": "approval", "reason": "event", "event": "approval",
      "wake_at": None}),
    (Dormant.join(9, ["o-1.0", "o-1.1"], "perdure:child"),
     {"pos": 9, "cmd": "join", "name": "o-1.0,o-1.1", "reason": "children",
      "children": ["o-1.0", "o-1.1"], "event": "perdure:child", "wake_at": None}),
    (Dormant.gather(10, None, None, []),
     {"pos": 10, "cmd": "gather", "reason": "gather", "wake_at": None, "event": None,
      "children": []}),
    (Woke(7), {"pos": 7, "cmd": "sleep"}),
    (EventReceived(8, "approval", 12, {"by": "ana"}, "ab" * 32),
     {"pos": 8, "cmd": "wait", "name": "approval", "event_id": 12, "event_hash": "ab" * 32,
      "payload": {"by": "ana"}}),
    (EventReceived(8, "approval", 12, None, ""),  # a run that checks no seals
     {"pos": 8, "cmd": "wait", "name": "approval", "event_id": 12, "event_hash": "",
      "payload": None}),
    (EventReceived(8, "approval", 12, [1]),  # written before events were sealed
     {"pos": 8, "cmd": "wait", "name": "approval", "event_id": 12, "payload": [1]}),
    (WaitTimedOut(11, "never"), {"pos": 11, "cmd": "wait", "name": "never"}),
    (IntentRefined(INTENT, {"goal": {"aim": "x"}}, pos=12),
     {"pos": 12, "cmd": "refine", "intent": INTENT.to_body(),
      "changes": {"goal": {"aim": "x"}}}),
    (IntentRefined(INTENT, {"max_failures": 3}, event_id=4, event_hash="cd" * 32),
     {"intent": INTENT.to_body(), "changes": {"max_failures": 3}, "event_id": 4,
      "event_hash": "cd" * 32}),
    (IntentRefined(INTENT, {"max_failures": 3}, event_id=4),
     {"intent": INTENT.to_body(), "changes": {"max_failures": 3}, "event_id": 4}),
    (Nondeterminism("history mismatch", 0, "step('sq')", "step('ok')", "1"),
     {"reason": "history mismatch", "position": 0, "recorded": "step('sq')",
      "found": "step('ok')", "agent_version": "1"}),
    (Delegated(0, "kid", "o-1.0", "1"),
     {"pos": 0, "cmd": "delegate", "name": "kid", "child_id": "o-1.0", "version": "1"}),
    (ChildFinished("o-1.0", "completed", 7, None, event_hash="ef" * 32),
     {"child_id": "o-1.0", "outcome": "completed", "result": None, "event_id": 7,
      "event_hash": "ef" * 32}),
    (ChildFinished("o-1.1", "failed", 8, error=ERROR),
     {"child_id": "o-1.1", "outcome": "failed", "error": ERROR, "event_id": 8}),
    (ChildFinished("o-1.2", "cancelled", 9),
     {"child_id": "o-1.2", "outcome": "cancelled", "event_id": 9}),
    (CapabilityMissing.lacking("n1", ["gpu", "tpu"], "train", 3, 1.7e9),
     {"refusal": "n1:lacks:gpu,tpu", "node": "n1", "capabilities": ["gpu", "tpu"],
      "step": "train", "step_pos": 3, "at": 1.7e9}),
    (CapabilityMissing.cannot("n1", "print", "no printer", "2.0.1", 1.7e9),
     {"refusal": "n1:cannot:print", "node": "n1", "cannot_do": "print",
      "reason": "no printer", "step_pos": "2.0.1", "at": 1.7e9}),
    (Patched(5, "quota"), {"pos": 5, "cmd": "patch", "name": "quota"}),
    (Progress({"done": 1, "of": 3}), {"fields": {"done": 1, "of": 3}}),
    (Emitted(4, "tokens", {"n": 3}), {"pos": 4, "cmd": "emit", "name": "tokens",
                                      "data": {"n": 3}}),
    (Dormant.wait(5, "approval", 1.7e9, "Ship it?", ("yes", "no")),
     {"pos": 5, "cmd": "wait", "reason": "event", "wake_at": 1.7e9, "name": "approval",
      "event": "approval", "prompt": "Ship it?", "choices": ["yes", "no"]}),
    (EventRefused(3, "go", None, "carries no signature"),
     {"event_id": 3, "name": "go", "event_hash": None, "reason": "carries no signature"}),
    (Parked("the worker died 4 times", "worker_died", 4, "boom", 2),
     {"reason": "the worker died 4 times", "code": "worker_died", "step": "boom",
      "step_pos": 2, "crashes": 4}),
    (Parked("the worker died 4 times", "worker_died", 4),
     {"reason": "the worker died 4 times", "code": "worker_died", "crashes": 4}),
    (Terminated.completed({"total": 3}), {"outcome": "completed", "result": {"total": 3}}),
    (Terminated.completed(None), {"outcome": "completed", "result": None}),
    (Terminated.cancelled("cancelled"), {"outcome": "cancelled", "reason": "cancelled"}),
    (Terminated.failed("agent raised", ERROR),
     {"outcome": "failed", "reason": "agent raised", "error": ERROR}),
    (ModelCall(3, "gpt-4o", 1, 0, "openai.chat", "ab" * 32,
               {"model": "gpt-4o", "messages": [[0, 2], 3], "setup": 2},
               {"3": {"role": "user", "content": "hi"}},
               {"message": 4, "finish_reason": "stop"}, "0.00008"),
     {"pos": 3, "cmd": "model", "name": "gpt-4o", "attempt": 1, "client": 0,
      "provider": "openai.chat", "asked": "ab" * 32,
      "request": {"model": "gpt-4o", "messages": [[0, 2], 3], "setup": 2},
      "blobs": {"3": {"role": "user", "content": "hi"}},
      "reply": {"message": 4, "finish_reason": "stop"}, "cost": "0.00008"}),
    (ModelCall("3.0.1", "m", 2, 1, "anthropic", "ab", {}, {}, {}, None,
               ({"client": 0, "reason": "HTTP 429", "until": 1.7e9},),
               {"recovery": "surface", "chunks": 2}),
     {"pos": "3.0.1", "cmd": "model", "name": "m", "attempt": 2, "client": 1,
      "provider": "anthropic", "asked": "ab", "request": {},
      "blobs": {}, "reply": {},
      "skipped": [{"client": 0, "reason": "HTTP 429", "until": 1.7e9}],
      "recovery": {"recovery": "surface", "chunks": 2}}),
    (ModelStarted(3, "m", 1, 0, "ab"),
     {"pos": 3, "cmd": "model", "name": "m", "attempt": 1, "client": 0, "asked": "ab"}),
    (ModelFailed(3, "m", 1, 0, "openai.chat", "m", "ab", {"kind": "rate_limited"}, 0.01,
                 1.7e9, False),
     {"pos": 3, "cmd": "model", "name": "m", "attempt": 1, "client": 0,
      "provider": "openai.chat", "model": "m", "asked": "ab",
      "failure": {"kind": "rate_limited"}, "latency": 0.01, "until": 1.7e9,
      "final": False}),
    (ModelFailed(3, "m", 2, 0, "openai.chat", "m", "ab", {"kind": "permanent"}, 0.01,
                 None, True, 4),
     {"pos": 3, "cmd": "model", "name": "m", "attempt": 2, "client": 0,
      "provider": "openai.chat", "model": "m", "asked": "ab",
      "failure": {"kind": "permanent"}, "latency": 0.01, "until": None, "final": True,
      "chunks": 4}),
    (ModelChunks(3, "m", 1, 0, "ab", 4, ({"index": 4, "text": "Hel"},)),
     {"pos": 3, "cmd": "model", "name": "m", "attempt": 1, "client": 0, "asked": "ab",
      "start": 4, "chunks": [{"index": 4, "text": "Hel"}]}),
    (ModelRecovered(3, "m", 2, "continue", "continue", 5, 40, "the worker was lost"),
     {"pos": 3, "cmd": "model", "name": "m", "attempt": 2, "recovery": "continue",
      "policy": "continue", "chunks": 5, "chars": 40, "reason": "the worker was lost"}),
    (ModelRecovered(3, "m", 2, "restart", "continue", 5, 0, "a tool call had begun",
                    {"input_tokens": 10, "output_tokens": 5}),
     {"pos": 3, "cmd": "model", "name": "m", "attempt": 2, "recovery": "restart",
      "policy": "continue", "chunks": 5, "chars": 0, "reason": "a tool call had begun",
      "lost_usage": {"input_tokens": 10, "output_tokens": 5}}),
    (Dormant.model_retry(3, "m", 1.7e9),
     {"pos": 3, "cmd": "model", "name": "m", "reason": "retry", "wake_at": 1.7e9}),
    # execution state: resources, restore reports, step checkpoints, invalidations
    (ResourceHeld("wd", "perdure.resources.local:WorkingDirectory", 1, {"path": "/w"}, "open",
                  "refresh", pos=2),
     {"pos": 2, "cmd": "resource", "name": "wd", "type": "perdure.resources.local:"
      "WorkingDirectory", "version": 1, "descriptor": {"path": "/w"}, "state": "open",
      "on_stale": "refresh"}),
    (ResourceHeld("wd", "m:C", 2, {}, "closed", "invalidate:fetch", decl="2.1.0"),
     {"cmd": "resource", "name": "wd", "type": "m:C", "version": 2, "descriptor": {},
      "state": "closed", "on_stale": "invalidate:fetch", "decl": "2.1.0"}),
    (RestoreReport("rolled_back", "n1", 0.5, [{"name": "wd", "status": "failed"}], 1.7e9),
     {"outcome": "rolled_back", "node": "n1", "seconds": 0.5,
      "resources": [{"name": "wd", "status": "failed"}], "retry_at": 1.7e9}),
    (StepCheckpoint(4, "migrate", 1, 60, {"applied": 60}),
     {"pos": 4, "cmd": "step", "name": "migrate", "attempt": 1, "count": 60,
      "cursor": {"applied": 60}}),
    (Invalidated(3, "analyse", "input", "input.txt changed"),
     {"from_pos": 3, "step": "analyse", "resource": "input", "reason": "input.txt changed"}),
    (ToolProposed(5, "send", "5:0", 0, "c1", '{"to":"bob"}', "ab", "4"),
     {"pos": 5, "cmd": "tool", "name": "send", "proposal": "5:0", "revision": 0,
      "call_id": "c1", "args": '{"to":"bob"}', "args_hash": "ab", "model_call": "4"}),
    (ToolProposed("5.1.0", "send", "5.1.0:1", 1, "c1", "{}", "cd", "4", "5.1.0:0"),
     {"pos": "5.1.0", "cmd": "tool", "name": "send", "proposal": "5.1.0:1", "revision": 1,
      "call_id": "c1", "args": "{}", "args_hash": "cd", "model_call": "4",
      "edited_from": "5.1.0:0"}),
    (ToolGated(5, "send", "5:0", "ab", "approval", "high risk", "p@0123", "#0", "high",
               ("alice",), 1.7e9),
     {"pos": 5, "cmd": "tool", "name": "send", "proposal": "5:0", "args_hash": "ab",
      "verdict": "approval", "reason": "high risk", "policy": "p@0123", "rule": "#0",
      "risk": "high", "approvers": ["alice"], "expires_at": 1.7e9}),
    (ToolDecided(5, "send", "5:0", "ab", "edit", "", "alice", "ff", "ee", '{"to":"carol"}'),
     {"pos": 5, "cmd": "tool", "name": "send", "proposal": "5:0", "args_hash": "ab",
      "decision": "edit", "reason": "", "identity": "alice", "key": "ff", "event_hash": "ee",
      "edit": '{"to":"carol"}'}),
    (ToolDecided(5, "send", "5:0", "ab", "approve", "", "alice", "ff", "ee",
                 evidence={"payload": "{}", "dedupe_key": None, "seal": "{}"}),
     {"pos": 5, "cmd": "tool", "name": "send", "proposal": "5:0", "args_hash": "ab",
      "decision": "approve", "reason": "", "identity": "alice", "key": "ff",
      "event_hash": "ee", "evidence": {"payload": "{}", "dedupe_key": None, "seal": "{}"}}),
    (ToolStarted(5, "send", "5:1", "o-1/tool/5:1"),
     {"pos": 5, "cmd": "tool", "name": "send", "proposal": "5:1", "key": "o-1/tool/5:1"}),
    (ToolResult(5, "send", "5:1", "done", {"ok": True}, latency=0.5),
     {"pos": 5, "cmd": "tool", "name": "send", "proposal": "5:1", "outcome": "done",
      "result": {"ok": True}, "latency": 0.5}),
    (ToolResult(5, "send", "5:0", "denied", error="not listed"),
     {"pos": 5, "cmd": "tool", "name": "send", "proposal": "5:0", "outcome": "denied",
      "error": "not listed"}),
    # An agent that encrypts all: what a tool call says, sealed in place of the text.
    (ToolProposed(5, "send", "5:0", 0, "c1", _SEALED_TEXT, "ab", "4"),
     {"pos": 5, "cmd": "tool", "name": "send", "proposal": "5:0", "revision": 0,
      "call_id": "c1", "args": _SEALED_TEXT, "args_hash": "ab", "model_call": "4"}),
    (ToolGated(5, "send", "5:0", "ab", "deny", _SEALED_TEXT, "p@0123", "", "low"),
     {"pos": 5, "cmd": "tool", "name": "send", "proposal": "5:0", "args_hash": "ab",
      "verdict": "deny", "reason": _SEALED_TEXT, "policy": "p@0123", "rule": "",
      "risk": "low", "approvers": [], "expires_at": None}),
    (ToolDecided(5, "send", "5:0", "ab", "edit", "", "alice", "ff", "ee", _SEALED_TEXT),
     {"pos": 5, "cmd": "tool", "name": "send", "proposal": "5:0", "args_hash": "ab",
      "decision": "edit", "reason": "", "identity": "alice", "key": "ff", "event_hash": "ee",
      "edit": _SEALED_TEXT}),
    (ToolResult(5, "send", "5:0", "failed", error=_SEALED_TEXT, latency=0.1),
     {"pos": 5, "cmd": "tool", "name": "send", "proposal": "5:0", "outcome": "failed",
      "error": _SEALED_TEXT, "latency": 0.1}),
    (ToolResult(5, "send", "5:1", "done", _SEALED_TEXT),
     {"pos": 5, "cmd": "tool", "name": "send", "proposal": "5:1", "outcome": "done",
      "result": _SEALED_TEXT}),
    (Dormant.approval(5, "send", "perdure:approval", None),
     {"pos": 5, "cmd": "tool", "reason": "approval", "wake_at": None, "name": "send",
      "event": "perdure:approval"}),
]


def test_every_kind_has_a_body_type_and_a_case() -> None:
    """Each record kind has its typed body, and the cases above cover every kind."""
    assert set(BODY_TYPES) == {kind.value for kind in Kind}
    assert {typed.kind for typed, _ in CASES} == set(Kind)
    for kind, cls in BODY_TYPES.items():
        assert cls.kind == kind


@pytest.mark.parametrize(("typed", "written"), CASES,
                         ids=[f"{t.kind}-{i}" for i, (t, _) in enumerate(CASES)])
def test_encodes_to_what_the_engine_writes_and_decodes_back(typed: RecordBody,
                                                            written: dict[str, Any]) -> None:
    """``encode()`` gives the engine's dict key for key; the stored form decodes to the
    same typed body, which encodes to the same canonical bytes."""
    assert typed.encode() == written
    stored = decode_json(encode(written))
    back = decode_body(typed.kind, stored, object_id="o-1", seq=4)
    assert back == typed
    assert encode(back.encode()) == encode(written)
    draft = typed.draft()
    assert draft.kind == typed.kind and draft.body == written


def test_step_done_draft_assembles_the_same_bytes_around_an_encoded_result() -> None:
    """``StepDone.draft(result_bytes)`` carries the body's bytes, equal to encoding it."""
    typed = StepDone(3, "fetch", 1, 0.001234, {"b": 1, "a": [2]})
    draft = typed.draft(encode(typed.result))
    assert draft.body_bytes == encode(typed.encode())
    assert typed.draft().body_bytes is None


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text()
                    | st.floats(allow_nan=False, allow_infinity=False),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=10),
       st.integers(min_value=0, max_value=10_000))
def test_any_json_result_round_trips(result: Any, pos: int) -> None:
    """A step result or event payload of any JSON value comes back as it was stored."""
    for typed in (StepDone(pos, "s", 1, 0.5, result), EventReceived(pos, "e", 1, result, "")):
        stored = decode_json(encode(typed.encode()))
        back = decode_body(typed.kind, stored, object_id="o", seq=2)
        assert encode(back.encode()) == encode(typed.encode())


def test_every_golden_record_decodes_and_re_encodes_to_its_bytes() -> None:
    """The checked-in memory logs: each body decodes, and encodes to its stored bytes."""
    kinds = set()
    for path in golden_files():
        for rec in load_log(Path(path)).records:
            typed = decode(rec)
            assert encode(typed.encode()) == rec.body_bytes, (path.name, rec.seq)
            kinds.add(rec.kind)
    assert {"instantiated", "step_done", "dormant", "terminated"} <= kinds


def _error(kind: str, body: Any) -> str:
    with pytest.raises(RecordDecodeError) as caught:
        decode_body(kind, body, object_id="obj-9", seq=7)
    assert (caught.value.object_id, caught.value.seq) == ("obj-9", 7)
    return caught.value.reason


STEP = {"pos": 1, "cmd": "step", "name": "s", "attempt": 1, "latency": 0.1, "result": 2}


@pytest.mark.parametrize(("kind", "body", "says"), [
    ("step_exploded", {}, "unknown record kind 'step_exploded'"),
    ("step_done", [1, 2], "not a JSON object"),
    ("step_done", {k: v for k, v in STEP.items() if k != "result"}, "no 'result'"),
    ("step_done", {**STEP, "extra": 1}, "unexpected key 'extra'"),
    ("step_done", {**STEP, "attempt": True}, "'attempt' is a boolean, not an integer"),
    ("step_done", {**STEP, "attempt": "1"}, "'attempt' is a string, not an integer"),
    ("step_done", {**STEP, "pos": 1.0}, "'pos' is 1.0, not a command position"),
    ("step_done", {**STEP, "pos": "1.x"}, "not a command position"),
    ("step_done", {**STEP, "pos": -1}, "not a command position"),
    ("step_done", {**STEP, "cmd": "wait"}, "'cmd' is 'wait', not 'step'"),
    ("step_done", {**STEP, "latency": None}, "'latency' is null, not a number"),
    ("event_received", {"pos": 1, "cmd": "wait", "name": "e", "event_id": 1,
                        "payload": 1, "event_hash": None}, "'event_hash' is null"),
    ("dormant", {"pos": 1, "cmd": "nap", "reason": "x", "wake_at": None}, "'cmd' is 'nap'"),
    ("dormant", {"pos": 1, "cmd": "sleep", "reason": "sleep", "wake_at": 1.0},
     "no 'seconds'"),
    ("dormant", {"pos": 1, "cmd": "sleep", "reason": "sleep", "wake_at": 1.0,
                 "seconds": 1.0, "event": "x"}, "unexpected key 'event'"),
    ("dormant", {"pos": 1, "cmd": "join", "name": "a", "reason": "children",
                 "children": ["a", 2], "event": "e", "wake_at": None},
     "'children' holds something other than strings"),
    ("terminated", {"outcome": "exploded"}, "'outcome' is 'exploded'"),
    ("terminated", {"outcome": "failed", "reason": "r", "error": {}, "result": 1},
     "unexpected key 'result'"),
    ("terminated", {"outcome": "completed"}, "no 'result'"),
    ("value", {"pos": 1, "cmd": "dice", "value": 4}, "'cmd' is 'dice'"),
    ("instantiated", {"intent": {**INTENT.to_body(), "agent": 5},
                      "context": CONTEXT.to_body()}, "'intent.agent' is an integer"),
    ("instantiated", {"intent": {k: v for k, v in INTENT.to_body().items() if k != "goal"},
                      "context": CONTEXT.to_body()}, "no 'intent.goal'"),
    ("instantiated", {"intent": INTENT.to_body(),
                      "context": {**CONTEXT.to_body(), "extra": 1}},
     "unexpected key 'extra' in 'context'"),
    ("instantiated", {"intent": INTENT.to_body(),
                      "context": {**CONTEXT.to_body(), "labels": {"a": 1}}},
     "'context.labels' holds a value that is not a string"),
    ("intent_refined", {"intent": INTENT.to_body(), "changes": {}}, "no 'event_id'"),
    ("progress", {"fields": [1]}, "'fields' is a list, not an object"),
    ("tool_proposed", {"pos": 5, "cmd": "tool", "name": "send", "proposal": "5:0",
                       "revision": 0, "call_id": "c1", "args": {"to": "bob"},
                       "args_hash": "ab", "model_call": "4"},
     "'args' is an object, not a string or a sealed value"),
])
def test_malformed_bodies_fail_closed(kind: str, body: Any, says: str) -> None:
    """Nothing undecodable becomes a default: each problem is a ``RecordDecodeError``
    naming the record and what is wrong."""
    reason = _error(kind, body)
    assert says in reason, reason


def test_the_error_message_names_object_record_and_kind() -> None:
    """The message says which object, which record, which kind and which key."""
    with pytest.raises(RecordDecodeError, match=r"object 'obj-9': record #7 cannot be decoded "
                       r"\(step_done body: no 'result'\)"):
        decode_body("step_done", {k: v for k, v in STEP.items() if k != "result"},
                    object_id="obj-9", seq=7)


def test_numbers_keep_their_type() -> None:
    """An integer stays an integer and a float a float: ``5`` and ``5.0`` differ in bytes."""
    for latency in (1, 1.0):
        body = {**STEP, "latency": latency}
        typed = decode_body("step_done", body, object_id="o", seq=2)
        assert encode(typed.encode()) == encode(body)
