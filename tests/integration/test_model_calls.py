"""``run.model``: a model call recorded in memory and replayed without calling the provider.

Real SDKs over real HTTP against the scripted server, on both stores.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import pytest

pytest.importorskip("openai")
pytest.importorskip("anthropic")

import perdure
from perdure.core.bodies import decode
from perdure.core.codec import encode
from perdure.llm import (
    Message,
    ModelRequest,
    Price,
    PriceTable,
    ToolSpec,
    recorded_calls,
)
from perdure.llm.scripted import ScriptedReply, ScriptedServer, ScriptedToolCall
from tests.integration.engine_support import wait_until
from tests.llm.support import make_client

TIMEOUT = 20.0


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    """A scripted model server on 127.0.0.1, stopped after the test."""
    with ScriptedServer() as running:
        yield running


def model_records(app: perdure.App, object_id: str) -> list[dict[str, Any]]:
    """The bodies of an object's ``model_call`` records, each checked to decode and
    re-encode to its stored bytes."""
    out = []
    for rec in app.history(object_id):
        typed = decode(rec)
        assert encode(typed.encode()) == rec.body_bytes
        if rec.kind == perdure.Kind.MODEL_CALL:
            out.append(dict(rec.body))
    return out


@pytest.mark.parametrize("kind", ["chat", "responses", "anthropic"])
def test_a_model_call_is_recorded_and_replayed_without_the_provider(
        make_app: Callable[..., perdure.App], server: ScriptedServer, kind: str) -> None:
    """The reply comes back to the agent and into memory with its usage, cost, request id,
    client and GenAI attributes; after the object waits for an event and is resumed, the
    call is replayed from memory: the server hears no second request."""
    app = make_app()
    server.script(ScriptedReply(text="Oslo is cold.", input_tokens=12, output_tokens=5))
    prices = PriceTable({"gpt-4o": Price("2.50", "10.00")})

    @app.agent(name="asker")
    async def asker(run: perdure.Run, question: str) -> dict[str, Any]:
        client = make_client(kind, server)
        try:
            reply = await run.model(client, model="gpt-4o",
                                    messages=[Message.user(question)], prices=prices)
        finally:
            await client.aclose()
        await run.wait_for("go")
        return {"text": reply.text, "tokens": reply.usage.total_tokens}

    handle = app.options(object_id="asker-1").start("asker", "Weather in Oslo?")
    with app.background_worker():
        assert _wait(lambda: app.get("asker-1").waiting_event == "go")
        assert len(server.requests) == 1
        app.send("asker-1", "go")
        assert handle.result(timeout=TIMEOUT) == {"text": "Oslo is cold.", "tokens": 17}
    assert len(server.requests) == 1  # the replay did not call the provider
    [body] = model_records(app, "asker-1")
    assert body["provider"] == make_client(kind, server).provider
    assert body["client"] == 0 and body["attempt"] == 1
    assert body["reply"]["usage"] == {"input_tokens": 12, "output_tokens": 5}
    assert Decimal(body["cost"]) == Decimal("0.00008")
    assert body["reply"]["request_id"]
    assert "attributes" not in body  # derived from the stored fields, not stored twice
    [call] = recorded_calls(app.history("asker-1"))
    assert call.attributes["gen_ai.request.model"] == "gpt-4o"
    assert call.attributes["gen_ai.usage.output_tokens"] == 5
    assert call.attributes["gen_ai.provider.name"] in ("openai", "anthropic")
    assert call.attributes["server.address"] == "127.0.0.1"
    assert call.request.messages == (Message.user("Weather in Oslo?"),)
    assert call.reply.text == "Oslo is cold." and call.cost == Decimal("0.00008")


def test_each_message_is_stored_once_per_object(make_app: Callable[..., perdure.App],
                                                server: ScriptedServer) -> None:
    """A conversation resends every earlier message; each call's record carries only the
    messages memory did not hold yet (the reply's own included), and names the rest."""
    app = make_app()
    weather = ToolSpec("weather", "The weather in a city.",
                       {"type": "object", "properties": {"city": {"type": "string"}}})
    server.script(ScriptedReply(tool_calls=(ScriptedToolCall("weather", '{"city": "Oslo"}',
                                                             "call-1"),)),
                  ScriptedReply(text="It is -3 in Oslo."),
                  ScriptedReply(text="You are welcome."))

    @app.agent(name="chat")
    async def chat(run: perdure.Run) -> list[str]:
        client = make_client("chat", server)
        messages = [Message.system("Be brief."), Message.user("Weather in Oslo?")]
        texts = []
        try:
            for turn in range(3):
                reply = await run.model(client, ModelRequest("gpt-4o", tuple(messages),
                                                             (weather,)))
                assert not reply.tool_calls or turn == 0  # a proposal: nothing ran it
                messages.append(reply.message())
                if reply.tool_calls:
                    messages.append(Message.tool(reply.tool_calls[0].id, "-3 C"))
                else:
                    messages.append(Message.user("Thanks!"))
                texts.append(reply.text)
        finally:
            await client.aclose()
        return texts

    handle = app.options(object_id="chat-1").start("chat")
    with app.background_worker():
        assert handle.result(timeout=TIMEOUT) == ["", "It is -3 in Oslo.", "You are welcome."]
    bodies = model_records(app, "chat-1")
    assert len(bodies) == 3
    stored = [n for body in bodies for n in body["blobs"]]
    assert len(stored) == len(set(stored))  # no number given twice
    values = [encode(v) for body in bodies for v in body["blobs"].values()]
    assert len(values) == len(set(values))  # nothing stored twice
    first, second, third = bodies
    # the second call resends the first call's messages and its reply: none of them again
    sent_first = [Message.system("Be brief.").to_json(),
                  Message.user("Weather in Oslo?").to_json()]
    assert all(m in first["blobs"].values() for m in sent_first)
    assert not any(m in second["blobs"].values() for m in sent_first)
    # each request names its messages in order, as runs of numbers: a constant size
    assert len(encode(third["request"])) < 80
    calls = recorded_calls(app.history("chat-1"))
    assert [len(c.request.messages) for c in calls] == [2, 4, 6]
    assert len(server.requests) == 3
    assert len(server.requests[2].body["messages"]) == 6


def _wait(predicate: Callable[[], bool], timeout: float = TIMEOUT) -> bool:
    return wait_until(predicate, timeout)
