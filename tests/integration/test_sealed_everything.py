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
from perdure.core.approvals import decision_problem
from perdure.core.gate import args_digest, canonical_args
from perdure.core.sealing import SEALED
from perdure.keys.sealer import Sealer
from perdure.llm import ChatCompletionsClient, FlushPolicy, Message, recorded_calls
from perdure.llm.scripted import ScriptedReply, ScriptedServer, ScriptedToolCall
from tests.integration.engine_support import wait_until
from tests.integration.test_secrets import RawSQL, raw, stored_bytes
from tests.web.support import csrf_of, serve, stop_serving

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


RAN: list[str] = []  # what the tool below was given, in this process


def register_tools(app: perdure.App, base_url: str | None = None) -> perdure.App:
    """An encrypt-all agent whose model proposes a high-risk tool call per turn."""

    @app.tool(risk="high")
    def send_note(to: str, body: str) -> dict[str, Any]:
        """Send a note (a person approves each)."""
        RAN.append(body)
        return {"sent": f"sent {body}", "to": to}

    @app.agent(name="sealed_tooler", encrypt=True)
    async def tooler(run: perdure.Run, task: str) -> dict[str, Any]:
        assert base_url is not None
        client = ChatCompletionsClient(base_url=base_url, api_key=lambda: "k")
        try:
            done = await run.agent(
                client, model="gpt-4o", messages=[Message.user(task)], tools=[send_note],
                policy=perdure.Policy("notes", rules=(perdure.Allow({"send_note"}),)),
                max_turns=5)
        finally:
            await client.aclose()
        return {"text": done.text,
                "calls": [[o.outcome, o.result, o.error] for o in done.calls]}

    return app


def _note(body: str) -> ScriptedReply:
    return ScriptedReply(tool_calls=(
        ScriptedToolCall("send_note", json.dumps({"to": "bob", "body": body}), None),))


def test_tool_calls_of_an_encrypt_all_agent_are_sealed_and_approved_opened(
        make_app: MakeApp, server: ScriptedServer, raw: RawSQL, store_url: str,
        key_dir: Path) -> None:
    """Its model proposes three high-risk calls with the canary in their arguments: one
    approved on the dashboard, one edited through the API, one approved by id from the
    CLI (which shows the arguments sealed). Every proposal, the gate's view, the edit,
    results and the conversation are sealed; approvals read them opened; replay ran
    each tool call once."""
    RAN.clear()
    app = register_tools(make_app(), server.openai_base_url)
    server.script(_note(f"one {CANARY}"), _note(f"two {CANARY}"), _note(f"three {CANARY}"),
                  ScriptedReply(text="all sent"))
    handle = app.options(object_id="tool-1").start("sealed_tooler", f"notes about {CANARY}")
    runner = CliRunner()
    base = ["--store", store_url, "--key-dir", str(key_dir)]

    def cli_prints(*args: str) -> str:
        done = runner.invoke(cli, [*base, *args])
        assert done.exit_code == 0, (args, done.output)
        assert CANARY not in done.output, args
        return done.output

    def pending(body: str) -> perdure.PendingApproval:
        def found() -> bool:
            return any(p.arguments.get("body") == body for p in app.approvals())
        assert wait_until(found, TIMEOUT), app.get("tool-1")
        [item] = app.approvals()
        return item

    with app.background_worker():
        # 1. The App and the dashboard read the proposal opened; the CLI sealed.
        first = pending(f"one {CANARY}")
        args_json = canonical_args(first.arguments)
        assert first.args_hash != args_digest(args_json)  # keyed: no guessing oracle
        key = Sealer(app.store, app.data_keys, "tool-1").data_key()
        assert first.args_hash == args_digest(args_json, key)
        listed = cli_prints("approvals")
        assert f"args {first.args_hash[:16]}: <sealed>" in listed
        [as_json] = json.loads(cli_prints("approvals", "--json"))
        assert set(as_json["arguments"]) == {SEALED}
        assert as_json["args_hash"] == first.args_hash
        cli_prints("show", "tool-1")
        dashboard = serve(store_url, key_dir)
        try:
            browser = dashboard.login()
            inbox = browser.get("/inbox").text
            assert f"one {CANARY}" in inbox
            assert f"one {CANARY}" in browser.get("/objects/tool-1").text
            got = browser.post("/inbox/approve", data={
                "csrf": csrf_of(inbox), "object_id": "tool-1",
                "proposal_id": first.proposal_id, "edit": ""})
            assert got.status_code == 303
            browser.close()
        finally:
            stop_serving(dashboard)

        # 2. An edit through the API: sealed in the event and in memory.
        second = pending(f"two {CANARY}")
        app.approve("tool-1", second.proposal_id, edit={"to": "bob", "body": f"ed {CANARY}"})

        # 3. Approved by id from the CLI, which never opens.
        third = pending(f"three {CANARY}")
        cli_prints("approve", "tool-1", third.proposal_id)
        result = handle.result(timeout=TIMEOUT)

    assert result["text"] == "all sent"
    assert [c[0] for c in result["calls"]] == ["done", "done", "done"]
    assert result["calls"][1][1] == {"sent": f"sent ed {CANARY}", "to": "bob"}
    assert [f"one {CANARY}", f"ed {CANARY}", f"three {CANARY}"] == RAN  # each once
    assert len(server.requests) == 4

    # Sealed in memory, the events and every other table; readable opened.
    assert CANARY.encode() not in stored_bytes(raw)
    records = app.history("tool-1")
    proposed = [r for r in records if r.kind == "tool_proposed"]
    assert len(proposed) == 4 and all(set(r.body["args"]) == {SEALED} for r in proposed)
    assert all(set(r.body["reason"]) == {SEALED}
               for r in records if r.kind == "tool_gated")
    results = [r for r in records if r.kind == "tool_result"]
    assert all(set(r.body["result"]) == {SEALED} for r in results)
    [edited] = [r for r in records if r.kind == "tool_decided" and r.body["decision"] == "edit"]
    assert set(edited.body["edit"]) == {SEALED}
    opened = {r.seq: r for r in app.history("tool-1", opened=True)}
    assert json.loads(opened[edited.seq].body["edit"])["body"] == f"ed {CANARY}"
    sealer = Sealer(app.store, app.data_keys, "tool-1")
    for rec in records:
        if rec.kind == "tool_decided" and rec.body["decision"] != "expire":
            assert decision_problem(rec, data_key=sealer.data_key) is None, rec.body
    for args in (["show", "tool-1"], ["show", "tool-1", "--json"], ["tail", "tool-1"],
                 ["result", "tool-1"], ["approvals"]):
        cli_prints(*args)


def register_secret_tool(app: perdure.App, base_url: str | None = None) -> perdure.App:
    """An agent *without* encryption whose tool returns a ``Secret``."""

    @app.tool(risk="low")
    def fetch_token(user: str) -> dict[str, Any]:
        """A credential for ``user``, as a secret."""
        return {"user": user, "token": perdure.Secret(f"tok-{CANARY}")}

    @app.agent(name="plain_tooler")
    async def plain_tooler(run: perdure.Run) -> dict[str, Any]:
        assert base_url is not None
        client = ChatCompletionsClient(base_url=base_url, api_key=lambda: "k")
        try:
            done = await run.agent(
                client, model="gpt-4o", messages=[Message.user("get a token")],
                tools=[fetch_token],
                policy=perdure.Policy("tokens", rules=(perdure.Allow({"fetch_token"}),)))
        finally:
            await client.aclose()
        [call] = done.calls
        return {"secret": call.result["token"] == perdure.Secret(f"tok-{CANARY}"),
                "told": call.text()}

    return app


def test_a_secret_a_tool_returns_is_sealed_for_any_agent(
        make_app: MakeApp, server: ScriptedServer, raw: RawSQL) -> None:
    """The agent gets the ``Secret`` back (also on replay); memory holds it sealed and
    the model, whose conversation memory keeps in clear, is told ``[secret]``."""
    app = register_secret_tool(make_app(), server.openai_base_url)
    server.script(ScriptedReply(tool_calls=(
        ScriptedToolCall("fetch_token", json.dumps({"user": "ada"}), "t1"),)),
        ScriptedReply(text="got it"))
    handle = app.options(object_id="plain-1").start("plain_tooler")
    with app.background_worker():
        result = handle.result(timeout=TIMEOUT)
    assert result == {"secret": True,
                      "told": '{"token": "[secret]", "user": "ada"}'}
    assert CANARY not in json.dumps(server.requests[1].body)
    assert CANARY.encode() not in stored_bytes(raw)
    [done] = [r for r in app.history("plain-1") if r.kind == "tool_result"]
    assert set(done.body["result"]["token"]) == {SEALED} and done.body["result"]["user"] == "ada"
