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

import openai  # noqa: F401 - imported now, not on the worker's loop at its first call

import perdure
from perdure.llm import ChatCompletionsClient, Message
from tests.integration.engine_support import REPO_ROOT

__all__ = ["POLICY", "app", "effects", "runs", "stall_listener", "start_tool_worker"]

SINK_ENV = "PERDURE_TOOL_SINK"

app = perdure.App(store="sqlite:///never-opened.db", lease_seconds=2.0, poll_interval=0.01)

POLICY = perdure.Policy(
    "test-policy",
    rules=(perdure.Allow({"lookup", "slow_write", "write_note", "send_message", "delete"}),),
)


def _sink(path: Path | None = None) -> sqlite3.Connection:
    conn = sqlite3.connect(path or os.environ[SINK_ENV], timeout=30, isolation_level=None)
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
    conn = _sink(sink)  # the table made here too: a writer may have made only the file
    try:
        return sorted((t, a, k) for k, t, a, _ in conn.execute("SELECT * FROM effects"))
    finally:
        conn.close()


def runs(sink: Path) -> int:
    """How many times tool bodies ran (an effect re-run under its key counts again)."""
    conn = _sink(sink)  # the table made here too: a writer may have made only the file
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
    """Record ``label``, then take ``seconds`` to finish (a tool a worker can be killed in
    after its effect and before its result is recorded)."""
    import asyncio

    _effect("slow_write", idempotency_key, label)
    await asyncio.sleep(seconds)
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


STALL_ENV = "PERDURE_TEST_STALL_KIND"  # stall the worker once memory ends with this kind
STALL_MARK = "PERDURE_TEST_STALL_MARK"  # a file written when it stalls


def stall_listener(target: perdure.App) -> None:
    """In a worker subprocess: after the commit that leaves an object's memory ending with
    a record of kind ``$PERDURE_TEST_STALL_KIND``, block the node's loop (write the mark
    file and sleep) so the test can SIGKILL the worker at exactly that point."""
    kind = os.environ.get(STALL_ENV)
    if not kind:
        return
    from perdure.hooks import CommitBatch

    reader = perdure.App(store=os.environ["PERDURE_TEST_STORE"],
                         key_dir=os.environ["PERDURE_TEST_KEYS"])
    object_id = os.environ["PERDURE_TEST_OBJECT"]

    def listen(event: CommitBatch) -> None:
        history = reader.history(object_id)
        if history and history[-1].kind == kind:
            Path(os.environ[STALL_MARK]).write_text(str(history[-1].seq))
            time.sleep(120)  # the test kills the worker now

    target.hooks.subscribe(listen, CommitBatch)


stall_listener(app)


def start_tool_worker(store_url: str, key_dir: Path, log: Path, sink: Path,
                      stall: tuple[str, str, Path] | None = None,
                      app_ref: str = "tests.tools.support:app",
                      **env: str) -> subprocess.Popen[bytes]:
    """Run ``perdure worker`` on ``app`` above in a child process (2 s leases); with
    ``stall=(object_id, kind, mark)`` it stalls once memory ends with ``kind``."""
    full = {**os.environ, "PYTHONPATH": str(REPO_ROOT), SINK_ENV: str(sink), **env}
    if stall is not None:
        full.update({"PERDURE_TEST_OBJECT": stall[0], STALL_ENV: stall[1],
                     STALL_MARK: str(stall[2]), "PERDURE_TEST_STORE": store_url,
                     "PERDURE_TEST_KEYS": str(key_dir)})
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "perdure", "--store", store_url, "--key-dir", str(key_dir),
             "--app", app_ref, "worker", "--lease", "2", "--poll", "0.01",
             "--concurrency", "4"],
            cwd=REPO_ROOT, env=full, stdout=out, stderr=subprocess.STDOUT)
