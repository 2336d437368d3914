"""A Pydantic AI agent run through perdure, for worker subprocesses killed with SIGKILL.

``app`` is what ``perdure --app tests.tools.pa_support:app worker`` loads. Its ``note``
tool writes to the sink of ``tests.tools.support`` (one row per idempotency key), so a
test sees each effect once however often the worker died.
"""

from __future__ import annotations

from typing import Any

from pydantic_ai import Agent

import perdure
from perdure.adapters.pydantic_ai import run_pydantic_agent
from perdure.llm import ChatCompletionsClient
from tests.tools import support

__all__ = ["app", "helper"]

app = perdure.App(store="sqlite:///never-opened.db", lease_seconds=2.0, poll_interval=0.01)
support.stall_listener(app)

helper = Agent(None, instructions="Take notes when asked.")


@helper.tool_plain
def note(text: str) -> str:
    """Write a note."""
    from perdure import current_step

    support._effect("note", current_step().idempotency_key, text)
    return f"noted {text}"


POLICY = perdure.Policy("notes", rules=(perdure.Allow({"note"}),))


@app.agent(name="pa_notes")
async def pa_notes(run: perdure.Run, base_url: str) -> Any:
    """Ask the Pydantic AI helper to take two notes."""
    client = ChatCompletionsClient(base_url=base_url, api_key=lambda: "test")
    try:
        result = await run_pydantic_agent(run, helper, "Note a and b.", client=client,
                                          model="gpt-4o", policy=POLICY)
    finally:
        await client.aclose()
    return str(result.output)
