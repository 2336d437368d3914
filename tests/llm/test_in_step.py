"""Before ``run.model`` exists: a model call made inside ``run.step`` already backs off
as the provider asked, because ``ModelCallError`` carries the backoff class and delay."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import perdure
from perdure.llm import ChatCompletionsClient, Message, ModelCallError, ModelRequest
from perdure.llm.scripted import ScriptedFailure, ScriptedReply, ScriptedServer
from tests.llm.support import KEY


def test_rate_limit_makes_the_object_dormant_for_the_providers_delay(
        make_sqlite_app: Callable[..., perdure.App], server: ScriptedServer) -> None:
    """A 429 with ``retry-after-ms: 300`` is recorded as a rate-limited step failure with
    that delay; the object goes dormant until then and the retried call succeeds."""
    app = make_sqlite_app()
    server.script(ScriptedFailure(429, retry_after_ms="300"), ScriptedReply(text="Hello!"))

    async def ask(question: str) -> dict[str, Any]:
        async with ChatCompletionsClient(base_url=server.openai_base_url,
                                         api_key=lambda: KEY) as client:
            reply = await client.complete(ModelRequest("gpt-4o", (Message.user(question),)))
        return reply.to_json()

    @app.agent(name="asker")
    async def asker(run: perdure.Run, question: str) -> str:
        reply = await run.step(ask, question, name="ask")
        return str(reply["text"])

    handle = app.options(object_id="asker-1").start("asker", "Hi?")
    with app.background_worker():
        assert handle.result(timeout=10) == "Hello!"
    history = app.history("asker-1")
    [failed] = [r.body for r in history if r.kind == perdure.Kind.STEP_FAILED]
    assert failed["error_class"] == "rate_limited" and failed["retry_after"] == 0.3
    assert any(r.kind == perdure.Kind.DORMANT for r in history)
    first, second = server.requests
    assert second.received - first.received >= 0.3


def test_a_final_failure_reaches_the_agent_whole(
        make_sqlite_app: Callable[..., perdure.App], server: ScriptedServer) -> None:
    """A permanent failure is recorded with its classification and reaches the agent as
    the same ``ModelCallError``, rebuilt from memory with its ``failure``."""
    app = make_sqlite_app()
    server.script(ScriptedFailure(404, message="no such model"))

    async def ask() -> dict[str, Any]:
        async with ChatCompletionsClient(base_url=server.openai_base_url,
                                         api_key=lambda: KEY) as client:
            reply = await client.complete(ModelRequest("gpt-9", (Message.user("hi"),)))
        return reply.to_json()

    @app.agent(name="lost")
    async def lost(run: perdure.Run) -> dict[str, Any]:
        try:
            await run.step(ask, name="ask")
        except ModelCallError as exc:
            return exc.failure.to_json()
        return {}

    handle = app.options(object_id="lost-1").start("lost")
    with app.background_worker():
        failure = handle.result(timeout=10)
    assert failure["kind"] == "permanent" and failure["status"] == 404
    assert failure["detail"] == "no such model"
    [failed] = [r.body for r in app.history("lost-1") if r.kind == perdure.Kind.STEP_FAILED]
    assert failed["final"] and failed["error"]["attrs"]["failure_json"] == failure
