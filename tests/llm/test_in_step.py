"""Before ``run.model`` exists: a model call made inside ``run.step`` already backs off
as the provider asked, because ``ModelCallError`` carries the backoff class and delay."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import perdure
from perdure.llm import ChatCompletionsClient, Message, ModelRequest
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

    handle = app.start("asker", "Hi?", object_id="asker-1")
    with app.background_worker():
        assert handle.result(timeout=10) == "Hello!"
    history = app.history("asker-1")
    [failed] = [r.body for r in history if r.kind == perdure.Kind.STEP_FAILED]
    assert failed["error_class"] == "rate_limited" and failed["retry_after"] == 0.3
    assert any(r.kind == perdure.Kind.DORMANT for r in history)
    first, second = server.requests
    assert second.received - first.received >= 0.3
