"""An agent registered with ``encrypt=True``: everything it writes is sealed.

Its arguments, emitted data, the question it asks (prompt and choices), a refinement's
goal sent from outside, and its model calls (messages, replies, streamed chunks) hold
a canary; real SDKs over real HTTP against the scripted server, a real worker, both
stores. The canary is then found nowhere in the store's tables, nor in what the CLI
prints (``result``, ``query``, ``questions``, ``ls --json``, ``show``, ``tail``: the
CLI never opens); the App holding the data keys and the dashboard on a node with the
key-encryption key open the question, the result and the query's answer.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("openai")

from click.testing import CliRunner

import perdure
from perdure.cli import cli
from perdure.core.sealing import SEALED
from perdure.llm import ChatCompletionsClient, FlushPolicy, Message, recorded_calls
from perdure.llm.scripted import ScriptedReply, ScriptedServer
from tests.integration.engine_support import wait_until
from tests.integration.test_secrets import RawSQL, raw, stored_bytes
from tests.web.support import serve, stop_serving

__all__ = ["raw"]

MakeApp = Callable[..., perdure.App]
CANARY = "cnry-7f3e19a2c4b8d605"
TIMEOUT = 20.0


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    """A scripted model server on 127.0.0.1, stopped after the test."""
    with ScriptedServer() as running:
        yield running


def register(app: perdure.App, base_url: str | None = None) -> perdure.App:
    """The encrypt-all agent (its model server at ``base_url``) and its query."""

    @app.agent(name="sealed_asker", encrypt=True)
    async def asker(run: perdure.Run, topic: str) -> dict[str, Any]:
        await run.emit("said", f"emitted {topic}")
        assert base_url is not None
        client = ChatCompletionsClient(base_url=base_url, api_key=lambda: "k")
        try:
            first = await run.model(client, model="gpt-4o",
                                    messages=[Message.user(f"plan {topic}")])
            streamed = await run.model(
                client, model="gpt-4o", stream=True,
                flush=FlushPolicy(interval=0.01, max_tokens=1000),
                messages=[Message.user(f"plan {topic}"), first.message(),
                          Message.user("go on")])
        finally:
            await client.aclose()
        answer = await run.wait_for("answer", prompt=f"ship {topic}?",
                                    choices=[f"yes {topic}", "no"])
        return {"answer": answer, "first": first.text, "streamed": streamed.text,
                "goal": run.intent.goal}

    @app.define_query(agent="sealed_asker")
    def said(view: perdure.MemoryView) -> list[Any]:
        return list(view.emitted("said"))

    return app


cli_app = register(perdure.App(store="sqlite:///never-opened.db"))


def test_everything_an_encrypt_all_agent_writes_is_sealed(
        make_app: MakeApp, server: ScriptedServer, raw: RawSQL, store_url: str,
        key_dir: Path) -> None:
    app = register(make_app(), server.openai_base_url)
    server.script(ScriptedReply(text=f"first reply {CANARY}"),
                  ScriptedReply(text=f"streamed reply {CANARY}", chunk_chars=5))
    topic = f"topic {CANARY}"
    handle = app.options(object_id="seal-1").start("sealed_asker", topic)
    runner = CliRunner()
    base = ["--store", store_url, "--key-dir", str(key_dir)]

    def cli_prints(*args: str) -> str:
        done = runner.invoke(cli, [*base, *args])
        assert done.exit_code == 0, (args, done.output)
        assert CANARY not in done.output, args
        return done.output

    with app.background_worker():
        assert wait_until(lambda: app.get("seal-1").waiting_event == "answer", TIMEOUT)
        # The App holding the data keys reads the question opened ...
        [question] = app.questions()
        assert question.prompt == f"ship {topic}?"
        assert question.choices == (f"yes {topic}", "no")
        assert app.get("seal-1").asking[0].prompt == f"ship {topic}?"
        # ... the dashboard on a node with the key-encryption key shows it ...
        dashboard = serve(store_url, key_dir)
        try:
            browser = dashboard.login()
            inbox = browser.get("/inbox").text
            page = browser.get("/objects/seal-1").text
            browser.close()
        finally:
            stop_serving(dashboard)
        assert f"ship {topic}?" in inbox and f"yes {topic}" in inbox
        assert f"ship {topic}?" in page
        # ... the object's note and the CLI say only that it asks something sealed.
        note = app.get("seal-1").note or ""
        assert "'<sealed>'" in note and CANARY not in note
        assert "<sealed>" in cli_prints("questions")
        asked = json.loads(cli_prints("questions", "--json"))
        assert set(asked[0]["prompt"]) == {SEALED}
        cli_prints("ls", "--json")
        cli_prints("show", "seal-1", "--json")
        dormant = [r for r in app.history("seal-1") if r.kind == "dormant"][-1]
        assert set(dormant.body["prompt"]) == {SEALED}
        assert all(set(c) == {SEALED} for c in dormant.body["choices"])

        app.refine("seal-1", goal={"aim": f"aim {CANARY}"})
        assert wait_until(lambda: any(r.kind == "intent_refined"
                                      for r in app.history("seal-1")), TIMEOUT)
        app.send("seal-1", "answer", f"yes {topic}")
        result = handle.result(timeout=TIMEOUT)

    assert result == {"answer": f"yes {topic}", "first": f"first reply {CANARY}",
                      "streamed": f"streamed reply {CANARY}",
                      "goal": {"aim": f"aim {CANARY}"}}
    assert app.query("seal-1", "said") == [f"emitted {topic}"]

    # Nothing of it in clear in any table; the search reads what it claims to.
    stored = stored_bytes(raw)
    assert CANARY.encode() not in stored
    assert b"sealed_asker" in stored and SEALED.encode() in stored
    kinds = {r.kind for r in app.history("seal-1")}
    assert {"model_call", "model_chunks", "intent_refined", "emitted"} <= kinds

    # The model calls are stored once per object, sealed value by value, and read back
    # whole with the App's key (a replay rebuilt them: the agent got the replies).
    calls = [r for r in app.history("seal-1") if r.kind == "model_call"]
    assert all(set(v) == {SEALED} for r in calls for v in r.body["blobs"].values())
    chunks = [c for r in app.history("seal-1") if r.kind == "model_chunks"
              for c in r.body["chunks"]]
    assert chunks and all(set(c) == {SEALED} for c in chunks)
    opened = app.history("seal-1", opened=True)
    [one, two] = recorded_calls(opened)
    assert one.reply.text == f"first reply {CANARY}"
    assert two.reply.text == f"streamed reply {CANARY}"
    assert two.request.messages[0] == Message.user(f"plan {topic}")
    numbers = [n for r in calls for n in r.body["blobs"]]
    assert len(numbers) == len(set(numbers))  # each value once
    assert len(server.requests) == 2  # replays asked nobody

    # The CLI never opens.
    assert cli_prints("result", "seal-1").strip() == '"<sealed>"'
    assert json.loads(cli_prints("result", "seal-1", "--json"))["result"] == "<sealed>"
    shown = cli_prints("--app", "tests.integration.test_sealed_everything:cli_app",
                       "query", "seal-1", "said")
    assert json.loads(shown) == ["<sealed>"]
    for args in (["show", "seal-1"], ["show", "seal-1", "--json"], ["tail", "seal-1"],
                 ["tail", "seal-1", "--json"], ["ls", "--json"]):
        cli_prints(*args)
