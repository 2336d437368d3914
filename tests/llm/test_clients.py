"""Every client through its real SDK over real HTTP to the scripted server."""

from __future__ import annotations

import hashlib
import json
import math
import os

import pytest

from perdure.errors import ConfigurationError, NodeLacksError
from perdure.llm import (
    AnthropicClient,
    FailureKind,
    Message,
    ModelCallError,
    ModelParams,
    ModelRequest,
    ToolCall,
    ToolSpec,
    Usage,
    reply_failure,
)
from perdure.llm.scripted import ScriptedFailure, ScriptedReply, ScriptedServer, ScriptedToolCall
from tests.llm.support import KEY, KINDS, complete, make_client, run, stream

WEATHER = ToolSpec("weather", "The weather in a city.",
                   {"type": "object", "properties": {"city": {"type": "string"}},
                    "required": ["city"]})
ASK = ModelRequest("gpt-4o", (Message.system("Be brief."), Message.user("Weather in Oslo?")),
                   tools=(WEATHER,), params=ModelParams(temperature=0.0, max_tokens=64))
TEXT = "It is cold and clear in Oslo today, with light wind."
USAGE = {"input_tokens": 120, "output_tokens": 30, "cached_tokens": 20}


@pytest.mark.parametrize("kind", KINDS)
def test_complete_returns_the_normalised_reply(kind: str, server: ScriptedServer) -> None:
    """Text, finish reason, usage (cached tokens included), the model that answered, the
    provider's request id and response id, and a latency."""
    server.script(ScriptedReply(text=TEXT, model="served-model-1", **USAGE))
    reply = run(complete(make_client(kind, server), ASK))
    assert reply.text == TEXT and reply.finish_reason == "stop" and not reply.tool_calls
    assert reply.usage == Usage(120, 30, cached_input_tokens=20)
    assert reply.model == "served-model-1"
    assert reply.request_id == "req_1" and reply.response_id
    assert reply.provider == {"chat": "openai.chat", "responses": "openai.responses",
                              "anthropic": "anthropic"}[kind]
    assert 0 < reply.latency < 5


@pytest.mark.parametrize("kind", KINDS)
def test_stream_yields_numbered_chunks_then_the_reply(kind: str,
                                                      server: ScriptedServer) -> None:
    """Chunks come numbered from 0 and join to the text; the last item is the reply,
    equal to what ``complete`` gives (latency and ids aside)."""
    server.script(ScriptedReply(text=TEXT, chunk_chars=5, model="served-model-1", **USAGE),
                  ScriptedReply(text=TEXT, model="served-model-1", **USAGE))
    chunks, reply = run(stream(make_client(kind, server), ASK))
    whole = run(complete(make_client(kind, server), ASK))
    assert [c.index for c in chunks] == list(range(len(chunks)))
    assert len(chunks) == math.ceil(len(TEXT) / 5)
    assert "".join(c.text for c in chunks) == reply.text == whole.text
    assert (reply.usage, reply.model, reply.finish_reason) == (whole.usage, whole.model,
                                                               whole.finish_reason)
    assert reply.request_id == "req_1" and server.requests[0].stream


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("streaming", [False, True])
def test_tool_calls_come_back_as_proposals(kind: str, streaming: bool,
                                           server: ScriptedServer) -> None:
    """Parallel tool calls come back with ids, names and JSON arguments, finish reason
    ``tool_calls``; streamed, as tool-call deltas first."""
    calls = (ScriptedToolCall("weather", '{"city": "Oslo"}', id="call_a"),
             ScriptedToolCall("weather", '{"city": "Bergen"}', id="call_b"))
    server.script(ScriptedReply(text="Checking.", tool_calls=calls, chunk_chars=4))
    client = make_client(kind, server)
    if streaming:
        chunks, reply = run(stream(client, ASK))
        deltas = [c.tool_call for c in chunks if c.tool_call is not None]
        assert {d.id for d in deltas if d.id} == {"call_a", "call_b"}
        assert "".join(d.arguments for d in deltas if d.index == 1) == '{"city": "Bergen"}'
    else:
        reply = run(complete(client, ASK))
    assert reply.finish_reason == "tool_calls" and reply.text == "Checking."
    assert [(c.id, c.name, c.parsed()) for c in reply.tool_calls] == [
        ("call_a", "weather", {"city": "Oslo"}), ("call_b", "weather", {"city": "Bergen"})]


CONVERSATION = ModelRequest("gpt-4o", (
    Message.system("Be brief."),
    Message.user("Weather in Oslo and Bergen?"),
    Message.assistant("Checking.", [ToolCall("call_a", "weather", '{"city": "Oslo"}'),
                                    ToolCall("call_b", "weather", '{"city": "Bergen"}')]),
    Message.tool("call_a", "-3C, clear"),
    Message.tool("call_b", "4C, rain"),
    Message.user("Which is warmer?"),
), tools=(WEATHER,), params=ModelParams(temperature=0.5, max_tokens=100, stop=("END",),
                                        tool_choice="auto"))


def test_what_the_chat_sdk_sent(server: ScriptedServer) -> None:
    """Chat Completions: messages with tool calls and tool results, tools as functions,
    parameters, usage asked for in a stream."""
    run(stream(make_client("chat", server), CONVERSATION))
    body = server.requests[0].body
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "tool",
                                                     "tool", "user"]
    assistant = body["messages"][2]
    assert assistant["tool_calls"][1] == {"id": "call_b", "type": "function", "function": {
        "name": "weather", "arguments": '{"city": "Bergen"}'}}
    assert body["messages"][4] == {"role": "tool", "content": "4C, rain",
                                   "tool_call_id": "call_b"}
    assert body["tools"][0]["function"]["name"] == "weather"
    assert (body["temperature"], body["max_tokens"], body["stop"], body["tool_choice"]) == (
        0.5, 100, ["END"], "auto")
    assert body["stream_options"] == {"include_usage": True}


def test_what_the_responses_sdk_sent(server: ScriptedServer) -> None:
    """Responses: input items with function calls and their outputs, ``store: false``."""
    request = ModelRequest(CONVERSATION.model, CONVERSATION.messages, CONVERSATION.tools,
                           ModelParams(temperature=0.5, max_tokens=100))
    run(complete(make_client("responses", server), request))
    body = server.requests[0].body
    kinds = [item.get("type", item.get("role")) for item in body["input"]]
    assert kinds == ["system", "user", "assistant", "function_call", "function_call",
                     "function_call_output", "function_call_output", "user"]
    assert body["input"][6] == {"type": "function_call_output", "call_id": "call_b",
                                "output": "4C, rain"}
    assert body["store"] is False and body["max_output_tokens"] == 100
    assert body["tools"][0] == {"type": "function", "name": "weather",
                                "description": WEATHER.description,
                                "parameters": dict(WEATHER.parameters), "strict": False}


def test_what_the_anthropic_sdk_sent(server: ScriptedServer) -> None:
    """Anthropic: system apart, tool_use blocks, both tool results in one user turn with
    the next question, tools with input schemas."""
    run(complete(make_client("anthropic", server), CONVERSATION))
    body = server.requests[0].body
    assert body["system"] == "Be brief."
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assistant = body["messages"][1]["content"]
    assert assistant[1] == {"type": "tool_use", "id": "call_a", "name": "weather",
                            "input": {"city": "Oslo"}}
    results = body["messages"][2]["content"]
    assert [b["type"] for b in results] == ["tool_result", "tool_result", "text"]
    assert body["tools"][0]["input_schema"] == dict(WEATHER.parameters)
    assert (body["stop_sequences"], body["tool_choice"], body["max_tokens"]) == (
        ["END"], {"type": "auto"}, 100)


@pytest.mark.parametrize("kind", KINDS)
def test_refusals_and_length(kind: str, server: ScriptedServer) -> None:
    """A refusal comes back as finish reason ``content_filter`` (a permanent failure by
    ``reply_failure``), a cut-off reply as ``length``."""
    server.script(ScriptedReply(text="I can't help with that.",
                                finish_reason="content_filter"),
                  ScriptedReply(text="It is", finish_reason="length"))
    refused = run(complete(make_client(kind, server), ASK))
    failure = reply_failure(refused)
    assert refused.finish_reason == "content_filter"
    assert failure is not None and failure.kind is FailureKind.PERMANENT
    assert run(complete(make_client(kind, server), ASK)).finish_reason == "length"


@pytest.mark.parametrize("kind", KINDS)
def test_key_from_an_environment_variable(kind: str, server: ScriptedServer,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The key is read from the named variable at call time; the server got that key."""
    monkeypatch.setenv("PERDURE_TEST_MODEL_KEY", "sk-from-env")
    run(complete(make_client(kind, server, api_key=None,
                             api_key_env="PERDURE_TEST_MODEL_KEY"), ASK))
    assert server.requests[0].credential_sha256 == hashlib.sha256(b"sk-from-env").hexdigest()


@pytest.mark.parametrize("kind", KINDS)
def test_key_from_an_async_callable_is_read_per_call(kind: str,
                                                     server: ScriptedServer) -> None:
    """An async key callable is called for each request: a rotated key is used next."""
    keys = iter(["sk-one", "sk-two"])

    async def key() -> str:
        return next(keys)

    async def twice() -> None:
        client = make_client(kind, server, api_key=key)
        try:
            await client.complete(ASK)
            await client.complete(ASK)
        finally:
            await client.aclose()

    run(twice())
    assert [r.credential_sha256 for r in server.requests] == [
        hashlib.sha256(k).hexdigest() for k in (b"sk-one", b"sk-two")]


@pytest.mark.parametrize("kind", KINDS)
def test_the_key_never_appears_in_what_comes_back(kind: str, server: ScriptedServer) -> None:
    """Not in a reply, a chunk, a client's repr, or an error, even when the provider's
    error message quotes it."""
    server.script(ScriptedReply(text=TEXT), ScriptedReply(text=TEXT),
                  ScriptedFailure(401, message=f"Incorrect API key provided: {KEY}"))
    client = make_client(kind, server)
    reply = run(complete(client, ASK))
    chunks, streamed = run(stream(make_client(kind, server), ASK))
    with pytest.raises(ModelCallError) as caught:
        run(complete(make_client(kind, server), ASK))
    seen = json.dumps([reply.to_json(), streamed.to_json(), [c.to_json() for c in chunks],
                       caught.value.failure.to_json(), str(caught.value), repr(client)])
    assert KEY not in seen
    assert caught.value.failure.detail == "Incorrect API key provided: ***"
    assert all(KEY not in json.dumps(dict(r.headers)) for r in server.requests)


@pytest.mark.parametrize("kind", KINDS)
def test_no_key_is_the_nodes_problem(kind: str, server: ScriptedServer,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a key the call is not sent; the error (``NodeLacksError``: a worker leaves
    the object to a node that has the key) names the variable to set."""
    monkeypatch.delenv("PERDURE_NO_SUCH_KEY", raising=False)
    with pytest.raises(NodeLacksError, match="PERDURE_NO_SUCH_KEY"):
        run(complete(make_client(kind, server, api_key=None,
                                 api_key_env="PERDURE_NO_SUCH_KEY"), ASK))
    with pytest.raises(ConfigurationError, match="callable"):
        make_client(kind, server, api_key="sk-plain-string")
    assert server.requests == []


@pytest.mark.parametrize(("kind", "params"), [
    ("responses", ModelParams(stop=("END",))),
    ("responses", ModelParams(seed=1)),
    ("anthropic", ModelParams(seed=1)),
    ("anthropic", ModelParams(store=True)),
])
def test_parameters_an_api_lacks_are_refused_before_sending(
        kind: str, params: ModelParams, server: ScriptedServer) -> None:
    """A parameter the API has no place for is a ``ConfigurationError``, not dropped."""
    with pytest.raises(ConfigurationError):
        run(complete(make_client(kind, server), ModelRequest("m", ASK.messages,
                                                             params=params)))
    assert server.requests == []


@pytest.mark.parametrize("kind", KINDS)
def test_leaving_a_stream_early_closes_it(kind: str, server: ScriptedServer) -> None:
    """A consumer that stops after the first chunk leaves nothing open (the suite turns
    unclosed-resource warnings into errors)."""
    server.script(ScriptedReply(text=TEXT, chunk_chars=3))

    async def first() -> str:
        client = make_client(kind, server)
        try:
            async for item in client.stream(ASK):
                return str(getattr(item, "text", ""))
        finally:
            await client.aclose()
        return ""

    assert run(first()) == TEXT[:3]


def test_anthropic_default_max_tokens_and_extra_fields(server: ScriptedServer) -> None:
    """A request without max_tokens gets the client's default; ``extra`` fields go into
    the body as they are."""
    request = ModelRequest("claude", (Message.user("hi"),),
                           params=ModelParams(extra={"metadata": {"user_id": "u1"}}))
    run(complete(AnthropicClient(base_url=server.anthropic_base_url,
                                 api_key=lambda: KEY, default_max_tokens=321), request))
    body = server.requests[0].body
    assert body["max_tokens"] == 321 and body["metadata"] == {"user_id": "u1"}


def test_environment_is_not_read_without_a_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building a client reads no key: the environment is read when a call is made."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with ScriptedServer() as idle:
        make_client("chat", idle, api_key=None)
    assert "OPENAI_API_KEY" not in os.environ
