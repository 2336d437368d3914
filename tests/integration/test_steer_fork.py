"""Fork: a new object from an object's verified memory up to a record, signed by this
node, with ``forked_from``; it runs on with current code (recorded steps not run
again). Fork points inside a step pair, a gather or after a pending child are refused.
Both stores, a real worker."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

import perdure
from perdure.cli import cli
from tests.integration.engine_support import count_lines
from tests.integration.steer_support import note, register


def _lines(path: str) -> list[str]:
    return Path(path).read_text().splitlines() if count_lines(path) else []


def _seq_of(app: perdure.App, object_id: str, kind: str, name: str) -> int:
    return next(r.seq for r in app.history(object_id)
                if r.kind == kind and r.body.get("name") == name)


def test_a_fork_replays_its_prefix_and_runs_the_rest(make_app: Callable[..., perdure.App],
                                                     tmp_path: Path) -> None:
    app = register(make_app())
    marks = str(tmp_path / "marks")
    with app.background_worker():
        assert app.options(object_id="orig").start("pipeline", marks).result(timeout=10) == [
            "a", "b", "c"]
    assert _lines(marks) == ["a", "b", "c"]
    original = app.history("orig")
    at = _seq_of(app, "orig", "step_done", "b")
    fork = app.fork("orig", at=at, new_id="orig-fork")
    assert fork.created and fork.object_id == "orig-fork"
    info = app.get("orig-fork")
    assert info.forked_from == {"object_id": "orig", "seq": at, "hash": original[at - 1].hash}
    assert info.parent_id is None and info.agent == "pipeline"
    copied = app.history("orig-fork")
    assert len(copied) == at
    assert [(r.kind, r.body) for r in copied[1:]] == [(r.kind, r.body)
                                                      for r in original[1:at]]
    assert {r.node_id for r in copied} == {app.node_id}
    assert app.verify("orig-fork").ok
    assert app.history("orig") == original  # the original is untouched
    with app.background_worker():
        assert fork.result(timeout=10) == ["a", "b", "c"]
    assert _lines(marks) == ["a", "b", "c", "c"]  # only the step after the prefix ran
    assert app.verify("orig-fork").ok and app.verify("orig").ok
    # The same call again returns the same fork; another id is another fork.
    again = app.fork("orig", at=at, new_id="orig-fork")
    assert not again.created and again.object_id == "orig-fork"
    with pytest.raises(perdure.ObjectConflictError):
        app.fork("orig", at=at - 1, new_id="orig-fork")
    fresh = app.fork("orig", at=1)
    assert fresh.created and fresh.object_id != "orig-fork"
    with app.background_worker():
        assert fresh.result(timeout=10) == ["a", "b", "c"]
    assert _lines(marks) == ["a", "b", "c", "c", "a", "b", "c"]


def test_a_fork_runs_with_current_code(make_app: Callable[..., perdure.App],
                                       tmp_path: Path) -> None:
    """The fork goes on with the code the workers run now: a node whose pipeline has
    another last step replays the first two and runs its own last one."""
    app = register(make_app())
    marks = str(tmp_path / "marks")
    with app.background_worker():
        app.options(object_id="v1").start("pipeline", marks).result(timeout=10)
    at = _seq_of(app, "v1", "step_done", "b")
    fork = app.fork("v1", at=at)
    fixed = make_app()

    @fixed.agent(name="pipeline")
    async def pipeline(run: perdure.Run, marks: str) -> list[str]:
        done = [await run.step(note, marks, "a", name="a"),
                await run.step(note, marks, "b", name="b")]
        return [*done, await run.step(note, marks, "c2", name="c2")]

    with fixed.background_worker():
        assert fixed.handle(fork.object_id).result(timeout=10) == ["a", "b", "c2"]
    assert _lines(marks) == ["a", "b", "c", "c2"]
    assert fixed.verify(fork.object_id).ok


def test_fork_points_that_are_refused(make_app: Callable[..., perdure.App],
                                      tmp_path: Path) -> None:
    app = register(make_app())
    marks = str(tmp_path / "marks")
    with app.background_worker():
        app.options(object_id="pay").start("careful", marks).result(timeout=10)
        app.options(object_id="gather").start("brancher", marks).result(timeout=10)
    started = _seq_of(app, "pay", "step_started", "pay")
    with pytest.raises(perdure.ForkError,
                       match=f"fork at #{started - 1} or #{started + 1}"):
        app.fork("pay", at=started)
    head = len(app.history("pay"))
    with pytest.raises(perdure.ForkError, match="terminal record"):
        app.fork("pay", at=head)
    for bad in (0, head + 1, -3):
        with pytest.raises(perdure.ForkError, match="is not one of them"):
            app.fork("pay", at=bad)
    with pytest.raises(perdure.ConfigurationError):
        app.fork("pay", at=True)
    with pytest.raises(perdure.ConfigurationError):
        app.fork("pay", at="2")  # type: ignore[arg-type]
    with pytest.raises(perdure.ObjectNotFoundError):
        app.fork("nobody", at=1)
    with pytest.raises(perdure.ConfigurationError):
        app.fork("pay", at=1, new_id="bad\x00id")
    branches = [r.seq for r in app.history("gather") if isinstance(r.body.get("pos"), str)]
    assert len(branches) >= 2
    with pytest.raises(perdure.ForkError, match="inside the gather at position 0"):
        app.fork("gather", at=branches[0])
    # The points the errors name are good ones.
    fork = app.fork("pay", at=started + 1)
    gathered = app.fork("gather", at=branches[-1])
    with app.background_worker():
        assert fork.result(timeout=10) == ["a", "pay"]
        assert gathered.result(timeout=10) == ["l", "r", "z"]
    assert app.store.get("pay-none") is None


def test_a_child_still_running_refuses_the_fork(make_app: Callable[..., perdure.App]
                                                ) -> None:
    app = make_app()

    @app.agent(name="kid")
    async def kid(run: perdure.Run) -> str:
        return str(await run.wait_for("go"))

    @app.agent(name="parent")
    async def parent(run: perdure.Run) -> str:
        child = await run.delegate(kid)
        return str(await child.result())

    with app.background_worker():
        handle = app.options(object_id="mom").start(parent)
        from tests.integration.engine_support import wait_until
        assert wait_until(lambda: handle.status() is perdure.Status.DORMANT, timeout=10)
        delegated = next(r for r in app.history("mom") if r.kind == "delegated")
        with pytest.raises(perdure.ForkError, match="signals only its own parent"):
            app.fork("mom", at=delegated.seq)
        app.send(delegated.body["child_id"], "go", 1)
        assert handle.result(timeout=10) == "1"
    finished = next(r.seq for r in app.history("mom") if r.kind == "child_finished")
    with pytest.raises(perdure.ForkError, match=f"or at #{finished} or later"):
        app.fork("mom", at=finished - 1)
    fork = app.fork("mom", at=finished)
    with app.background_worker():
        assert fork.result(timeout=10) == "1"  # the child's result replays


def test_a_fork_refuses_memory_that_does_not_verify(make_app: Callable[..., perdure.App],
                                                    tmp_path: Path, store_url: str) -> None:
    app = register(make_app())
    marks = str(tmp_path / "marks")
    with app.background_worker():
        app.options(object_id="tampered").start("pipeline", marks).result(timeout=10)
    seq = _seq_of(app, "tampered", "step_done", "a")
    if store_url.startswith("sqlite"):
        conn = sqlite3.connect(store_url.removeprefix("sqlite:///"))
        conn.execute("UPDATE records SET body = CAST(replace(CAST(body AS TEXT), '\"a\"}', "
                     "'\"x\"}') AS BLOB) WHERE object_id = 'tampered' AND seq = ?", (seq,))
        conn.commit()
        conn.close()
    else:
        import psycopg
        with psycopg.connect(store_url) as pg:
            pg.execute("UPDATE records SET body = convert_to(replace(convert_from(body, "
                       "'UTF8'), '\"a\"}', '\"x\"}'), 'UTF8') "
                       "WHERE object_id = 'tampered' AND seq = %s", (seq,))
    assert app.history("tampered")[seq - 1].body["result"] == "x"
    with pytest.raises(perdure.IntegrityError, match=f"#{seq}"):
        app.fork("tampered", at=seq + 1, new_id="from-tampered")
    assert app.store.get("from-tampered") is None


def test_perdure_fork_on_the_command_line(make_app: Callable[..., perdure.App],
                                          store_url: str, key_dir: Path,
                                          tmp_path: Path) -> None:
    app = register(make_app())
    marks = str(tmp_path / "marks")
    with app.background_worker():
        app.options(object_id="cli-orig").start("pipeline", marks).result(timeout=10)
    at = _seq_of(app, "cli-orig", "step_done", "a")
    runner = CliRunner()
    base = ["--store", store_url, "--key-dir", str(key_dir)]
    made = runner.invoke(cli, [*base, "fork", "cli-orig", "--at", str(at), "--id", "cli-f"])
    assert made.exit_code == 0, made.output
    assert made.output.strip() == "cli-f"
    text = runner.invoke(cli, [*base, "show", "cli-f"])
    assert f"forked from cli-orig at #{at}" in text.output
    shown = runner.invoke(cli, [*base, "show", "cli-f", "--json"])
    assert json.loads(shown.output)["object"]["forked_from"]["object_id"] == "cli-orig"
    refused = runner.invoke(cli, [*base, "fork", "cli-orig", "--at", "999"])
    assert refused.exit_code != 0


def test_one_record_by_seq_on_every_store(make_app: Callable[..., perdure.App],
                                          key_dir: Path, tmp_path: Path) -> None:
    """``Store.record(object_id, seq)``: what ``App.get`` reads for ``forked_from``; the
    same record as ``records`` gives, or ``None``; on the memory store too, where a fork
    runs like anywhere else."""
    marks = str(tmp_path / "marks")
    for app in (register(make_app()),
                register(perdure.App(store="memory:", key_dir=key_dir, poll_interval=0.01))):
        with app.background_worker():
            app.options(object_id="one").start("pipeline", marks).result(timeout=10)
        history = app.history("one")
        assert app.store.record("one", 1) == history[0]
        assert app.store.record("one", len(history)) == history[-1]
        assert app.store.record("one", len(history) + 1) is None
        assert app.store.record("nobody", 1) is None
        assert app.get("one").forked_from is None
        fork = app.fork("one", at=2)
        assert app.get(fork.object_id).forked_from == {
            "object_id": "one", "seq": 2, "hash": history[1].hash}
        assert app.get(fork.object_id, explain=False).forked_from is None
        with app.background_worker():
            assert fork.result(timeout=10) == ["a", "b", "c"]
        app.close()


def test_a_fork_cut_short_is_finished_by_forking_again(
        make_app: Callable[..., perdure.App], tmp_path: Path) -> None:
    """A fork whose process died after its first record was stored (the object held back
    from workers, its other records missing) is finished by the same fork call again."""
    import time

    from perdure.fork import build

    app = register(make_app())
    marks = str(tmp_path / "marks")
    with app.background_worker():
        app.options(object_id="src").start("pipeline", marks).result(timeout=10)
    at = _seq_of(app, "src", "step_done", "b")
    new, rest, _, _ = build(app, "src", at, "half")
    assert app.store.create(new, time.time())  # ... and the process dies here
    with app.background_worker():
        time.sleep(0.3)
        assert app.get("half", explain=False).records == 1  # no worker touched it
        assert app.get("half").status is perdure.Status.READY
        again = app.fork("src", at=at, new_id="half")
        assert not again.created
        assert again.result(timeout=10) == ["a", "b", "c"]
    assert len(rest) == at - 1
    assert app.verify("half").ok
    assert _lines(marks) == ["a", "b", "c", "c"]
