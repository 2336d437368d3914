"""The canary: a secret goes everywhere an agent can put it and is found nowhere at rest.

A random canary key is passed as a ``Secret`` argument, returned by a step, quoted in
the message of a step's failed attempt, put in a progress marker, sent in an event and
held in two resources' credentials (an ``Environment`` secret and a ``PostgresSession``
password, restored on the second worker after the first is killed; the environment is
also handed to a dev server, whose descriptor keeps it);
an agent registered with ``encrypt=True`` gets it inside plain strings, emits it, sends
it to a model and gets it back in the replies (one streamed), asks a question whose
prompt and choices hold it, and has a goal holding it refined in from outside; another
``encrypt=True`` agent's model proposes a high-risk tool call whose arguments hold it,
which a person approves through the API once the CLI listed it sealed, and the tool's
result holds it too. Real ``perdure
worker`` processes run both objects; one is SIGKILLed while they wait, another replays
their memory and finishes them. The canary is then searched for, byte for byte, in:

- the SQLite file, its WAL and shared-memory file, read raw while a worker holds the
  database open and again after every process let go;
- every file of a PostgreSQL server the test starts for itself (``initdb``/``pg_ctl``
  into a temporary folder: its heap, its WAL, its log), after a ``CHECKPOINT``;
- the worker processes' logs and the CLI's output (``show``, ``show --json``, ``tail``,
  ``result``, ``query``, ``questions``, ``approvals``, ``ls``, ``ls --json``,
  ``export-heads``, ``verify``).

It must be found 0 times; a plain marker argument passed beside it must be found, so
that the search is known to read the data it claims to read.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import perdure
from perdure import Secret
from perdure.llm.scripted import (
    RecordedRequest,
    ScriptedReply,
    ScriptedServer,
    ScriptedToolCall,
)
from tests.acceptance import secret_agents
from tests.acceptance.harness import PERDURE_CMD, REPO_ROOT, Cluster, WorkerProc, wait_until
from tests.acceptance.test_postgres import PrivateServer, private_pg

__all__ = ["private_pg"]  # the fixture, shared with test_postgres.py

APP_SPEC = "tests.acceptance.secret_agents:app"


def spawn(cluster: Cluster) -> WorkerProc:
    """A ``perdure worker`` process serving the canary agents."""
    node_id = f"s{len(cluster.workers):03d}"
    log_path = cluster.log_dir / f"{node_id}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [*PERDURE_CMD, "-v", "--app", APP_SPEC, "--node-id", node_id, "worker",
             "--concurrency", "4", "--lease", "1", "--poll", "0.01"],
            cwd=REPO_ROOT, env=cluster.env(node_id), stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    worker = WorkerProc(node_id, proc, log_path)
    cluster.workers.append(worker)
    wait_until(f"{node_id} claiming", worker.ready, 30)
    return worker


def found(needle: bytes, paths: list[Path]) -> dict[str, int]:
    """How often ``needle`` occurs in each file (folders searched whole), non-zero only."""
    counts: dict[str, int] = {}
    for path in paths:
        files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
        for file in files:
            try:
                data = file.read_bytes()
            except (FileNotFoundError, PermissionError):
                continue
            if needle in data:
                counts[str(file)] = data.count(needle)
    return counts


def respond(request: RecordedRequest) -> ScriptedReply:
    """The model: with tools offered, it proposes ``send_note`` of the user's text, then
    says what the tool told it; without, it echoes the user (in chunks when streamed)."""
    messages = request.body.get("messages") or []
    if not request.body.get("tools"):
        return ScriptedReply(text=f"echo: {request.last_user_text()}", chunk_chars=6)
    if messages and messages[-1].get("role") == "tool":
        return ScriptedReply(text=f"done {messages[-1].get('content')}")
    args = json.dumps({"to": "bob", "body": request.last_user_text()})
    return ScriptedReply(tool_calls=(ScriptedToolCall("send_note", args, "c1"),))


def wait_status(app: perdure.App, oid: str, status: str) -> None:
    wait_until(f"{oid} {status}", lambda: str(app.get(oid).status) == status, 30)


def run_canary(cluster: Cluster, at_rest: list[Path], db_url: str,
               flush: object = None) -> None:
    """Start both objects, kill a worker while they wait, finish them on another, and
    search every place; ``flush()`` (if given) makes the store write its data out."""
    canary = f"sk-live-{secrets.token_hex(12)}"
    marker = f"plain-marker-{secrets.token_hex(6)}"
    app = secret_agents.build_app(cluster.store_url, str(cluster.key_dir))
    # The model echoes what it is told (the canary), in chunks when it streams.
    model = ScriptedServer(responder=respond).start()
    try:
        one = app.options(object_id="canary-1").start("canary", Secret(canary), marker, db_url)
        whole = app.options(object_id="canary-2").start(
            "canary_all", f"all-{canary}", model.openai_base_url)
        tools = app.options(object_id="canary-3").start(
            "canary_tools", f"tool-{canary}", model.openai_base_url)
        first = spawn(cluster)
        wait_status(app, "canary-1", "dormant")
        wait_status(app, "canary-2", "dormant")
        wait_status(app, "canary-3", "dormant")

        def search(when: str) -> None:
            if callable(flush):
                flush()
            assert found(canary.encode(), at_rest) == {}, f"canary at rest {when}"
            assert found(marker.encode(), at_rest), f"the search read nothing {when}"

        search("while the first worker holds the store open")
        # What an asking object shows before it is answered: the question sealed.
        for args in (["questions"], ["questions", "--json"], ["ls", "--json"],
                     ["show", "canary-2"], ["show", "canary-2", "--json"], ["approvals"],
                     ["approvals", "--json"], ["show", "canary-3"]):
            done = cluster.cli(*args)
            assert done.returncode == 0, (args, done.stderr)
            assert canary not in done.stdout + done.stderr, f"canary in perdure {args}"
        assert "<sealed>" in cluster.cli("questions").stdout
        assert "<sealed>" in cluster.cli("approvals").stdout
        first.kill()
        asked = len(model.requests)
        # The App holding the key reads the proposal opened, and approves it.
        [pending] = [p for p in app.approvals() if p.object_id == "canary-3"]
        assert pending.arguments == {"to": "bob", "body": f"tool-{canary}"}
        app.approve("canary-3", pending.proposal_id)
        app.refine("canary-2", goal={"aim": f"aim-{canary}"})
        app.send("canary-1", "credentials", {"token": Secret(canary), "user": "ada"})
        app.send("canary-2", "note", f"note-{canary}")
        second = spawn(cluster)
        assert one.result(timeout=30) == {"marker": marker, "token": Secret(canary),
                                          "same": True, "env": True,
                                          "session": "canary-agent"}
        reports = [r.body for r in app.history("canary-1") if r.kind == "restore_report"]
        restored = [e for report in reports for e in report["resources"]
                    if report["outcome"] == "restored"]
        assert {e["name"] for e in restored} >= {"env", "db"}, reports
        assert whole.result(timeout=30) == (f"all-{canary}/note-{canary}/echo: all-{canary}/"
                                            f"echo: again all-{canary}/aim-{canary}")
        assert tools.result(timeout=30) == (
            f'done {{"sent": "tool-{canary}", "to": "bob"}}')
        # the replays on the second worker asked nobody again (canary-3: its next turn)
        assert len(model.requests) == asked + 1
        kinds = {r.kind for r in app.history("canary-2")}
        assert {"model_call", "model_chunks", "intent_refined", "emitted"} <= kinds
        search("while the second worker holds the store open")
        assert second.stop() == 0
        search("after every worker let go")

        failed = [r for r in app.history("canary-1") if r.kind == "step_failed"]
        assert failed and "refused credential [secret]" in failed[0].body_bytes.decode()

        logs = cluster.logs()
        assert canary not in logs, "canary in a worker log"
        assert "use_key got Secret('***')" in logs  # the agent's own print reached the log

        for args in (["show", "canary-1"], ["show", "canary-1", "--json"],
                     ["tail", "canary-1"], ["tail", "canary-1", "--json"],
                     ["show", "canary-2", "--json"], ["tail", "canary-2", "--json"],
                     ["result", "canary-1"], ["result", "canary-1", "--json"],
                     ["result", "canary-2"], ["ls"], ["ls", "--json"], ["export-heads"],
                     ["--app", APP_SPEC, "query", "canary-2", "said"],
                     ["verify", "canary-1"], ["verify", "canary-2"],
                     ["show", "canary-3"], ["show", "canary-3", "--json"],
                     ["tail", "canary-3"], ["result", "canary-3"], ["verify", "canary-3"],
                     ["approvals", "--json"]):
            done = cluster.cli(*args)
            assert done.returncode == 0, (args, done.stderr)
            assert canary not in done.stdout + done.stderr, f"canary in perdure {args}"
        assert marker in cluster.cli("show", "canary-1", "--json").stdout
    finally:
        app.close()
        model.stop()


@pytest.fixture
def sqlite_cluster(tmp_path: Path) -> Iterator[Cluster]:
    made = Cluster(tmp_path)
    yield made
    made.close()


def test_canary_on_sqlite(sqlite_cluster: Cluster) -> None:
    """0 canaries in the SQLite file, WAL and shared-memory file, logs and CLI output."""
    assert sqlite_cluster.store_path is not None
    db = sqlite_cluster.store_path
    files = [db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")]
    run_canary(sqlite_cluster, files, "postgresql://postgres@127.0.0.1:5432/postgres")
    assert db.exists() and db.stat().st_size > 0


def test_canary_on_a_private_postgres(tmp_path: Path, private_pg: PrivateServer) -> None:
    """0 canaries in any file of a PostgreSQL server started for this test alone."""
    import psycopg

    def checkpoint() -> None:
        with psycopg.connect(private_pg.url, autocommit=True) as conn:
            conn.execute("CHECKPOINT")
            conn.execute("SELECT pg_switch_wal()")
        time.sleep(0.05)

    cluster = Cluster(tmp_path, private_pg.url)
    try:
        run_canary(cluster, [private_pg.dir], private_pg.url, flush=checkpoint)
    finally:
        cluster.close()
