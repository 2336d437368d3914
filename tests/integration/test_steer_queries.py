"""Queries: named state read from an object's memory without running or waking it; no
lease is taken, nothing is written; typed errors for unknown queries and objects, and
memory that does not verify is refused. Both stores, a real worker."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

import perdure
from perdure.cli import cli
from tests.integration.engine_support import wait_until
from tests.integration.steer_support import register


def _row_state(app: perdure.App, object_id: str) -> tuple[object, ...]:
    row = app.store.get(object_id)
    assert row is not None
    return (row.epoch, row.head_seq, row.head_hash, row.lease_owner, row.status, row.ready_at)


def test_a_query_reads_a_dormant_object_without_waking_it(
        make_app: Callable[..., perdure.App]) -> None:
    app = register(make_app())
    handle = app.options(object_id="count-1").start("counter", [1, 2, 3])
    with app.background_worker():
        assert wait_until(lambda: handle.status() is perdure.Status.DORMANT, timeout=10)
    before = _row_state(app, "count-1")
    records = len(app.history("count-1"))
    assert handle.query("total") == 6
    assert app.query("count-1", "steps_over", 1) == [3, 6]
    assert app.query("count-1", "total") == 6
    assert app.query("count-1", name="total") == 6

    @app.query(agent="counter", name="doubled")
    def doubled(view: perdure.MemoryView) -> int:
        return 2 * int(view.last_emitted("total", 0))

    assert handle.query("doubled") == 12
    with pytest.raises(perdure.ConfigurationError, match="takes nothing else"):
        app.query("count-1", agent="counter")
    with pytest.raises(perdure.ConfigurationError, match="object id and a query name"):
        app.query("count-1")
    assert _row_state(app, "count-1") == before  # no lease, no write, not woken
    assert len(app.history("count-1")) == records
    with pytest.raises(perdure.UnknownQueryError,
                       match="declared: broken, doubled, steps_over, total"):
        app.query("count-1", "nope")
    with pytest.raises(perdure.ObjectNotFoundError):
        app.query("ghost", "total")
    with pytest.raises(perdure.QueryFailedError, match="KeyError") as failed:
        app.query("count-1", "broken")
    assert isinstance(failed.value.__cause__, KeyError)
    with pytest.raises(perdure.QueryFailedError, match="TypeError"):
        app.query("count-1", "steps_over")  # a missing argument: the query's error
    # It goes on, answered, and the query sees the rest.
    with app.background_worker():
        handle.send("more", [10])
        assert handle.result(timeout=10) == 16
    assert app.query("count-1", "steps_over", 6) == [16]
    assert app.verify("count-1").ok


def test_a_query_reads_a_running_object(make_app: Callable[..., perdure.App]) -> None:
    app = make_app()
    release = threading.Event()

    def hold() -> str:
        release.wait(20)
        return "held"

    @app.agent(name="holder")
    async def holder(run: perdure.Run) -> str:
        await run.emit("phase", "one")
        await run.step(hold)
        await run.emit("phase", "two")
        return "done"

    @app.define_query(agent=holder)
    def phase(view: perdure.MemoryView) -> object:
        return {"phase": view.last_emitted("phase"), "status": view.status,
                "ended": view.ended, "args": list(view.intent.args),
                "id": view.context.object_id}

    handle = app.options(object_id="run-1").start(holder)
    with app.background_worker():
        assert wait_until(lambda: handle.status() is perdure.Status.RUNNING
                          and len(app.history("run-1")) >= 2, timeout=10)
        before = _row_state(app, "run-1")
        assert handle.query("phase") == {"phase": "one", "status": "running",
                                         "ended": False, "args": [], "id": "run-1"}
        assert _row_state(app, "run-1") == before  # the worker keeps its lease
        release.set()
        assert handle.result(timeout=10) == "done"
    assert handle.query("phase")["phase"] == "two"
    assert handle.query("phase")["ended"] is True


def test_declaring_queries_is_checked(make_app: Callable[..., perdure.App]) -> None:
    app = register(make_app())
    with pytest.raises(perdure.ConfigurationError, match="declared twice"):
        app.define_query(agent="counter", name="total")(lambda view: 0)
    with pytest.raises(perdure.ConfigurationError, match="not async"):
        async def later(view: perdure.MemoryView) -> int:
            return 0
        app.define_query(agent="counter")(later)
    with pytest.raises(perdure.UnknownAgentError):
        app.define_query(agent=len)(lambda view: 0)
    with pytest.raises(perdure.ConfigurationError):
        app.define_query(agent="counter", name="bad\x00name")(lambda view: 0)
    clone = app.with_settings(poll_interval=0.02)
    clone.define_query(agent="counter", name="only_clone")(lambda view: 1)
    with pytest.raises(perdure.UnknownQueryError):
        app.options(object_id="c").start("counter", [1]).query("only_clone")


def test_a_query_refuses_forged_memory(make_app: Callable[..., perdure.App],
                                       store_url: str) -> None:
    app = register(make_app())
    app.options(object_id="forged").start("counter", [5])
    with app.background_worker():
        assert wait_until(lambda: app.get("forged").status is perdure.Status.DORMANT,
                          timeout=10)
    assert app.query("forged", "total") == 5
    # Someone with write access to the store changes a recorded step result.
    seq = next(r.seq for r in app.history("forged") if r.kind == "emitted")
    forged = json.dumps({"pos": 1, "cmd": "emit", "name": "total", "data": 500},
                        separators=(",", ":")).encode()
    if store_url.startswith("sqlite"):
        import sqlite3
        conn = sqlite3.connect(store_url.removeprefix("sqlite:///"))
        conn.execute("UPDATE records SET body = ? WHERE object_id = ? AND seq = ?",
                     (forged, "forged", seq))
        conn.commit()
        conn.close()
    else:
        import psycopg
        with psycopg.connect(store_url) as conn:
            conn.execute("UPDATE records SET body = %s WHERE object_id = %s AND seq = %s",
                         (forged, "forged", seq))
    with pytest.raises(perdure.IntegrityError, match=f"#{seq}"):
        app.query("forged", "total")


def test_perdure_query_on_the_command_line(make_app: Callable[..., perdure.App],
                                           store_url: str, key_dir: Path) -> None:
    app = register(make_app())
    app.options(object_id="cli-q").start("counter", [2, 3])
    with app.background_worker():
        assert wait_until(lambda: app.get("cli-q").status is perdure.Status.DORMANT,
                          timeout=10)
    runner = CliRunner()
    base = ["--store", store_url, "--key-dir", str(key_dir),
            "--app", "tests.integration.steer_support:app"]
    done = runner.invoke(cli, [*base, "query", "cli-q", "total"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.output) == 5
    with_arg = runner.invoke(cli, [*base, "query", "cli-q", "steps_over", "2"])
    assert json.loads(with_arg.output) == [5]
    bad_json = runner.invoke(cli, [*base, "query", "cli-q", "steps_over", "{nope"])
    assert bad_json.exit_code != 0 and "not valid JSON" in bad_json.output
