"""Agents making model calls, for worker subprocesses killed mid-stream.

``app`` is what ``perdure --app tests.integration.model_support:app worker`` loads; the
CLI rebinds it to the test's store and key directory. The scripted server runs in the
test's process; its base URL is the agent's argument.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import perdure
from perdure.llm import (
    ChatCompletionsClient,
    Message,
    ModelCallError,
    ModelParams,
    ResponsesClient,
)
from tests.integration.engine_support import REPO_ROOT

__all__ = ["app", "long_stream", "start_model_worker", "stateful_call"]

app = perdure.App(store="sqlite:///never-opened.db", lease_seconds=2.0, poll_interval=0.01)


@app.agent(name="long_stream")
async def long_stream(run: perdure.Run, base_url: str) -> dict[str, Any]:
    """One streamed call (continued from its salvage if its worker dies mid-stream)."""
    client = ChatCompletionsClient(base_url=base_url, api_key=lambda: "test")
    try:
        reply = await run.model(client, model="gpt-4o",
                                messages=[Message.user("Tell me a long story.")],
                                stream=True)
    finally:
        await client.aclose()
    return {"text": reply.text, "finish": reply.finish_reason}


@app.agent(name="stateful_call")
async def stateful_call(run: perdure.Run, base_url: str, store: bool,
                        stream: bool = False) -> dict[str, Any]:
    """One call to the Responses API, stored at the provider (``store=True``) or not,
    streamed or not; a call that ends in doubt is reported, not raised."""
    client = ResponsesClient(base_url=base_url, api_key=lambda: "test")
    try:
        reply = await run.model(client, model="gpt-4o",
                                messages=[Message.user("Remember this.")],
                                params=ModelParams(store=store), stream=stream)
    except ModelCallError as exc:
        return {"error": str(exc.failure.kind), "reason": exc.failure.reason}
    finally:
        await client.aclose()
    return {"text": reply.text}


def start_model_worker(store_url: str, key_dir: Path, log: Path) -> subprocess.Popen[bytes]:
    """Run ``perdure worker`` on ``app`` above in a child process (2 s leases)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    with open(log, "ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "perdure", "--store", store_url, "--key-dir", str(key_dir),
             "--app", "tests.integration.model_support:app", "worker", "--lease", "2",
             "--poll", "0.01", "--concurrency", "4"],
            cwd=REPO_ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT,
        )
