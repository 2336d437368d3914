"""A Pydantic AI agent run through perdure: its model requests are recorded model calls,
its tool calls go through the gate and a person, and a resumed run asks nothing twice."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.importorskip("pydantic_ai")

from pydantic_ai import Agent

import perdure
from perdure.adapters.pydantic_ai import run_pydantic_agent
from perdure.llm import ChatCompletionsClient
from perdure.llm.scripted import ScriptedReply, ScriptedServer, ScriptedToolCall
from tests.integration.engine_support import wait_until

SENT: list[str] = []

helper = Agent(None, instructions="You help with arithmetic and messages.")


@helper.tool_plain
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@helper.tool_plain
def send(to: str, text: str) -> str:
    """Send a message."""
    SENT.append(f"{to}:{text}")
    return "sent"


POLICY = perdure.Policy("pa", rules=(perdure.Allow({"add", "send"}),))


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as running:
        yield running


def test_a_pydantic_ai_agent_runs_through_the_gate(
        make_app: Callable[..., perdure.App], server: ScriptedServer, tmp_path: Path) -> None:
    SENT.clear()
    app = make_app()

    @app.agent(name="pa_agent")
    async def pa_agent(run: perdure.Run, base_url: str) -> str:
        client = ChatCompletionsClient(base_url=base_url, api_key=lambda: "test")
        try:
            result = await run_pydantic_agent(run, helper, "What is 2+3? Tell bob.",
                                              client=client, model="gpt-4o", policy=POLICY,
                                              risks={"send": "high"})
        finally:
            await client.aclose()
        return str(result.output)

    server.script(
        ScriptedReply(tool_calls=(ScriptedToolCall("add", json.dumps({"a": 2, "b": 3}),
                                                   "c1"),)),
        ScriptedReply(tool_calls=(ScriptedToolCall("send", json.dumps(
            {"to": "bob", "text": "5"}), "c2"),)),
        ScriptedReply(text="2+3 is 5; bob knows."))
    app.options(object_id="pa-1").start("pa_agent", server.openai_base_url)
    with app.background_worker():
        assert wait_until(lambda: bool(app.approvals()), timeout=30)
        [pending] = app.approvals()
        assert pending.tool == "send" and pending.risk == "high"
        assert SENT == []
        app.approve("pa-1", pending.proposal_id)
        assert app.handle("pa-1").result(timeout=30) == "2+3 is 5; bob knows."
    assert SENT == ["bob:5"]
    history = app.history("pa-1")
    assert sum(r.kind == "model_call" for r in history) == 3 == len(server.requests)
    assert [r.body["outcome"] for r in history if r.kind == "tool_result"] == ["done", "done"]
    first = server.requests[0].body
    assert first["messages"][0] == {"role": "system",
                                    "content": "You help with arithmetic and messages."}
    assert {t["function"]["name"] for t in first["tools"]} == {"add", "send"}
    second = server.requests[1].body["messages"]
    assert second[-1]["role"] == "tool" and second[-1]["content"] == "5"
    assert app.verify("pa-1").ok


def test_a_denied_call_is_told_to_the_pydantic_ai_agent(
        make_app: Callable[..., perdure.App], server: ScriptedServer) -> None:
    app = make_app()
    only_add = perdure.Policy("only-add", rules=(perdure.Allow({"add"}),))

    @app.agent(name="pa_deny")
    async def pa_deny(run: perdure.Run, base_url: str) -> str:
        client = ChatCompletionsClient(base_url=base_url, api_key=lambda: "test")
        try:
            result = await run_pydantic_agent(run, helper, "Tell bob.", client=client,
                                              model="gpt-4o", policy=only_add)
        finally:
            await client.aclose()
        return str(result.output)

    server.script(
        ScriptedReply(tool_calls=(ScriptedToolCall("send", json.dumps(
            {"to": "bob", "text": "hi"}), "c1"),)),
        ScriptedReply(text="I may not send messages."))
    app.options(object_id="pa-2").start("pa_deny", server.openai_base_url)
    with app.background_worker():
        assert app.handle("pa-2").result(timeout=30) == "I may not send messages."
    told = server.requests[1].body["messages"][-1]
    assert told["role"] == "tool" and told["content"].startswith("[denied]")


def test_a_pydantic_ai_agent_killed_mid_turn_resumes_without_asking_twice(
        make_app: Callable[..., perdure.App], server: ScriptedServer, store_url: str,
        key_dir: Path, tmp_path: Path, sink: Path) -> None:
    """A worker running the Pydantic AI agent is SIGKILLed right after the first of two
    tool calls of a turn is recorded: the resumed run gets the model's reply and the
    finished call from memory, runs the other once, and the model is asked once a turn."""
    from tests.integration.engine_support import kill_process
    from tests.tools import pa_support
    from tests.tools.support import effects, start_tool_worker

    server.script(
        ScriptedReply(tool_calls=(ScriptedToolCall("note", json.dumps({"text": "a"}), "c1"),
                                  ScriptedToolCall("note", json.dumps({"text": "b"}), "c2"))),
        ScriptedReply(text="Both noted."))
    app = make_app()
    app.agent(name="pa_notes")(pa_support.pa_notes)
    app.options(object_id="pa-kill").start("pa_notes", server.openai_base_url)
    mark = tmp_path / "stalled"
    log = tmp_path / "worker.log"
    proc = start_tool_worker(store_url, key_dir, log, sink,
                             stall=("pa-kill", "tool_result", mark),
                             app_ref="tests.tools.pa_support:app")
    try:
        assert wait_until(mark.exists, timeout=60), log.read_text()
    finally:
        kill_process(proc)
    assert sum(r.kind == "tool_result" for r in app.history("pa-kill")) == 1
    with app.background_worker():
        assert app.handle("pa-kill").result(timeout=30) == "Both noted."
    assert sorted(e[1] for e in effects(sink)) == ["a", "b"]
    history = app.history("pa-kill")
    assert sum(r.kind == "model_call" for r in history) == 2 == len(server.requests)
    assert sum(r.kind == "tool_result" for r in history) == 2
    assert app.verify("pa-kill").ok
