"""A decision made after a proposal's deadline never runs the tool, whatever order a node
sees the deadline and the decision in. Real worker processes, stopped before the deadline;
decisions sent while none runs; a worker started afterwards decides from memory and the
signed decision alone (both stores)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import perdure
from perdure.core.approvals import decision_problem
from perdure.core.codec import encode
from perdure.llm.scripted import ScriptedReply, ScriptedServer, ScriptedToolCall
from tests.integration.engine_support import REPO_ROOT, kill_process, wait_until
from tests.tools import support
from tests.tools.support import effects, start_tool_worker

pytestmark = pytest.mark.timeout(180)

TTL = 4.0


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as running:
        yield running


def _app(make_app: Callable[..., perdure.App], **options: object) -> perdure.App:
    app = make_app(**options)
    app.agent(name="strict_agent")(support.app.agents["strict_agent"].fn)
    for tool in support.app.tools.values():
        app.tool(tool)
    return app


def _send() -> ScriptedReply:
    return ScriptedReply(tool_calls=(
        ScriptedToolCall("send_message", json.dumps({"to": "bob", "body": "hi"}), "c1"),))


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop a worker as an operator would (SIGTERM), SIGKILL if it lingers."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        kill_process(proc)


def _asked_then_stopped(app: perdure.App, store_url: str, key_dir: Path, tmp_path: Path,
                        sink: Path, object_id: str, base_url: str
                        ) -> perdure.PendingApproval:
    """A worker process runs ``object_id`` until its call waits for a person, then every
    worker is stopped, before the deadline."""
    app.options(object_id=object_id).start("strict_agent", base_url, "go", TTL)
    proc = start_tool_worker(store_url, key_dir, tmp_path / "worker-1.log", sink)
    try:
        assert wait_until(lambda: any(p.object_id == object_id for p in app.approvals()),
                          timeout=30), (tmp_path / "worker-1.log").read_text()
    finally:
        _stop(proc)
    [pending] = [p for p in app.approvals() if p.object_id == object_id]
    assert pending.expires_at is not None and time.time() < pending.expires_at
    return pending


def _finish(store_url: str, key_dir: Path, tmp_path: Path, sink: Path, app: perdure.App,
            object_id: str) -> dict[str, object]:
    """Start a worker process now and wait for the object's result."""
    proc = start_tool_worker(store_url, key_dir, tmp_path / "worker-2.log", sink)
    try:
        result = app.handle(object_id).result(timeout=60)
    finally:
        _stop(proc)
    assert isinstance(result, dict)
    return result


def test_a_decision_after_the_deadline_never_runs_the_tool(
        make_app: Callable[..., perdure.App], server: ScriptedServer, sink: Path,
        store_url: str, key_dir: Path, tmp_path: Path) -> None:
    server.script(_send(), ScriptedReply(text="Too late."))
    app = _app(make_app)
    alice = _app(make_app, node_id="alice")  # the one identity allowed to approve
    pending = _asked_then_stopped(app, store_url, key_dir, tmp_path, sink, "late-1",
                                  server.openai_base_url)
    deadline = float(pending.expires_at or 0)
    assert wait_until(lambda: time.time() > deadline + 0.5, timeout=TTL + 5)

    # The senders know the deadline: they refuse, and send nothing.
    with pytest.raises(perdure.ApprovalExpiredError, match="counts as rejected"):
        alice.approve("late-1", pending.proposal_id)
    base = ["--store", store_url, "--key-dir", str(key_dir), "--node-id", "alice"]
    typed = subprocess.run([sys.executable, "-m", "perdure", *base, "approve", "late-1",
                            pending.proposal_id], cwd=REPO_ROOT, capture_output=True,
                           text=True, timeout=60, check=False)
    assert typed.returncode != 0
    said = (typed.stdout + typed.stderr).strip().splitlines()
    assert len(said) == 1 and "expired" in said[0] and "counts as rejected" in said[0], said
    assert app.store.pending_events("late-1") == []
    listed = subprocess.run([sys.executable, "-m", "perdure", *base, "approvals"],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
                            check=True).stdout
    assert "late-1  proposal 1:0" in listed and "(passed: counts as rejected" in listed

    # A sender that could not know (another clock, a race) signs a decision anyway; and
    # one signs no time at all.
    for said in ({"decided_at": time.time()}, {}):
        payload = encode({"proposal": pending.proposal_id, "args_hash": pending.args_hash,
                          "tool": "send_message", "decision": "approve", "reason": "",
                          **said})
        dedupe = f"late:{len(said)}"
        alice.store.send("late-1", "perdure:approval", payload, dedupe, time.time(),
                         alice.client.seal_event("late-1", "perdure:approval", payload, dedupe))

    result = _finish(store_url, key_dir, tmp_path, sink, app, "late-1")
    assert result["calls"] == [["send_message", "expired", result["calls"][0][2]]]  # type: ignore[index]
    assert not sink.exists() or effects(sink) == []
    history = app.history("late-1")
    refused = [r.body["reason"] for r in history if r.kind == "event_refused"]
    assert any("after the proposal's deadline" in why for why in refused), refused
    assert any("carries no signed time" in why for why in refused), refused
    [decided] = [r.body for r in history if r.kind == "tool_decided"]
    assert decided["decision"] == "expire"
    [ended] = [r.body for r in history if r.kind == "tool_result"]
    assert ended["outcome"] == "expired"
    assert app.verify("late-1").ok


def test_a_decision_signed_in_time_counts_when_seen_late(
        make_app: Callable[..., perdure.App], server: ScriptedServer, sink: Path,
        store_url: str, key_dir: Path, tmp_path: Path) -> None:
    """The other order: the decision is made before the deadline while no worker runs,
    and a worker sees it only after the deadline: it counts (it was made in time), and
    memory keeps the signed time that shows it."""
    server.script(_send(), ScriptedReply(text="Sent."))
    app = _app(make_app)
    alice = _app(make_app, node_id="alice")
    pending = _asked_then_stopped(app, store_url, key_dir, tmp_path, sink, "late-2",
                                  server.openai_base_url)
    alice.approve("late-2", pending.proposal_id)
    deadline = float(pending.expires_at or 0)
    assert wait_until(lambda: time.time() > deadline + 0.5, timeout=TTL + 5)
    result = _finish(store_url, key_dir, tmp_path, sink, app, "late-2")
    assert result["calls"][0][:2] == ["send_message", "done"]  # type: ignore[index]
    assert len(effects(sink)) == 1
    history = app.history("late-2")
    [gated] = [r.body for r in history if r.kind == "tool_gated"]
    [decided] = [r for r in history if r.kind == "tool_decided"]
    assert decided.body["decision"] == "approve" and decided.body["identity"] == "alice"
    # Anyone can check again, from memory alone, that it was signed by the deadline.
    assert decision_problem(decided, gated["expires_at"]) is None
    assert "after the proposal's deadline" in str(
        decision_problem(decided, float(gated["expires_at"]) - 3600))
