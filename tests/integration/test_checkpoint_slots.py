"""Checkpoint slots: superseding descriptors and progress markers outside the chain,
signed and fenced; a slot that does not verify parks the object; slots go away with
what they follow (release, the step's outcome, the object's end). Both stores."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

import perdure
from perdure.resources import OpenFile

AppFactory = Callable[..., perdure.App]


def _sql(store_url: str, statement: str, params: tuple[Any, ...] = ()) -> None:
    """Change the store behind perdure's back (a forger with write access to it)."""
    if store_url.startswith("sqlite:///"):
        with sqlite3.connect(store_url.removeprefix("sqlite:///")) as conn:
            conn.execute(statement.replace("%s", "?"), params)
        return
    with psycopg.connect(store_url, autocommit=True) as conn:
        conn.execute(statement, params)


def _slots(app: perdure.App, object_id: str) -> list[str]:
    return [row.slot for row in app.store.checkpoints(object_id)]


def _register_logger(app: perdure.App, folder: Path, seen: dict[str, Any]) -> None:
    @app.agent(name="logger")
    async def logger(run: perdure.Run, n: int) -> int:
        log = await run.resource("log", OpenFile(folder / "agent.log", "w"))
        if not run.replaying:
            for minute in range(n):
                log.write(f"minute {minute}\n")
                await run.checkpoint_resources()
        await run.wait_for("go")
        seen["pos"] = log.tell()
        await run.release("log")
        seen["after_release"] = _slots(app, run.object_id)
        await run.wait_for("end")
        return n


def test_checkpoints_go_to_one_slot_and_a_resume_reads_it(
        make_app: AppFactory, store_url: str, key_dir: Path, tmp_path: Path) -> None:
    """30 checkpoints leave one slot row and no superseding record in the chain; the
    resume restores the file at the last checkpointed position; release deletes the
    slot, the object's end deletes every slot."""
    app = make_app()
    seen: dict[str, Any] = {}
    _register_logger(app, tmp_path, seen)
    app.options(object_id="log-1").start("logger", 30)
    app.run_worker(until=lambda: app.get("log-1").status == "dormant")
    assert _slots(app, "log-1") == ["resource:log"]
    resource_records = [r for r in app.history("log-1") if r.kind == perdure.Kind.RESOURCE]
    assert len(resource_records) == 1, "the declaration only: no superseding records"
    shown = subprocess.run(
        [sys.executable, "-m", "perdure", "--store", store_url, "--key-dir", str(key_dir),
         "show", "log-1"], capture_output=True, text=True, check=True, timeout=60,
        env={**os.environ, "COLUMNS": "300"}).stdout
    assert "checkpoint slots" in shown and "resource:log: latest value after #" in shown
    app.send("log-1", "go", None)
    app.run_worker(until=lambda: "after_release" in seen)
    expected = sum(len(f"minute {m}\n") for m in range(30))
    assert seen["pos"] == expected
    assert seen["after_release"] == []
    report = [r.body for r in app.history("log-1") if r.kind == perdure.Kind.RESTORE_REPORT]
    assert report[-1]["outcome"] == "restored"
    app.send("log-1", "end", None)
    with app.background_worker():
        assert app.handle("log-1").result(timeout=10) == 30
    assert _slots(app, "log-1") == []
    app.verify("log-1")


@pytest.mark.parametrize("damage", [
    "UPDATE checkpoints SET body = %s WHERE object_id = %s",
    "UPDATE checkpoints SET after_seq = after_seq + 1, body = body || %s "
    "WHERE object_id = %s",
])
def test_an_altered_slot_row_parks_the_object(make_app: AppFactory, store_url: str,
                                              tmp_path: Path, damage: str) -> None:
    """A slot row changed behind perdure's back (its body, or the head it follows) fails
    its signature check at the next claim: the object parks with the reason; the
    forged descriptor is never used."""
    app = make_app()
    seen: dict[str, Any] = {}
    _register_logger(app, tmp_path, seen)
    app.options(object_id="log-2").start("logger", 3)
    app.run_worker(until=lambda: app.get("log-2").status == "dormant")
    forged = (b'{"decl":0,"descriptor":{"path":"/etc/passwd","mode":"r","pos":0},'
              b'"name":"log","on_stale":"park","state":"open","type":"x","version":1}')
    _sql(store_url, damage, (forged if "SET body" in damage else b" ", "log-2"))
    app.send("log-2", "go", None)
    app.run_worker(until=lambda: app.get("log-2").status == "parked")
    assert "pos" not in seen, "the agent never continued on a forged slot"
    parked = [r.body["reason"] for r in app.history("log-2") if r.kind == perdure.Kind.PARKED]
    why = parked[-1] if parked else str(app.get("log-2").note)
    assert "checkpoint slot 'resource:log'" in why


def test_a_write_from_a_fenced_out_epoch_is_refused(make_app: AppFactory, store_url: str,
                                                   tmp_path: Path) -> None:
    """Another claim moved the object's epoch on: this node's next slot write raises
    ``LeaseLostError`` (as its next append would) and writes nothing."""
    app = make_app()
    said: list[str] = []

    @app.agent(name="fenced")
    async def fenced(run: perdure.Run) -> int:
        log = await run.resource("log", OpenFile(tmp_path / "f.log", "w"))
        log.write("one\n")
        await run.checkpoint_resources()
        _sql(store_url, "UPDATE objects SET epoch = epoch + 1 WHERE object_id = %s",
             (run.object_id,))
        log.write("two\n")
        try:
            await run.checkpoint_resources()
        except perdure.LeaseLostError as exc:
            said.append(type(exc).__name__)
            raise
        return 1

    app.options(object_id="fence-1").start("fenced")
    app.run_worker(until=lambda: bool(said))
    assert said == ["LeaseLostError"]
    rows = app.store.checkpoints("fence-1")
    assert [r.slot for r in rows] == ["resource:log"]
    descriptor = json.loads(rows[0].body)["descriptor"]
    assert 4 in descriptor.values(), "the first checkpoint stays; the refused one is not"


def test_a_step_slot_is_gone_once_its_outcome_is_recorded(make_app: AppFactory) -> None:
    """A failed attempt's marker waits in the step's slot for the retry; the retry's
    success deletes it."""
    app = make_app()
    during: list[list[str]] = []

    def work() -> str:
        step = perdure.current_step()
        during.append(_slots(app, step.object_id))
        step.checkpoint({"at": step.attempt}, durable=True)
        if step.attempt == 1:
            raise ConnectionError("blip")
        return f"from {step.last_checkpoint}"

    @app.agent(name="stepper")
    async def stepper(run: perdure.Run) -> str:
        return await run.step(work, retry=perdure.RetryPolicy(base=0.01))

    handle = app.options(object_id="step-1").start("stepper")
    with app.background_worker():
        assert handle.result(timeout=10) == "from {'at': 1}"
    assert during == [[], ["step:0"]]
    assert _slots(app, "step-1") == []
