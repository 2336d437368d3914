"""``agents.py`` changed without a new version: ``summarize`` moved before the sleep.

Objects with memory of ``agents.py``'s ``digest`` would park on this code: the
histories of this folder must fail against it, at command #1 (recorded ``sleep``, the
code asks for ``step('summarize')``).
"""

from __future__ import annotations

from typing import Any

import perdure
from tests.histories.agents import fetch, summarize

__all__ = ["app"]

app = perdure.App(store="sqlite:///never-opened.db")


@app.agent(name="digest")
async def digest(run: perdure.Run, topic: str) -> dict[str, Any]:
    """``agents.digest`` with its summary made first."""
    pages = await run.step(fetch, topic)
    text = await run.step(summarize, pages)
    await run.sleep(3600)
    verdict = await run.wait_for("review", timeout=600, prompt=f"publish the {topic} digest?",
                                 choices=["yes", "no"])
    return {"text": text, "verdict": verdict}
