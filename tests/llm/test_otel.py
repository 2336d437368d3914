"""OpenTelemetry GenAI attributes derived from a real call's request and reply."""

from __future__ import annotations

from perdure.llm import (
    Message,
    ModelParams,
    ModelRequest,
    classify_status,
    genai_attributes,
    provider_name,
)
from perdure.llm.scripted import ScriptedReply, ScriptedServer
from tests.llm.support import complete, make_client, run

REQUEST = ModelRequest("gpt-4o", (Message.user("hi"),),
                       params=ModelParams(temperature=0.3, max_tokens=50, top_p=0.9,
                                          stop=("END",), seed=7))


def test_attributes_of_a_call(server: ScriptedServer) -> None:
    """The conventions' names, from request and reply; no message content."""
    server.script(ScriptedReply(text="hello", model="gpt-4o-2024-08-06", input_tokens=12,
                                output_tokens=3, cached_tokens=8))
    reply = run(complete(make_client("chat", server), REQUEST))
    attributes = genai_attributes(REQUEST, reply, base_url=server.openai_base_url)
    port = int(server.url.rsplit(":", 1)[1])
    assert attributes == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-4o",
        "gen_ai.request.temperature": 0.3,
        "gen_ai.request.top_p": 0.9,
        "gen_ai.request.max_tokens": 50,
        "gen_ai.request.seed": 7,
        "gen_ai.request.stop_sequences": ["END"],
        "gen_ai.output.type": "text",
        "gen_ai.response.model": "gpt-4o-2024-08-06",
        "gen_ai.response.id": "chatcmpl-1",
        "gen_ai.response.finish_reasons": ["stop"],
        "gen_ai.usage.input_tokens": 12,
        "gen_ai.usage.output_tokens": 3,
        "gen_ai.usage.cache_read.input_tokens": 8,
        "server.address": "127.0.0.1",
        "server.port": port,
    }
    assert "hello" not in str(attributes)


def test_attributes_of_a_failed_call() -> None:
    """A failed call has the request's attributes and ``error.type``."""
    from datetime import UTC, datetime

    failure = classify_status(429, {}, {"error": {"code": "rate_limit_exceeded"}},
                              now=datetime.now(UTC))
    attributes = genai_attributes(ModelRequest("claude", ()), provider="anthropic",
                                  base_url="https://api.anthropic.com", failure=failure)
    assert attributes["gen_ai.provider.name"] == "anthropic"
    assert attributes["server.port"] == 443
    assert attributes["error.type"] == "rate_limit_exceeded"
    assert "gen_ai.usage.input_tokens" not in attributes
    assert provider_name("openai.responses") == "openai" == provider_name("openai.chat")
