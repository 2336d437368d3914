"""The agent whose histories are kept in this folder (``*.json``), as today's code has it.

``record.py`` wrote the histories by running it in a ``perdure.testing.Environment``;
``tests/integration/test_testing_kit.py`` replays them against this code (they must
pass) and against ``changed.py`` (they must fail, naming the position). The command
line does the same: ``perdure --app tests.histories.agents:app replay-check --history
tests/histories``.
"""

from __future__ import annotations

from typing import Any

import perdure

__all__ = ["app", "digest", "fetch", "summarize"]

app = perdure.App(store="sqlite:///never-opened.db")


def fetch(topic: str) -> list[str]:
    """The pages about ``topic``."""
    return [f"{topic}-page-1", f"{topic}-page-2"]


def summarize(pages: list[str]) -> str:
    """One line of them."""
    return " / ".join(pages)


@app.agent(name="digest")
async def digest(run: perdure.Run, topic: str) -> dict[str, Any]:
    """Fetch, wait an hour for more news, ask whether to publish, summarize."""
    pages = await run.step(fetch, topic)
    await run.sleep(3600)
    verdict = await run.wait_for("review", timeout=600, prompt=f"publish the {topic} digest?",
                                 choices=["yes", "no"])
    text = await run.step(summarize, pages)
    return {"text": text, "verdict": verdict}
