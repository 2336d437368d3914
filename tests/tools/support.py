"""Tools and agents for the tool-call tests, in this process and in worker subprocesses.

``app`` is what ``perdure --app tests.tools.support:app worker`` loads (the CLI rebinds it
to the test's store and key directory). Tool effects land in a SQLite *sink* named by
the environment variable ``PERDURE_TOOL_SINK``: one row per idempotency key (the effect)
and a count of how many times the tool body ran for it, so a test can tell an effect made
once from one made twice, across processes killed with SIGKILL.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import perdure
from perdure.llm import ChatCompletionsClient, Message
from tests.integration.engine_support import REPO_ROOT

__all__ = ["POLICY", "app", "effects", "runs", "start_tool_worker"]

SINK_ENV = "PERDURE_TOOL_SINK"

app = perdure.App(store="sqlite:///never-opened.db", lease_seconds=2.0, poll_interval=0.01)

POLICY = perdure.Policy(
    "test-policy",
    rules=(perdure.Allow({"lookup", "slow_write", "write_note", "send_message", "delete"}),),
)


def _sink() -> sqlite3.Connection:
    conn = sqlite3.connect(os.environ[SINK_ENV], timeout=30, isolation_level=None)
    conn.execute("CREATE TABLE IF NOT EXISTS effects (key TEXT PRIMARY KEY, tool TEXT, "
                 "args TEXT, runs INTEGER)")
    return conn


def _effect(tool: str, key: str, args: str) -> None:
    conn = _sink()
    try:
        conn.execute("INSERT INTO effects VALUES (?, ?, ?, 1) ON CONFLICT(key) DO UPDATE "
                     "SET runs = runs + 1", (key, tool, args))
    finally:
        conn.close()


def effects(sink: Path) -> list[tuple[str, str, str]]:
    """``(tool, args, key)`` of every effect in the sink, ordered by tool and args."""
    conn = sqlite3.connect(sink)
    try:
        return sorted((t, a, k) for k, t, a, _ in conn.execute("SELECT * FROM effects"))
    finally:
        conn.close()


def runs(sink: Path) -> int:
    """How many times tool bodies ran (an effect re-run under its key counts again)."""
    conn = sqlite3.connect(sink)
    try:
        return int(conn.execute("SELECT coalesce(sum(runs), 0) FROM effects").fetchone()[0])
    finally:
        conn.close()


@app.tool(risk="low")
def lookup(city: str) -> dict[str, Any]:
    """Look up the weather of a city.

    Args:
        city: the city's name
    """
    return {"city": city, "weather": "sunny"}


@app.tool(risk="medium", constraints=[perdure.PathPrefix("path", ("/notes",))])
def write_note(path: str, text: str, idempotency_key: str) -> str:
    """Write a note under /notes."""
    _effect("write_note", idempotency_key, f"{path}={text}")
    return f"wrote {path}"


@app.tool(risk="low")
async def slow_write(label: str, seconds: float, idempotency_key: str) -> str:
    """Wait ``seconds`` then record ``label`` (a tool a worker can be killed in)."""
    import asyncio

    await asyncio.sleep(seconds)
    _effect("slow_write", idempotency_key, label)
    return f"stored {label}"


@app.tool(risk="high")
def send_message(to: str, body: str, idempotency_key: str) -> str:
    """Send a message to someone (needs a person's approval)."""
    time.sleep(float(os.environ.get("PERDURE_TOOL_SEND_DELAY", "0")))
    _effect("send_message", idempotency_key, f"{to}:{body}")
    return f"sent to {to}"


@app.tool(risk="high", idempotent=False)
def delete(path: str) -> str:
    """Delete a file (not idempotent; needs a person's approval)."""
    _effect("delete", f"delete:{path}:{time.time_ns()}", path)
    return f"deleted {path}"


@app.agent(name="tool_agent")
async def tool_agent(run: perdure.Run, base_url: str, prompt: str,
                     max_turns: int = 6) -> dict[str, Any]:
    """The durable agent loop over the tools above, under ``POLICY``."""
    client = ChatCompletionsClient(base_url=base_url, api_key=lambda: "test")
    try:
        result = await run.agent(client, model="gpt-4o", messages=[Message.user(prompt)],
                                 tools=list(app.tools.values()), policy=POLICY,
                                 max_turns=max_turns)
    finally:
        await client.aclose()
    return {"text": result.text, "stopped": result.stopped, "turns": result.turns,
            "calls": [[o.tool, o.outcome, o.error] for o in result.calls]}


@app.agent(name="strict_agent")
async def strict_agent(run: perdure.Run, base_url: str, prompt: str,
                       ttl: float | None = None) -> dict[str, Any]:
    """The loop under a policy where only ``alice`` may approve high-risk calls, and
    approvals expire after ``ttl`` seconds."""
    policy = perdure.Policy("strict", rules=(perdure.Allow({"send_message", "write_note"}),),
                            approvers={"high": frozenset({"alice"})}, approval_ttl=ttl)
    client = ChatCompletionsClient(base_url=base_url, api_key=lambda: "test")
    try:
        result = await run.agent(client, model="gpt-4o", messages=[Message.user(prompt)],
                                 tools=list(app.tools.values()), policy=policy, max_turns=4)
    finally:
        await client.aclose()
    return {"text": result.text, "stopped": result.stopped,
            "calls": [[o.tool, o.outcome, o.error] for o in result.calls]}


def start_tool_worker(store_url: str, key_dir: Path, log: Path, sink: Path,
                      **env: str) -> subprocess.Popen[bytes]:
    """Run ``perdure worker`` on ``app`` above in a child process (2 s leases)."""
    full = {**os.environ, "PYTHONPATH": str(REPO_ROOT), SINK_ENV: str(sink), **env}
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "perdure", "--store", store_url, "--key-dir", str(key_dir),
             "--app", "tests.tools.support:app", "worker", "--lease", "2", "--poll", "0.01",
             "--concurrency", "4"],
            cwd=REPO_ROOT, env=full, stdout=out, stderr=subprocess.STDOUT)
