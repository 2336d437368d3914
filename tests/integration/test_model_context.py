"""``run.model(..., context=ContextPolicy(...))``: a long conversation with tool calls
sent as a view that fits the window, older turns summarised by recorded model calls; a
refused summary changes nothing; memory keeps every message; a replay sends nothing.

Real SDK over real HTTP against the scripted server, on both stores.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest

pytest.importorskip("openai")

import perdure
from perdure.core.backoff import RetryPolicy
from perdure.llm import (
    ChatCompletionsClient,
    ContextPolicy,
    Message,
    ToolCall,
    counter_for_model,
    recorded_calls,
)
from perdure.llm.scripted import RecordedRequest, ScriptedFailure, ScriptedReply, ScriptedServer
from tests.integration.engine_support import wait_until

TIMEOUT = 30.0
WINDOW = 600
RESERVE = 100
TURNS = 14
COUNTER = counter_for_model("gpt-4o")


def _is_summary(request: RecordedRequest) -> bool:
    first = request.body["messages"][0]
    return first["role"] == "system" and str(first["content"]).startswith("You summarise")


def _responder(refuse: bool) -> Callable[[RecordedRequest], Any]:
    def answer(request: RecordedRequest) -> Any:
        if _is_summary(request):
            if refuse:
                return ScriptedFailure(400, "the summary was refused")
            return ScriptedReply(text="The user asked about the reports; all answered.")
        return ScriptedReply(text="Noted.")
    return answer


def _agent(app: perdure.App) -> None:
    @app.agent(name="talker")
    async def talker(run: perdure.Run, base_url: str) -> int:
        client = ChatCompletionsClient(base_url=base_url, api_key=lambda: "test")
        policy = ContextPolicy(window=WINDOW, reserve=RESERVE, counter=COUNTER)
        messages = [Message.system("Be brief.")]
        try:
            for turn in range(TURNS):
                messages.append(Message.user(f"Turn {turn}: look at report {turn} again "
                                             f"and tell me what changed since last week."))
                if turn % 3 == 1:  # a tool call and its result the view must keep together
                    call = ToolCall(f"call-{turn}", "report", f'{{"n": {turn}}}')
                    messages += [Message.assistant("", (call,)),
                                 Message.tool(call.id, f"report {turn}: " + "x " * 40)]
                reply = await run.model(client, model="gpt-4o", messages=messages,
                                        context=policy, retry=RetryPolicy(max_attempts=1))
                messages.append(reply.message())
        finally:
            await client.aclose()
        await run.wait_for("go")
        return len(messages)


def _check_prompt(body: Mapping[str, Any]) -> None:
    """No tool message without the call it answers just before it, and no call without
    all its results."""
    sent = body["messages"]
    open_ids: set[str] = set()
    for i, message in enumerate(sent):
        if message["role"] == "tool":
            assert message["tool_call_id"] in open_ids, f"orphaned tool message at {i}"
            open_ids.discard(message["tool_call_id"])
            continue
        assert not open_ids, f"a tool call without its result before {i}"
        open_ids = {c["id"] for c in message.get("tool_calls") or ()}
    assert not open_ids


def _run(make_app: Callable[..., perdure.App], refuse: bool
         ) -> tuple[perdure.App, ScriptedServer, int]:
    app = make_app()
    _agent(app)
    server = ScriptedServer(responder=_responder(refuse)).start()
    handle = app.options(object_id="talk-1").start("talker", server.openai_base_url)
    with app.background_worker():
        assert wait_until(lambda: app.get("talk-1").waiting_event == "go", TIMEOUT)
        heard = len(server.requests)
        app.send("talk-1", "go")
        length = handle.result(timeout=TIMEOUT)
    assert len(server.requests) == heard  # the replay sent nothing, summaries included
    return app, server, length


def test_a_long_conversation_is_compacted_by_recorded_summaries(
        make_app: Callable[..., perdure.App]) -> None:
    """Every prompt fits the window and holds no split tool pair; older turns are
    summarised by recorded calls; memory still holds every message of the conversation."""
    app, server, length = _run(make_app, refuse=False)
    try:
        main = [r for r in server.requests if not _is_summary(r)]
        summaries = [r for r in server.requests if _is_summary(r)]
        assert len(main) == TURNS and summaries
        for request in main:
            _check_prompt(request.body)
            assert request.body["messages"][0] == {"role": "system", "content": "Be brief."}
        assert any("Summary of the earlier" in str(r.body["messages"][1]) for r in main[-3:])
        calls = recorded_calls(app.history("talk-1"))
        assert {c.name for c in calls} == {"gpt-4o", "context.summary"}
        for call in calls:
            if call.name == "gpt-4o":
                assert COUNTER.count_prompt(call.request.messages) <= WINDOW - RESERVE
        # memory holds every message the agent had, though no prompt holds them all
        held = {m for c in calls for m in (*c.request.messages, c.reply.message())}
        assert len([m for m in held if m.role == "user" and m.text.startswith("Turn")]) \
            == TURNS
        assert length == 1 + TURNS * 2 + 2 * len(range(1, TURNS, 3))
    finally:
        server.stop()


def test_a_refused_summary_changes_nothing(make_app: Callable[..., perdure.App]) -> None:
    """The summary call fails for good (a 400): its failure is recorded, the view keeps
    fitting the window by leaving older turns out, no prompt holds a summary, and the
    conversation goes on."""
    app, server, _ = _run(make_app, refuse=True)
    try:
        main = [r for r in server.requests if not _is_summary(r)]
        assert len(main) == TURNS
        assert any(_is_summary(r) for r in server.requests)
        for request in main:
            _check_prompt(request.body)
            assert "Summary of the earlier" not in str(request.body["messages"])
        failed = [r.body for r in app.history("talk-1") if r.kind == "model_failed"]
        assert failed and all(f["name"] == "context.summary" and f["final"] for f in failed)
        assert len(main[-1].body["messages"]) < 1 + TURNS * 2  # older turns left out
    finally:
        server.stop()
