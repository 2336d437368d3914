"""The durable agent loop in one process, on both stores, against the scripted server:
allowed tools run, denied ones are told to the model, risky ones wait for a person."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import perdure
from perdure.llm.scripted import ScriptedReply, ScriptedServer, ScriptedToolCall
from tests.tools import support
from tests.tools.support import effects


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


def _tool_messages(server: ScriptedServer, index: int) -> list[str]:
    return [m["content"] for m in server.requests[index].body["messages"] if m["role"] == "tool"]


def test_allowed_calls_run_and_their_results_go_back_to_the_model(
        make_app: Callable[..., perdure.App], server: ScriptedServer, sink: Path) -> None:
    """Two calls in one turn run as gathered branches; the next request carries both
    results as tool messages; the final text ends the loop."""
    server.script(
        ScriptedReply(tool_calls=(
            ScriptedToolCall("lookup", json.dumps({"city": "Oslo"}), "c1"),
            ScriptedToolCall("write_note", json.dumps({"path": "/notes/a", "text": "hi"}),
                             "c2"))),
        ScriptedReply(text="All done."))
    app = _app(make_app)
    app.options(object_id="loop-1").start("tool_agent", server.openai_base_url, "plan")
    with app.background_worker():
        result = app.handle("loop-1").result(timeout=20)
    assert result["text"] == "All done." and result["stopped"] == "final"
    assert [c[:2] for c in result["calls"]] == [["lookup", "done"], ["write_note", "done"]]
    sent = _tool_messages(server, 1)
    assert json.loads(sent[0]) == {"city": "Oslo", "weather": "sunny"}
    assert sent[1] == "wrote /notes/a"
    assert server.requests[0].body["tools"][0]["function"]["name"] == "lookup"
    assert [e[0] for e in effects(sink)] == ["write_note"]
    kinds = [r.kind for r in app.history("loop-1")]
    assert kinds.count("tool_proposed") == 2 and kinds.count("tool_result") == 2
    assert app.verify("loop-1").ok


def test_a_denied_call_never_runs_and_the_model_is_told_why(
        make_app: Callable[..., perdure.App], server: ScriptedServer, sink: Path) -> None:
    """A path outside the allowed prefix and an unknown tool are denied; the model gets
    each reason as the tool result, and asks for something else."""
    server.script(
        ScriptedReply(tool_calls=(
            ScriptedToolCall("write_note", json.dumps({"path": "/etc/passwd", "text": "x"}),
                             "c1"),
            ScriptedToolCall("rm_rf", "{}", "c2"))),
        ScriptedReply(text="I could not."))
    app = _app(make_app)
    app.options(object_id="loop-2").start("tool_agent", server.openai_base_url, "plan")
    with app.background_worker():
        result = app.handle("loop-2").result(timeout=20)
    assert [c[:2] for c in result["calls"]] == [["write_note", "denied"], ["rm_rf", "denied"]]
    sent = _tool_messages(server, 1)
    assert sent[0].startswith("[denied]") and "/etc/passwd" in sent[0]
    assert "unknown tool 'rm_rf'" in sent[1]
    assert not Path(sink).exists() or effects(sink) == []
    gated = [r.body for r in app.history("loop-2") if r.kind == "tool_gated"]
    assert {g["verdict"] for g in gated} == {"deny"}
    assert all(g["policy"] == support.POLICY.ref for g in gated)


def test_a_risky_call_waits_dormant_until_a_person_approves(
        make_app: Callable[..., perdure.App], server: ScriptedServer, sink: Path) -> None:
    """A high-risk call makes the object dormant; ``app.approvals()`` lists it; approving
    runs it once, with the approver's identity and key on record."""
    server.script(
        ScriptedReply(tool_calls=(
            ScriptedToolCall("send_message", json.dumps({"to": "bob", "body": "hello"}),
                             "c1"),)),
        ScriptedReply(text="Sent."))
    app = _app(make_app)
    app.options(object_id="loop-3").start("tool_agent", server.openai_base_url, "plan")
    with app.background_worker():
        assert support_wait(lambda: app.get("loop-3").status == "dormant")
        [pending] = app.approvals()
        assert pending.object_id == "loop-3" and pending.tool == "send_message"
        assert pending.arguments == {"body": "hello", "to": "bob"}
        assert pending.risk == "high"
        assert effects(sink) == [] if sink.exists() else True
        app.approve("loop-3", pending.proposal_id)
        result = app.handle("loop-3").result(timeout=20)
    assert result["calls"][0][:2] == ["send_message", "done"]
    assert [e[0] for e in effects(sink)] == ["send_message"]
    [decided] = [r.body for r in app.history("loop-3") if r.kind == "tool_decided"]
    assert decided["decision"] == "approve" and decided["identity"] == app.node_id
    assert decided["key"] and decided["args_hash"] == pending.args_hash
    from perdure.core.approvals import decision_problem

    [record] = [r for r in app.history("loop-3") if r.kind == "tool_decided"]
    assert decision_problem(record) is None
    assert "signed reason" in str(decision_problem(
        record._replace(body={**record.body, "reason": "I never said that"})))
    assert app.approvals() == []
    assert len(server.requests) == 2
    assert app.verify("loop-3").ok


def support_wait(predicate: Callable[[], bool], timeout: float = 15.0) -> bool:
    from tests.integration.engine_support import wait_until

    return wait_until(predicate, timeout=timeout)


def test_limits_stop_the_loop_and_the_ledger_feeds_the_gate(
        make_app: Callable[..., perdure.App], server: ScriptedServer, sink: Path) -> None:
    """``max_turns`` stops the loop after the tools of its last turn ran; a policy's token
    budget (from the ledger: this object's model calls) denies further tool calls."""
    from perdure.llm import ChatCompletionsClient, Message

    app = make_app()
    for tool in support.app.tools.values():
        app.tool(tool)
    tight = perdure.Policy("tight", rules=(perdure.Allow("*"),), max_tokens=1)

    @app.agent(name="limited")
    async def limited(run: perdure.Run, base_url: str, budget: bool) -> list[object]:
        client = ChatCompletionsClient(base_url=base_url, api_key=lambda: "test")
        try:
            result = await run.agent(client, model="gpt-4o", messages=[Message.user("go")],
                                     tools=app.tools,
                                     policy=tight if budget else support.POLICY,
                                     max_turns=1)
        finally:
            await client.aclose()
        return [result.stopped, result.turns, [[c.tool, c.outcome] for c in result.calls]]

    call = ScriptedReply(tool_calls=(ScriptedToolCall("lookup", '{"city": "Oslo"}', "c1"),))
    server.script(call, call)
    app.options(object_id="lim-1").start("limited", server.openai_base_url, False)
    app.options(object_id="lim-2").start("limited", server.openai_base_url, True)
    with app.background_worker():
        assert app.handle("lim-1").result(timeout=20) == ["turns", 1, [["lookup", "done"]]]
        assert app.handle("lim-2").result(timeout=20) == ["turns", 1, [["lookup", "denied"]]]
    [gated] = [r.body for r in app.history("lim-2") if r.kind == "tool_gated"]
    assert gated["reason"].startswith("budget exhausted")
    assert gated["policy"] == tight.ref


def test_a_cost_budget_lets_calls_through_until_the_model_calls_spent_it(
        make_app: Callable[..., perdure.App], server: ScriptedServer, sink: Path) -> None:
    """``Policy(max_cost=...)`` end to end: each model call costs $0.002 at the App's
    prices (1,000 tokens in and out at $1 per million); under a $0.003 budget the lookup
    proposed after the first call runs, the one proposed after the second is denied
    (budget exhausted, with what was spent), and the model is told so."""
    from decimal import Decimal

    from perdure.llm import ChatCompletionsClient, Message, Price, PriceTable

    app = make_app(prices=PriceTable({"gpt-4o": Price("1", "1")}))
    for tool in support.app.tools.values():
        app.tool(tool)
    budget = perdure.Policy("budget", rules=(perdure.Allow({"lookup"}),),
                            max_cost=Decimal("0.003"))

    @app.agent(name="spender")
    async def spender(run: perdure.Run, base_url: str) -> list[list[str]]:
        client = ChatCompletionsClient(base_url=base_url, api_key=lambda: "test")
        try:
            result = await run.agent(client, model="gpt-4o", messages=[Message.user("go")],
                                     tools=app.tools, policy=budget)
        finally:
            await client.aclose()
        return [[c.tool, c.outcome] for c in result.calls]

    def ask(city: str) -> ScriptedReply:
        return ScriptedReply(tool_calls=(ScriptedToolCall("lookup", json.dumps({"city": city}),
                                                          f"c-{city}"),),
                             input_tokens=1000, output_tokens=1000)

    server.script(ask("Oslo"), ask("Rome"),
                  ScriptedReply(text="done", input_tokens=1000, output_tokens=1000))
    app.options(object_id="cost-1").start("spender", server.openai_base_url)
    with app.background_worker():
        assert app.handle("cost-1").result(timeout=20) == [
            ["lookup", "done"], ["lookup", "denied"]]
    gated = [r.body for r in app.history("cost-1") if r.kind == "tool_gated"]
    assert [g["verdict"] for g in gated] == ["allow", "deny"]
    assert gated[1]["reason"] == "budget exhausted: $0.004000 spent of $0.003"
    assert gated[1]["policy"] == budget.ref
    assert _tool_messages(server, 2)[-1].startswith("[denied]")
    assert "budget exhausted" in _tool_messages(server, 2)[-1]


def test_a_cap_per_object_counts_calls_let_through_across_turns(
        make_app: Callable[..., perdure.App], server: ScriptedServer, sink: Path) -> None:
    """``max_per_object=1``: the first lookup runs, the second (next turn) is denied; a
    denied call does not count against the cap."""
    from perdure.llm import ChatCompletionsClient, Message

    app = make_app()
    for tool in support.app.tools.values():
        app.tool(tool)
    capped = perdure.Policy("capped", rules=(perdure.Allow({"lookup"}, max_per_object=1),))

    @app.agent(name="capped")
    async def capped_agent(run: perdure.Run, base_url: str) -> list[list[str]]:
        client = ChatCompletionsClient(base_url=base_url, api_key=lambda: "test")
        try:
            result = await run.agent(client, model="gpt-4o", messages=[Message.user("go")],
                                     tools=app.tools, policy=capped)
        finally:
            await client.aclose()
        return [[c.tool, c.outcome] for c in result.calls]

    def ask(tool: str, args: str) -> ScriptedReply:
        return ScriptedReply(tool_calls=(ScriptedToolCall(tool, args, "c"),))

    server.script(ask("write_note", '{"path": "/notes/a", "text": "x"}'),
                  ask("lookup", '{"city": "Oslo"}'), ask("lookup", '{"city": "Rome"}'),
                  ScriptedReply(text="ok"))
    app.options(object_id="cap-1").start("capped", server.openai_base_url)
    with app.background_worker():
        assert app.handle("cap-1").result(timeout=20) == [
            ["write_note", "denied"], ["lookup", "done"], ["lookup", "denied"]]
    reasons = [r.body["reason"] for r in app.history("cap-1") if r.kind == "tool_gated"]
    assert "at most 1 time(s) per object" in reasons[2]
