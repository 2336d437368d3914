"""Agents of the canary test (``test_secrets_canary.py``), loaded by real worker processes.

The App is built from the same environment variables as ``agents.py``
(``PERDURE_TEST_STORE``, ``PERDURE_TEST_KEYS``): the workers and the test share one key
folder, so one key-encryption key (its ``data-keys`` folder) and one root of trust.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import perdure
from perdure import Secret
from perdure.llm import ChatCompletionsClient, Message
from perdure.resources import Environment, PostgresSession, Subprocess

# Loaded here, before the worker claims anything: an SDK imported on the worker's loop
# would stall it for longer than the canary's 1 s lease.
import openai  # noqa: F401  # isort: skip

__all__ = ["app", "build_app"]

_failed_once: set[str] = set()


def use_key(key: Secret[str]) -> Secret[str]:
    """A step that receives the secret and returns a secret derived from it (the canary
    itself, as a credential refreshed by a call would be)."""
    assert isinstance(key, Secret), type(key)
    print(f"use_key got {key}", flush=True)  # what a careless log line shows: Secret('***')
    return Secret(key.reveal())


def flaky(key: Secret[str], object_id: str) -> str:
    """Fails its first attempt in each process with the secret in the message."""
    if object_id not in _failed_once:
        _failed_once.add(object_id)
        raise ConnectionError(f"upstream refused credential {key.reveal()}")
    return "connected"


def build_app(store: str, key_dir: str | None) -> perdure.App:
    """An App with the canary agents on ``store``."""
    new = perdure.App(store=store, key_dir=key_dir, lease_seconds=1.0, poll_interval=0.01)

    @new.agent(name="canary")
    async def canary(run: perdure.Run, key: Secret[str], marker: str,
                     db_url: str) -> dict[str, Any]:
        # Credentials in resources: an environment secret and a session password (the
        # test servers trust local connections, so the password is carried, not checked).
        env = await run.resource("env", Environment({"API_KEY": key, "MARKER": marker}))
        # The how-to's pattern: the environment handed to a dev server (its descriptor).
        await run.resource("server", Subprocess(
            [sys.executable, "-c", "import time; time.sleep(600)"], env=env))
        db = await run.resource("db", PostgresSession(
            db_url, password=key, settings={"application_name": "canary-agent"}))
        again = await run.step(use_key, key)
        await run.step(flaky, key, run.object_id,
                       retry=perdure.RetryPolicy(max_attempts=3, base=0.05))
        await run.progress(cursor=Secret(key.reveal()), done=1)
        event = await run.wait_for("credentials")
        assert isinstance(event["token"], Secret), event
        await run.sleep(0.05)
        cur = await db.execute("SELECT current_setting('application_name')")
        row = await cur.fetchone()
        return {"marker": marker, "token": event["token"],
                "same": again == key and event["token"] == key,
                "env": env["API_KEY"] == key, "session": row[0]}

    @new.agent(name="canary_all", encrypt=True)
    async def canary_all(run: perdure.Run, text: str, base_url: str) -> str:
        echoed = await run.step(lambda t: t, text, name="echo")
        await run.emit("said", f"said {text}")
        client = ChatCompletionsClient(base_url=base_url, api_key=lambda: "test")
        try:
            first = await run.model(client, model="gpt-4o", messages=[Message.user(text)])
            streamed = await run.model(client, model="gpt-4o", stream=True, messages=[
                Message.user(text), first.message(), Message.user(f"again {text}")])
        finally:
            await client.aclose()
        note = await run.wait_for("note", prompt=f"a note on {text}?",
                                  choices=[f"fine {text}", "none"])
        aim = run.intent.goal.get("aim")
        return f"{echoed}/{note}/{first.text}/{streamed.text}/{aim}"

    @new.tool(risk="high")
    def send_note(to: str, body: str) -> dict[str, str]:
        """Send a note (high risk: a person approves it)."""
        return {"sent": body, "to": to}

    @new.agent(name="canary_tools", encrypt=True)
    async def canary_tools(run: perdure.Run, text: str, base_url: str) -> str:
        # The model proposes send_note with ``text`` in its arguments; a person approves.
        client = ChatCompletionsClient(base_url=base_url, api_key=lambda: "test")
        try:
            done = await run.agent(
                client, model="gpt-4o", messages=[Message.user(text)], tools=[send_note],
                policy=perdure.Policy("notes", rules=(perdure.Allow({"send_note"}),)),
                max_turns=3)
        finally:
            await client.aclose()
        return done.text

    @new.define_query(agent="canary_all")
    def said(view: perdure.MemoryView) -> list[Any]:
        return [view.step("echo"), *view.emitted("said")]

    return new


app = build_app(
    os.environ.get("PERDURE_TEST_STORE", "sqlite:///perdure-acceptance.db"),
    os.environ.get("PERDURE_TEST_KEYS"),
)
