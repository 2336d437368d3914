"""Agents making model calls under a model quota, for worker subprocesses.

``app`` is what ``perdure --app tests.integration.quota_support:app worker`` loads; the
CLI rebinds it to the test's store and key directory. It declares ``QUOTA``: the tests
start a scripted server enforcing the same tokens per minute over the same window.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import perdure
from perdure.llm import ChatCompletionsClient, Message, ModelParams
from tests.integration.engine_support import REPO_ROOT

__all__ = ["CAP", "MODEL", "QUOTA", "app", "ask", "start_quota_worker"]

MODEL = "gpt-4o-mini"
QUOTA = perdure.ModelQuota("openai", MODEL, tokens_per_minute=18_000, window=2.0)
CAP = 600  # tokens within any 2 s
MAX_TOKENS = 40

app = perdure.App(store="sqlite:///never-opened.db", lease_seconds=2.0, poll_interval=0.01)
app.model_quota(QUOTA)


@app.agent(name="ask")
async def ask(run: perdure.Run, base_url: str, question: str) -> str:
    """One call of ``MODEL`` under ``QUOTA``."""
    client = ChatCompletionsClient(base_url=base_url, api_key=lambda: "test")
    try:
        reply = await run.model(client, model=MODEL, messages=[Message.user(question)],
                                params=ModelParams(max_tokens=MAX_TOKENS))
    finally:
        await client.aclose()
    return reply.text


def start_quota_worker(store_url: str, key_dir: Path, log: Path) -> subprocess.Popen[bytes]:
    """Run ``perdure worker`` on ``app`` above in a child process (2 s leases)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    with open(log, "ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "perdure", "--store", store_url, "--key-dir", str(key_dir),
             "--app", "tests.integration.quota_support:app", "worker", "--lease", "2",
             "--poll", "0.01", "--concurrency", "8"],
            cwd=REPO_ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT,
        )
