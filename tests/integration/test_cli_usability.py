"""What a new user meets first on the ``perdure`` command line, through the real CLI.

``perdure --version`` names the installed version. ``ls``, ``show``, ``result`` and
``verify`` print one JSON document with ``--json`` and keep their exit codes. At 80
columns ``ls`` and ``show`` wrap notes and failure reasons rather than cut them, never
cut an id, and ``ls`` says why a failed object failed even when the store has no note for
it. ``show`` prints the intent's keyword arguments beside its positional ones. ``verify
--all`` reports every object and goes on past one whose memory cannot be decoded.
``start`` with an id that exists says on stderr that it is that object.

This module is the ``--app`` of the CLI processes; the objects are run in the test's own
process by a background worker of the same agents on the test's store (SQLite and
PostgreSQL).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import perdure
from perdure.errors import ConfigurationError
from tests.cluster import one_root

ROOT = Path(__file__).resolve().parents[2]
MODULE = "tests.integration.test_cli_usability"

app = perdure.App(store="sqlite:///cli-usability-never-opened.db")

REASON = ("the quota of the upstream service was exhausted before the third page was read; "
          "retry after midnight or raise the quota in the console, then resume the batch "
          "from the page that failed (END-OF-REASON)")
LONG_ID = "order-2026-11-24-customer-0042-batch-007"  # 40 characters


def shout(text: str) -> str:
    """A step."""
    return text.upper()


@app.agent(name="greet")
def greet(run: perdure.SyncRun, who: str, punctuation: str = "!") -> str:
    """One recorded step."""
    return run.step(shout, who) + punctuation


@app.agent(name="explode")
def explode(run: perdure.SyncRun, reason: str) -> str:
    """Fails with a long reason."""
    raise ValueError(reason)


@app.agent(name="pair")
async def pair(run: perdure.Run, who: str) -> list[Any]:
    """Two children."""
    first = await run.delegate("greet", who)
    second = await run.delegate("greet", who, punctuation="?")
    return await run.join(first, second)


# -- helpers ----------------------------------------------------------------------


@pytest.fixture
def local(store_url: str, tmp_path: Path) -> Iterator[perdure.App]:
    """This module's agents on the test's store, to run objects in the test's process.

    The runner and the CLI are two nodes of one cluster: one root certifies both."""
    one_root(tmp_path / "keys-root", (tmp_path / "keys-local", "local"),
             (tmp_path / "keys-cli", "cli"))
    runner = app.with_settings(store=store_url, key_dir=str(tmp_path / "keys-local"),
                               node_id="local")
    runner.poll_interval = 0.01
    yield runner
    runner.close()


def cli(url: str, tmp_path: Path, *args: str, with_app: bool = False,
        columns: int = 80) -> subprocess.CompletedProcess[str]:
    """Run ``perdure`` on the test's store in a terminal ``columns`` wide."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERDURE_")}
    env.update(PYTHONPATH=str(ROOT), COLUMNS=str(columns))
    command = [sys.executable, "-m", "perdure", "--store", url, "--key-dir",
               str(tmp_path / "keys-cli"), "--node-id", "cli"]
    if with_app:
        command += ["--app", f"{MODULE}:app"]
    return subprocess.run([*command, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60, check=False)


def ok(done: subprocess.CompletedProcess[str]) -> str:
    """The stdout of a command that must have exited 0 quietly."""
    assert done.returncode == 0, done
    assert "Traceback" not in done.stderr, done.stderr
    return done.stdout


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The one ``error:`` line of a command that must have exited 1."""
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


def flat(text: str) -> str:
    """``text`` with every run of whitespace made one space (wrapped lines joined)."""
    return " ".join(text.split())


def run_objects(local: perdure.App) -> None:
    """A completed ``greet`` (with a keyword argument), a failed ``explode`` under a long
    id, and a completed ``pair`` with two children."""
    with local.background_worker():
        local.options(object_id="g-1").start("greet", "ana", punctuation="?!").result(timeout=20)
        failed = local.options(object_id=LONG_ID).start("explode", REASON)
        with pytest.raises(perdure.AgentFailedError):
            failed.result(timeout=20)
        local.options(object_id="p-1").start("pair", "bo").result(timeout=20)


def execute(url: str, statement: str, *params: Any) -> None:
    """Run one SQL statement on the store behind perdure's back."""
    if url.startswith("sqlite:///"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            conn.execute(statement, params)
        return
    import psycopg

    with psycopg.connect(url, autocommit=True) as pg:
        pg.execute(statement.replace("?", "%s").encode(), params)


# -- tests ------------------------------------------------------------------------


def test_version(tmp_path: Path) -> None:
    """``perdure --version`` prints ``perdure X.Y.Z`` from ``perdure.__version__``."""
    done = subprocess.run([sys.executable, "-m", "perdure", "--version"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)
    assert ok(done).strip() == f"perdure {perdure.__version__}"


def test_json_output(store_url: str, tmp_path: Path, local: perdure.App) -> None:
    """``--json`` on ls, show, result and verify: one JSON document each, same exit codes."""
    run_objects(local)
    fields = {field.name for field in dataclasses.fields(perdure.ObjectInfo)}

    listed = json.loads(ok(cli(store_url, tmp_path, "ls", "--json")))
    assert {entry["object_id"] for entry in listed} == {"g-1", LONG_ID, "p-1", "p-1.0",
                                                         "p-1.1"}
    assert all(set(entry) == fields for entry in listed)
    by_id = {entry["object_id"]: entry for entry in listed}
    assert by_id["g-1"]["status"] == "completed" and by_id["g-1"]["agent"] == "greet"
    assert by_id[LONG_ID]["status"] == "failed"
    assert f"ValueError: {REASON}" in by_id[LONG_ID]["note"]

    shown = json.loads(ok(cli(store_url, tmp_path, "show", "g-1", "--json")))
    assert set(shown) == {"object", "records", "children"}
    assert shown["object"]["object_id"] == "g-1" and set(shown["object"]) == fields
    assert [rec["seq"] for rec in shown["records"]] == list(range(1, 4))
    assert all(set(rec) == {"seq", "ts", "node_id", "kind", "body"}
               for rec in shown["records"])
    assert [rec["kind"] for rec in shown["records"]] == ["instantiated", "step_done",
                                                         "terminated"]
    intent = shown["records"][0]["body"]["intent"]
    assert intent["args"] == ["ana"] and intent["kwargs"] == {"punctuation": "?!"}
    assert shown["children"] == []
    family = json.loads(ok(cli(store_url, tmp_path, "show", "p-1", "--json")))
    assert [child["object_id"] for child in family["children"]] == ["p-1.0", "p-1.1"]

    result = json.loads(ok(cli(store_url, tmp_path, "result", "g-1", "--json")))
    assert result == {"object_id": "g-1", "status": "completed", "result": "ANA?!"}
    failed = cli(store_url, tmp_path, "result", LONG_ID, "--json")
    assert "END-OF-REASON" in one_error_line(failed)
    answer = json.loads(failed.stdout)
    assert answer["object_id"] == LONG_ID and answer["status"] == "failed"
    assert answer["error"]["type"].endswith("ValueError")
    assert answer["error"]["message"] == REASON
    missing = cli(store_url, tmp_path, "result", "nobody", "--json")
    one_error_line(missing)
    assert json.loads(missing.stdout)["error"]["type"] == "ObjectNotFoundError"

    reports = json.loads(ok(cli(store_url, tmp_path, "verify", "--all", "--json")))
    assert len(reports) == 5
    assert all(set(report) == {"object_id", "ok", "records", "bad_seq", "reason",
                               "head_hash"} for report in reports)
    assert all(report["ok"] and report["bad_seq"] is None and report["head_hash"]
               for report in reports)
    assert {r["object_id"]: r["records"] for r in reports}["g-1"] == 3


def test_ls_and_show_fit_80_columns(store_url: str, tmp_path: Path,
                                    local: perdure.App) -> None:
    """At 80 columns no line is longer, ids are whole, failure reasons are whole (wrapped),
    and ``show`` prints the intent's keyword arguments."""
    run_objects(local)

    listed = ok(cli(store_url, tmp_path, "ls"))
    assert max(len(line) for line in listed.splitlines()) <= 80, listed
    assert LONG_ID in listed.split() and "p-1.0" in listed.split()
    assert f"ValueError: {REASON}" in flat(listed), listed
    wide = ok(cli(store_url, tmp_path, "ls", columns=400))
    row = next(line for line in wide.splitlines() if line.startswith(LONG_ID))
    assert row.split()[:3] == [LONG_ID, "explode@1", "failed"]
    assert row.endswith(f"ValueError: {REASON}")  # wide enough: all on its own row

    shown = ok(cli(store_url, tmp_path, "show", LONG_ID))
    assert max(len(line) for line in shown.splitlines()) <= 80, shown
    assert shown.split()[0] == LONG_ID
    assert f"failed: ValueError: {REASON}" in flat(shown), shown
    greeting = ok(cli(store_url, tmp_path, "show", "g-1"))
    assert 'greet@1 args=["ana"] kwargs={"punctuation": "?!"}' in flat(greeting), greeting


def test_ls_reads_the_failure_when_the_store_has_no_note(store_url: str, tmp_path: Path,
                                                           local: perdure.App) -> None:
    """A failed object without a note: ``ls`` takes ``Type: message`` from its memory."""
    run_objects(local)
    execute(store_url, "UPDATE objects SET note = NULL WHERE object_id = ?", LONG_ID)
    assert local.get(LONG_ID).note is None

    listed = ok(cli(store_url, tmp_path, "ls", "--status", "failed", columns=400))
    assert listed.splitlines()[1].endswith(f"ValueError: {REASON}"), listed
    entry = json.loads(ok(cli(store_url, tmp_path, "ls", "--status", "failed", "--json")))
    assert entry[0]["note"] == f"ValueError: {REASON}"


def test_verify_all_goes_on_past_damaged_memory(sqlite_url: str, tmp_path: Path) -> None:
    """One object's undecodable record is reported as ``FAIL`` and the others as ``ok``;
    exit 1. An unknown id among named ones is a ``FAIL`` line too."""
    one_root(tmp_path / "keys-root", (tmp_path / "keys-local", "local"),
             (tmp_path / "keys-cli", "cli"))
    runner = app.with_settings(store=sqlite_url, key_dir=str(tmp_path / "keys-local"))
    try:
        with runner.background_worker():
            for object_id in ("a", "b", "c"):
                runner.options(object_id=object_id).start("greet", object_id).result(timeout=20)
    finally:
        runner.close()
    execute(sqlite_url, "UPDATE records SET body = X'FF' WHERE object_id = 'b' AND seq = 2")

    done = cli(sqlite_url, tmp_path, "verify", "--all")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done
    lines = done.stdout.splitlines()
    assert sorted(line.split()[0] + " " + line.split()[1] for line in lines) == [
        "FAIL b:", "ok a:", "ok c:"]
    assert next(line for line in lines if line.startswith("FAIL")).startswith(
        "FAIL b: record #2 is bad: body is not valid JSON")

    reports = json.loads(cli(sqlite_url, tmp_path, "verify", "--all", "--json").stdout)
    assert {r["object_id"]: (r["ok"], r["bad_seq"]) for r in reports} == {
        "a": (True, None), "b": (False, 2), "c": (True, None)}

    named = cli(sqlite_url, tmp_path, "verify", "a", "nobody", "c")
    assert named.returncode == 1, named
    assert [line.split()[:2] for line in named.stdout.splitlines()] == [
        ["ok", "a:"], ["FAIL", "nobody:"], ["ok", "c:"]]
    assert "no object 'nobody'" in named.stdout


def test_start_says_when_the_object_exists(store_url: str, tmp_path: Path,
                                           local: perdure.App) -> None:
    """A new id: only the id on stdout. The same id again: the id, and a note on stderr
    naming the object's status; with other arguments a warning, once ``App.start`` says
    how they differ. Arguments that do not fit the agent: one error line."""
    first = cli(store_url, tmp_path, "start", "greet", "--args", '"ana"', "--id", "s-1",
                with_app=True)
    assert ok(first) == "s-1\n" and first.stderr == ""

    again = cli(store_url, tmp_path, "start", "greet", "--args", '"ana"', "--id", "s-1",
                with_app=True)
    assert ok(again) == "s-1\n"
    assert re.fullmatch(r"note: object s-1 already exists \(ready\); this is that object\n",
                        again.stderr), again.stderr

    if getattr(local.options(object_id="s-1").start("greet", "bo"), "differs", None) is not None:
        other = cli(store_url, tmp_path, "start", "greet", "--args", '"bo"', "--id", "s-1",
                    with_app=True)
        assert ok(other) == "s-1\n"
        assert other.stderr.startswith("warning: ") and len(other.stderr.splitlines()) == 1

    try:
        local.options(object_id="probe").start("greet", "probe", nope=1)
        checks_signature = False
    except ConfigurationError:
        checks_signature = True
    bad = cli(store_url, tmp_path, "start", "greet", "--kwargs", '{"nope": 1}', "--id", "s-2",
              with_app=True)
    assert "Traceback" not in bad.stderr, bad.stderr
    if checks_signature:
        assert "error: " in one_error_line(bad)
