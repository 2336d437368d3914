"""People deciding on tool calls, in one process on both stores: reject, edit (re-gated,
same tool only), identities per risk level, expiry, decisions that cannot count."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import perdure
from perdure.cli import cli
from perdure.core.approvals import decision_problem
from perdure.core.bodies import decode
from perdure.core.codec import encode
from perdure.core.events import APPROVAL_EVENT
from perdure.llm.scripted import ScriptedReply, ScriptedServer, ScriptedToolCall
from tests.integration.engine_support import wait_until
from tests.tools import support
from tests.tools.support import effects


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as running:
        yield running


def _app(make_app: Callable[..., perdure.App], **options: object) -> perdure.App:
    app = make_app(**options)
    for name in ("tool_agent", "strict_agent"):
        app.agent(name=name)(support.app.agents[name].fn)
    for tool in support.app.tools.values():
        app.tool(tool)
    return app


def _send(to: str = "bob") -> ScriptedReply:
    return ScriptedReply(tool_calls=(
        ScriptedToolCall("send_message", json.dumps({"to": to, "body": "hi"}), "c1"),))


def _pending(app: perdure.App, object_id: str) -> perdure.PendingApproval:
    assert wait_until(lambda: any(p.object_id == object_id for p in app.approvals()),
                      timeout=15)
    [found] = [p for p in app.approvals() if p.object_id == object_id]
    return found


def _sink_effects(sink: Path) -> list[tuple[str, str, str]]:
    """The effects so far: none while the sink is not made yet (the file exists a moment
    before its table does)."""
    try:
        return effects(sink) if sink.exists() else []
    except sqlite3.OperationalError:
        return []


def test_a_rejected_call_never_runs_and_the_model_sees_the_reason(
        make_app: Callable[..., perdure.App], server: ScriptedServer, sink: Path) -> None:
    server.script(_send(), ScriptedReply(text="Understood."))
    app = _app(make_app)
    app.options(object_id="rej-1").start("tool_agent", server.openai_base_url, "go")
    with app.background_worker():
        pending = _pending(app, "rej-1")
        app.reject("rej-1", pending.proposal_id, reason="not to bob, ever")
        result = app.handle("rej-1").result(timeout=20)
        with pytest.raises(perdure.ApprovalError, match="no proposal"):
            app.approve("rej-1", pending.proposal_id)
    assert result["calls"][0][:2] == ["send_message", "rejected"]
    tool_msg = next(m for m in server.requests[1].body["messages"] if m["role"] == "tool")
    assert "not to bob, ever" in tool_msg["content"]
    assert _sink_effects(sink) == []


def test_an_edit_is_regated_and_cannot_switch_tools(
        make_app: Callable[..., perdure.App], server: ScriptedServer, sink: Path) -> None:
    """The edited arguments run (approved by the editor), under a new proposal id whose
    record names the one it edits; a decision naming another tool is refused on record."""
    server.script(_send("bob"), ScriptedReply(text="Done."))
    app = _app(make_app)
    app.options(object_id="edit-1").start("tool_agent", server.openai_base_url, "go")
    with app.background_worker():
        pending = _pending(app, "edit-1")
        forged = encode({"proposal": pending.proposal_id, "args_hash": pending.args_hash,
                         "tool": "delete", "decision": "edit", "edit": {"path": "/"}})
        app.store.send("edit-1", "perdure:approval", forged, None, time.time(),
                       app.client.seal_event("edit-1", "perdure:approval", forged, None))
        assert wait_until(lambda: any(r.kind == "event_refused"
                                      for r in app.history("edit-1")), timeout=15)
        assert wait_until(lambda: [p.proposal_id for p in app.approvals()]
                          == [pending.proposal_id], timeout=15)  # still waiting
        app.approve("edit-1", pending.proposal_id, edit={"to": "carol", "body": "hi"})
        result = app.handle("edit-1").result(timeout=20)
    assert result["calls"][0][:2] == ["send_message", "done"]
    assert [e[1] for e in effects(sink)] == ["carol:hi"]
    history = app.history("edit-1")
    refused = next(r.body for r in history if r.kind == "event_refused")
    assert "cannot turn a call of 'send_message' into another tool" in refused["reason"]
    proposals = [r.body for r in history if r.kind == "tool_proposed"]
    assert [p["proposal"] for p in proposals] == ["1:0", "1:1"]
    assert proposals[1]["edited_from"] == "1:0" and "carol" in proposals[1]["args"]
    decided = [r.body["decision"] for r in history if r.kind == "tool_decided"]
    assert decided == ["edit", "approve"]
    assert app.verify("edit-1").ok
    for rec in history:  # every body is one its kind writes, byte for byte
        assert encode(decode(rec).encode()) == rec.body_bytes, (rec.seq, rec.kind)
    for rec in (r for r in history if r.kind == "tool_decided"):
        assert decision_problem(rec) is None  # the signed evidence holds, from memory
        forged = rec._replace(body={**rec.body, "args_hash": "0" * 64})
        assert decision_problem(forged) is not None


def test_an_edit_that_breaks_a_rule_is_denied(
        make_app: Callable[..., perdure.App], server: ScriptedServer, sink: Path) -> None:
    """A person's edit goes through the gate again: arguments the tool's schema does not
    take are denied, and nothing runs."""
    server.script(_send(), ScriptedReply(text="ok"))
    app = _app(make_app)
    app.options(object_id="edit-2").start("tool_agent", server.openai_base_url, "go")
    with app.background_worker():
        pending = _pending(app, "edit-2")
        app.approve("edit-2", pending.proposal_id,
                    edit={"to": "bob", "body": "hi", "bcc": "everyone"})
        result = app.handle("edit-2").result(timeout=20)
    assert result["calls"][0][:2] == ["send_message", "denied"]
    assert "unknown key 'bcc'" in result["calls"][0][2]
    gated = [r.body["verdict"] for r in app.history("edit-2") if r.kind == "tool_gated"]
    assert gated == ["approval", "deny"]
    assert _sink_effects(sink) == []


def test_only_allowed_identities_may_approve(
        make_app: Callable[..., perdure.App], server: ScriptedServer, sink: Path,
        tmp_path: Path) -> None:
    """Under a policy where only ``alice`` approves high-risk calls, another client's
    approval is refused by the sender's policy at once; one that skips that policy (sent
    straight into the inbox) is refused on record by the object and the call keeps
    waiting; alice's counts."""
    server.script(_send(), ScriptedReply(text="Sent."))
    app = _app(make_app)
    alice = _app(make_app, node_id="alice")
    app.options(object_id="who-1").start("strict_agent", server.openai_base_url, "go")
    with app.background_worker():
        pending = _pending(app, "who-1")
        assert pending.approvers == ("alice",)
        with pytest.raises(perdure.ApprovalError, match="may not decide on high-risk calls"):
            app.approve("who-1", pending.proposal_id)
        payload = encode({"proposal": pending.proposal_id, "args_hash": pending.args_hash,
                          "tool": pending.tool, "decision": "approve", "reason": "",
                          "decided_at": time.time()})
        assert app.client.send("who-1", APPROVAL_EVENT, payload, None)
        assert wait_until(lambda: any(r.kind == "event_refused"
                                      for r in app.history("who-1")), timeout=15)
        refused = next(r.body for r in app.history("who-1") if r.kind == "event_refused")
        assert "may not decide on high-risk calls" in refused["reason"]
        assert _sink_effects(sink) == []
        alice.approve("who-1", pending.proposal_id)
        result = app.handle("who-1").result(timeout=20)
    assert result["calls"][0][:2] == ["send_message", "done"]
    [decided] = [r.body for r in app.history("who-1") if r.kind == "tool_decided"]
    assert decided["identity"] == "alice" and decided["decision"] == "approve"
    assert len(effects(sink)) == 1


def test_an_approval_expires_and_counts_as_rejected(
        make_app: Callable[..., perdure.App], server: ScriptedServer, sink: Path) -> None:
    server.script(_send(), ScriptedReply(text="Too late."))
    app = _app(make_app)
    app.options(object_id="exp-1").start("strict_agent", server.openai_base_url, "go", 1.0)
    with app.background_worker():
        result = app.handle("exp-1").result(timeout=20)
    assert result["calls"][0][:2] == ["send_message", "expired"]
    decided = [r.body for r in app.history("exp-1") if r.kind == "tool_decided"]
    assert decided[0]["decision"] == "expire"
    assert _sink_effects(sink) == []


def test_the_cli_lists_approves_and_rejects(
        make_app: Callable[..., perdure.App], server: ScriptedServer, sink: Path,
        store_url: str, key_dir: Path) -> None:
    server.script(_send(), ScriptedReply(text="Sent."))
    app = _app(make_app)
    app.options(object_id="cli-1").start("tool_agent", server.openai_base_url, "go")
    runner = CliRunner()
    base = ["--store", store_url, "--key-dir", str(key_dir)]
    with app.background_worker():
        pending = _pending(app, "cli-1")
        shown = runner.invoke(cli, [*base, "approvals"])
        assert shown.exit_code == 0, shown.output
        assert "cli-1  proposal 1:0  send_message  risk high" in shown.output
        assert '"to": "bob"' in shown.output
        as_json = json.loads(runner.invoke(cli, [*base, "approvals", "--json"]).output)
        assert as_json[0]["arguments"] == {"body": "hi", "to": "bob"}
        bad = runner.invoke(cli, [*base, "approve", "cli-1", pending.proposal_id, "--edit",
                                  "[1]"])
        assert bad.exit_code != 0
        done = runner.invoke(cli, [*base, "approve", "cli-1", pending.proposal_id])
        assert done.exit_code == 0, done.output
        assert app.handle("cli-1").result(timeout=20)["calls"][0][1] == "done"
    assert [e[0] for e in effects(sink)] == ["send_message"]


def test_a_decision_naming_other_arguments_is_refused(
        make_app: Callable[..., perdure.App], server: ScriptedServer, sink: Path) -> None:
    """An approval whose argument hash is not the proposal's (arguments changed after
    approval) does not count: refused on record, the call still waits."""
    server.script(_send(), ScriptedReply(text="ok"))
    app = _app(make_app)
    app.options(object_id="hash-1").start("tool_agent", server.openai_base_url, "go")
    with app.background_worker():
        pending = _pending(app, "hash-1")
        forged = encode({"proposal": pending.proposal_id, "args_hash": "0" * 64,
                         "tool": "send_message", "decision": "approve"})
        app.store.send("hash-1", "perdure:approval", forged, None, time.time(),
                       app.client.seal_event("hash-1", "perdure:approval", forged, None))
        assert wait_until(lambda: any(r.kind == "event_refused"
                                      for r in app.history("hash-1")), timeout=15)
        refused = next(r.body for r in app.history("hash-1") if r.kind == "event_refused")
        assert "arguments changed after approval" in refused["reason"]
        assert wait_until(lambda: [p.proposal_id for p in app.approvals()]
                          == [pending.proposal_id], timeout=15)  # dormant again, waiting
        unsealed = encode({"proposal": pending.proposal_id, "args_hash": pending.args_hash,
                           "tool": "send_message", "decision": "approve"})
        app.store.send("hash-1", "perdure:approval", unsealed, None, time.time(), b"junk")
        assert wait_until(lambda: sum(r.kind == "event_refused"
                                      for r in app.history("hash-1")) == 2, timeout=15)
        assert _sink_effects(sink) == []
        app.reject("hash-1", pending.proposal_id, reason="no")
        assert app.handle("hash-1").result(timeout=20)["calls"][0][1] == "rejected"
    assert app.verify("hash-1").ok


def test_hostile_model_output_is_denied_and_failures_are_told(
        make_app: Callable[..., perdure.App], server: ScriptedServer, sink: Path) -> None:
    """Arguments that are not JSON, or not an object, are denied; a tool that raises is
    recorded as failed and the model is told the error; nothing crashes the loop."""
    server.script(
        ScriptedReply(tool_calls=(
            ScriptedToolCall("lookup", "{not json", "a"),
            ScriptedToolCall("lookup", "[1, 2]", "b"),
            ScriptedToolCall("write_note", json.dumps({"path": "/notes/x"}), "c"))),
        ScriptedReply(text="fine"))
    app = _app(make_app)
    app.options(object_id="bad-1").start("tool_agent", server.openai_base_url, "go")
    with app.background_worker():
        result = app.handle("bad-1").result(timeout=20)
    assert [c[1] for c in result["calls"]] == ["denied", "denied", "denied"]
    assert "not a JSON object" in result["calls"][0][2]
    assert "lacks the required key 'text'" in result["calls"][2][2]
    proposals = [r.body for r in app.history("bad-1") if r.kind == "tool_proposed"]
    assert proposals[0]["args"] == json.dumps("{not json")


def test_the_memory_renders_in_perdure_show(
        make_app: Callable[..., perdure.App], server: ScriptedServer, sink: Path,
        store_url: str, key_dir: Path) -> None:
    server.script(_send(), ScriptedReply(text="ok"))
    app = _app(make_app)
    app.options(object_id="show-1").start("tool_agent", server.openai_base_url, "go")
    with app.background_worker():
        pending = _pending(app, "show-1")
        app.approve("show-1", pending.proposal_id)
        app.handle("show-1").result(timeout=20)
    shown = CliRunner().invoke(cli, ["--store", store_url, "--key-dir", str(key_dir),
                                     "show", "show-1"])
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.output.split())
    assert "needs approval" in text and "approved by" in text
    assert "sent to bob" in text


def test_two_risky_calls_of_one_turn_wait_and_are_decided_in_any_order(
        make_app: Callable[..., perdure.App], server: ScriptedServer, sink: Path) -> None:
    """Parallel calls needing people: both listed; the second approved first runs at once
    while the first still waits; each runs once."""
    server.script(ScriptedReply(tool_calls=(
        ScriptedToolCall("send_message", json.dumps({"to": "ann", "body": "1"}), "a"),
        ScriptedToolCall("send_message", json.dumps({"to": "ben", "body": "2"}), "b"))),
        ScriptedReply(text="both"))
    app = _app(make_app)
    app.options(object_id="two-1").start("tool_agent", server.openai_base_url, "go")
    with app.background_worker():
        assert wait_until(lambda: len(app.approvals()) == 2, timeout=15)
        first, second = sorted(app.approvals(), key=lambda p: p.proposal_id)
        assert (first.arguments["to"], second.arguments["to"]) == ("ann", "ben")
        app.approve("two-1", second.proposal_id)
        assert wait_until(lambda: [e[1] for e in _sink_effects(sink)] == ["ben:2"],
                          timeout=15)
        assert wait_until(lambda: [p.proposal_id for p in app.approvals()]
                          == [first.proposal_id], timeout=15)
        app.reject("two-1", first.proposal_id, reason="not ann")
        result = app.handle("two-1").result(timeout=20)
    assert [c[:2] for c in result["calls"]] == [["send_message", "rejected"],
                                                ["send_message", "done"]]
    assert [e[1] for e in effects(sink)] == ["ben:2"]
    assert len(server.requests) == 2
