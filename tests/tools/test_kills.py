"""The agent loop survives SIGKILL at every point that matters: between the model's reply
and the gate, between a person's approval and the tool, during a tool, during a parallel
batch. Real worker processes, real SDK and HTTP against the scripted server, both stores.

Each run completes with every tool effect exactly once in the sink (one row per
idempotency key) and no model turn asked twice (the scripted server counts requests).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import perdure
from perdure.core.bodies import decode
from perdure.core.codec import encode
from perdure.llm.scripted import ScriptedReply, ScriptedServer, ScriptedToolCall
from tests.integration.engine_support import kill_process, wait_until
from tests.tools import support
from tests.tools.support import effects, runs, start_tool_worker


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as running:
        yield running


def _app(make_app: Callable[..., perdure.App]) -> perdure.App:
    app = make_app()
    app.agent(name="tool_agent")(support.tool_agent)
    for tool in support.app.tools.values():
        app.tool(tool)
    return app


def _killed_at(store_url: str, key_dir: Path, tmp_path: Path, sink: Path, object_id: str,
               kind: str, before_kill: Callable[[], None] | None = None) -> None:
    """Run a worker subprocess until memory of ``object_id`` ends with ``kind`` (the
    worker stalls right there), then SIGKILL it."""
    mark = tmp_path / f"stalled-{kind}"
    log = tmp_path / "worker.log"
    proc = start_tool_worker(store_url, key_dir, log, sink, stall=(object_id, kind, mark))
    try:
        if before_kill is not None:
            before_kill()
        assert wait_until(mark.exists, timeout=30), log.read_text()
    finally:
        kill_process(proc)


def _finish(app: perdure.App, object_id: str) -> dict[str, object]:
    with app.background_worker():
        result = app.handle(object_id).result(timeout=30)
    assert isinstance(result, dict)
    assert app.verify(object_id).ok
    for rec in app.history(object_id):  # every body is one its kind writes, byte for byte
        assert encode(decode(rec).encode()) == rec.body_bytes, (rec.seq, rec.kind)
    return result


def _model_calls(app: perdure.App, object_id: str) -> int:
    return sum(r.kind == "model_call" for r in app.history(object_id))


def test_killed_between_the_models_reply_and_the_gate(
        make_app: Callable[..., perdure.App], server: ScriptedServer, store_url: str,
        key_dir: Path, tmp_path: Path, sink: Path) -> None:
    server.script(
        ScriptedReply(tool_calls=(ScriptedToolCall(
            "write_note", json.dumps({"path": "/notes/k", "text": "once"}), "c1"),)),
        ScriptedReply(text="Noted."))
    app = _app(make_app)
    app.options(object_id="kill-gate").start("tool_agent", server.openai_base_url, "go")
    _killed_at(store_url, key_dir, tmp_path, sink, "kill-gate", "model_call")
    kinds = [r.kind for r in app.history("kill-gate")]
    assert kinds[-1] == "model_call" and "tool_proposed" not in kinds
    result = _finish(app, "kill-gate")
    assert result["text"] == "Noted."
    assert [e[:2] for e in effects(sink)] == [("write_note", "/notes/k=once")]
    assert len(server.requests) == 2 == _model_calls(app, "kill-gate")


def test_killed_between_approval_and_execution(
        make_app: Callable[..., perdure.App], server: ScriptedServer, store_url: str,
        key_dir: Path, tmp_path: Path, sink: Path) -> None:
    server.script(
        ScriptedReply(tool_calls=(ScriptedToolCall(
            "send_message", json.dumps({"to": "ops", "body": "deploy"}), "c1"),)),
        ScriptedReply(text="Sent."))
    app = _app(make_app)
    app.options(object_id="kill-appr").start("tool_agent", server.openai_base_url, "go")

    def approve_when_asked() -> None:
        assert wait_until(lambda: bool(app.approvals()), timeout=30)
        assert app.get("kill-appr").lease_owner is None  # dormant: no lease held
        app.approve("kill-appr", app.approvals()[0].proposal_id)

    _killed_at(store_url, key_dir, tmp_path, sink, "kill-appr", "tool_decided",
               approve_when_asked)
    assert not sink.exists() or effects(sink) == []
    result = _finish(app, "kill-appr")
    assert result["calls"] == [["send_message", "done", None]]
    assert [e[:2] for e in effects(sink)] == [("send_message", "ops:deploy")]
    assert runs(sink) == 1
    assert len(server.requests) == 2 == _model_calls(app, "kill-appr")


def test_killed_during_a_tool(
        make_app: Callable[..., perdure.App], server: ScriptedServer, store_url: str,
        key_dir: Path, tmp_path: Path, sink: Path) -> None:
    """The tool made its effect, the worker died before its result was recorded: the
    tool runs again with the same idempotency key, and the sink keeps one effect."""
    server.script(
        ScriptedReply(tool_calls=(ScriptedToolCall(
            "slow_write", json.dumps({"label": "L", "seconds": 2.5}), "c1"),)),
        ScriptedReply(text="Stored."))
    app = _app(make_app)
    app.options(object_id="kill-tool").start("tool_agent", server.openai_base_url, "go")
    log = tmp_path / "worker.log"
    proc = start_tool_worker(store_url, key_dir, log, sink)
    try:
        assert wait_until(lambda: sink.exists() and runs(sink) == 1, timeout=30), \
            log.read_text()
    finally:
        kill_process(proc)
    assert "tool_result" not in [r.kind for r in app.history("kill-tool")]
    result = _finish(app, "kill-tool")
    assert result["calls"] == [["slow_write", "done", None]]
    assert len(effects(sink)) == 1 and runs(sink) == 2  # ran twice, one effect by its key
    assert len(server.requests) == 2 == _model_calls(app, "kill-tool")


def test_killed_during_a_parallel_batch(
        make_app: Callable[..., perdure.App], server: ScriptedServer, store_url: str,
        key_dir: Path, tmp_path: Path, sink: Path) -> None:
    """Three calls in one turn as gathered branches; the worker dies after one result is
    recorded: the finished branch is not run again, the others complete once each."""
    server.script(
        ScriptedReply(tool_calls=(
            ScriptedToolCall("slow_write", json.dumps({"label": "fast", "seconds": 0}), "a"),
            ScriptedToolCall("slow_write", json.dumps({"label": "slow", "seconds": 2.5}),
                             "b"),
            ScriptedToolCall("lookup", json.dumps({"city": "Rome"}), "c"))),
        ScriptedReply(text="Batch done."))
    app = _app(make_app)
    app.options(object_id="kill-batch").start("tool_agent", server.openai_base_url, "go")
    _killed_at(store_url, key_dir, tmp_path, sink, "kill-batch", "tool_result")
    assert sum(r.kind == "tool_result" for r in app.history("kill-batch")) >= 1
    result = _finish(app, "kill-batch")
    assert [c[:2] for c in result["calls"]] == [["slow_write", "done"]] * 2 + [
        ["lookup", "done"]]
    assert sorted(e[1] for e in effects(sink)) == ["fast", "slow"]
    assert sum(r.kind == "tool_result" for r in app.history("kill-batch")) == 3
    assert len(server.requests) == 2 == _model_calls(app, "kill-batch")
    tool_messages = [m for m in server.requests[1].body["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == ["a", "b", "c"]


def test_a_non_idempotent_tool_killed_after_it_started_is_in_doubt_never_rerun(
        make_app: Callable[..., perdure.App], server: ScriptedServer, store_url: str,
        key_dir: Path, tmp_path: Path, sink: Path) -> None:
    """``delete`` is not idempotent: ``tool_started`` is recorded before it runs; a worker
    killed after that leaves the call in doubt, the model is told so, and it never runs a
    second time."""
    server.script(
        ScriptedReply(tool_calls=(ScriptedToolCall(
            "delete", json.dumps({"path": "/tmp/x"}), "c1"),)),
        ScriptedReply(text="Checked."))
    app = _app(make_app)
    app.options(object_id="kill-doubt").start("tool_agent", server.openai_base_url, "go")

    def approve_when_asked() -> None:
        assert wait_until(lambda: bool(app.approvals()), timeout=30)
        app.approve("kill-doubt", app.approvals()[0].proposal_id)

    _killed_at(store_url, key_dir, tmp_path, sink, "kill-doubt", "tool_started",
               approve_when_asked)
    result = _finish(app, "kill-doubt")
    assert result["calls"][0][:2] == ["delete", "in_doubt"]
    assert not sink.exists() or runs(sink) == 0  # stalled before its body ran; not rerun
    tool_msg = next(m for m in server.requests[1].body["messages"] if m["role"] == "tool")
    assert tool_msg["content"].startswith("[in_doubt]")
