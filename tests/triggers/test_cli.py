"""``perdure triggers``, ``perdure triggers run`` and ``perdure worker --triggers``
through the real command, in processes of their own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.triggers import trigger_app
from tests.triggers.support import wait_until

REPO = Path(__file__).resolve().parents[2]
APP = "tests.triggers.trigger_app:app"


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PERDURE_", "TRIGGER_TEST_")) or k == "PERDURE_WARN_STALLS"}
    env.update(PYTHONPATH=str(REPO), TRIGGER_TEST_STORE=f"sqlite:///{tmp_path / 'store.db'}",
               TRIGGER_TEST_KEYS=str(tmp_path / "keys"), **extra)
    return env


def _perdure(tmp_path: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "perdure", *args], cwd=tmp_path,
                          env=_env(tmp_path, **extra), capture_output=True, text=True,
                          timeout=60, check=False)


def test_triggers_lists_what_the_app_declares(tmp_path: Path) -> None:
    """``perdure triggers`` (and ``list``, ``--json``) names each trigger, its source and
    what it does; nothing connects to a broker for it."""
    declared = {"TRIGGER_TEST_QUEUE": "jobs", "TRIGGER_TEST_SUBJECT": "ORD.jobs",
                "TRIGGER_TEST_STREAM": "ORD", "TRIGGER_TEST_FOLDER": str(tmp_path),
                "TRIGGER_TEST_RABBITMQ": "amqp://u:secret@127.0.0.1:1/"}
    shown = _perdure(tmp_path, "--app", APP, "triggers", **declared)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == f"files  folder  folder {tmp_path} (*)  starts take"
    assert lines[1] == ("jobs-rabbit  rabbitmq  queue jobs at amqp://u:***@127.0.0.1:1/  "
                        "starts job")
    assert lines[2].startswith("jobs-nats  nats  subject ORD.jobs of stream ORD (consumer "
                               "perdure-jobs-nats)")
    assert "secret" not in shown.stdout
    as_json = _perdure(tmp_path, "--app", APP, "triggers", "list", "--json", **declared)
    docs = json.loads(as_json.stdout)
    assert [d["name"] for d in docs] == ["files", "jobs-rabbit", "jobs-nats"]
    assert docs[2]["dead_letter_subject"] == "perdure.dead.jobs-nats"


def test_bad_names_and_no_app_are_one_line(tmp_path: Path) -> None:
    """An unknown trigger name, or no ``--app``: one line, exit 1, nothing run."""
    unknown = _perdure(tmp_path, "--app", APP, "triggers", "run", "nope",
                       TRIGGER_TEST_FOLDER=str(tmp_path))
    assert unknown.returncode == 1
    assert unknown.stderr.strip().splitlines() == [
        "error: no trigger 'nope' is declared (declared: files)"]
    no_app = _perdure(tmp_path, "triggers")
    assert no_app.returncode == 1 and "Traceback" not in no_app.stderr
    assert "pass --app module:app" in no_app.stderr
    empty = _perdure(tmp_path, "--app", APP, "triggers")
    assert empty.returncode == 0 and empty.stdout.startswith("no trigger is declared")


def test_worker_with_triggers_starts_and_runs_what_comes(tmp_path: Path) -> None:
    """``perdure worker --triggers``: a file dropped in the watched folder starts an
    object that the same node runs to its end; SIGTERM stops both, exit 0."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "perdure", "--app", APP, "worker", "--triggers"],
        cwd=tmp_path, env=_env(tmp_path, TRIGGER_TEST_FOLDER=str(inbox)),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    app = trigger_app.app.with_settings(store=f"sqlite:///{tmp_path / 'store.db'}",
                                        key_dir=tmp_path / "keys")
    try:
        (inbox / "note.txt").write_text("hello")

        def done() -> bool:
            found = app.list(agent="take") if (tmp_path / "store.db").exists() else []
            return bool(found) and found[0].terminal

        wait_until("the file's object to end", done, timeout=60)
        (only,) = app.list(agent="take")
        assert app.handle(only.object_id).result(timeout=5) == "hello"
    finally:
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
        app.close()
    assert proc.returncode == 0, output
    assert "with triggers files" in output
