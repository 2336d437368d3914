"""NATS JetStream triggers against a real NATS server: each message starts one object
(or signals one) exactly once, whatever is redelivered; poison goes to the dead-letter
subject with its reason; a dropped connection is made again without loss."""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("nats", reason="needs nats-py: pip install -e '.[nats]'")

import perdure
from perdure.triggers import Message, Result, Trigger, Triggers
from tests.triggers import trigger_app
from tests.triggers.jetstream import JetStream
from tests.triggers.support import (
    Proxy,
    job_ids,
    need_nats,
    running,
    said,
    unique,
    wait_until,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def js() -> Iterator[JetStream]:
    """Streams of this test's own; deleted afterwards."""
    made = JetStream(need_nats(), unique("PERDURE_TEST").replace("-", "_"))
    yield made
    made.delete()


@pytest.fixture
def app(tmp_path: Path) -> Iterator[perdure.App]:
    """The trigger tests' App (its agents) on this test's SQLite store."""
    made = trigger_app.app.with_settings(store=f"sqlite:///{tmp_path / 'store.db'}",
                                         key_dir=tmp_path / "keys")
    yield made
    made.close()


def job(n: int) -> bytes:
    return json.dumps({"args": [n]}).encode()


def declare(triggers: Triggers, js: JetStream, servers: str | None = None,
            **options: object) -> Trigger:
    options.setdefault("agent", "job")
    return triggers.nats(js.subject, stream=js.stream, servers=servers or js.url, name="jobs",
                         dead_letter_subject=js.dead_subject, ack_wait=1.0, **options)  # type: ignore[arg-type]


def settled(js: JetStream, consumer: str) -> bool:
    return js.consumer(consumer) == (0, 0)


def test_each_message_starts_one_object_once(js: JetStream, app: perdure.App) -> None:
    """Messages with a Nats-Msg-Id start the object named by it; messages without are
    known by their stream sequence; every message acknowledged."""
    triggers = Triggers()
    trigger = declare(triggers, js)
    js.publish(*[(job(n), {"Nats-Msg-Id": f"m-{n}"}) for n in range(4)],
               (job(4), {}), (job(5), {}))
    with running(triggers, app):
        wait_until("six objects", lambda: len(job_ids(app)) == 6)
        wait_until("every message acknowledged", lambda: settled(js, trigger.consumer))
    assert job_ids(app) == sorted([*(f"jobs-m-{n}" for n in range(4)),
                                   f"jobs-{js.stream}:5", f"jobs-{js.stream}:6"])
    first = app.history(f"jobs-{js.stream}:6")[0].body
    assert first["intent"]["args"] == [5]
    assert first["context"]["labels"] == {"trigger": "jobs"}
    assert js.dead() == []


def test_signals_reach_the_named_object_once(js: JetStream, app: perdure.App) -> None:
    """Signal mode: each message's body is the payload of event ``ping`` to the object
    its body's field names, once per message id."""
    triggers = Triggers()
    declare(triggers, js, agent=None, mode="signal", event="ping", object_field="to",
            batch=1)
    handle = app.options(object_id="box").start("inbox", 3)
    js.publish(*[(json.dumps({"to": "box", "n": n}).encode(), {"Nats-Msg-Id": f"p-{n}"})
                 for n in range(3)])
    with running(triggers, app), app.background_worker():
        assert handle.result(timeout=30) == [{"to": "box", "n": n} for n in range(3)]
    assert js.dead() == []


def test_poison_goes_to_the_dead_letter_subject_with_its_reason(
        js: JetStream, app: perdure.App) -> None:
    """A body that is not JSON, an unknown agent, bad arguments: each published to the
    dead-letter subject with the reason in ``Perdure-Reason`` and terminated (never
    delivered again); nothing started; the good message beside them starts its object."""
    triggers = Triggers()
    trigger = declare(triggers, js, agent=None)
    js.publish((b"{not json", {"Nats-Msg-Id": "bad-json"}),
               (b'{"agent": "nope"}', {"Nats-Msg-Id": "bad-agent"}),
               (b'{"agent": "job", "args": [1, 2]}', {"Nats-Msg-Id": "bad-args"}),
               (b'{"agent": "job", "args": [1]}', {"Nats-Msg-Id": "good"}))
    with running(triggers, app):
        wait_until("three dead letters", lambda: js.dead_count() == 3)
        wait_until("every message settled", lambda: settled(js, trigger.consumer))
    dead = {m.headers["Perdure-Msg-Id"] if m.headers and "Perdure-Msg-Id" in m.headers
            else (m.headers or {})["Nats-Msg-Id"]: m for m in js.dead()}
    assert set(dead) == {"jobs:bad-json", "jobs:bad-agent", "jobs:bad-args"}
    reasons = {key: (m.headers or {})["Perdure-Reason"] for key, m in dead.items()}
    assert reasons["jobs:bad-json"].startswith("cannot decode the message: JSONDecodeError")
    assert "'nope' is not registered" in reasons["jobs:bad-agent"]
    assert "agent 'job' takes" in reasons["jobs:bad-args"]
    assert dead["jobs:bad-json"].data == b"{not json"
    assert (dead["jobs:bad-json"].headers or {})["Perdure-Subject"] == js.subject
    assert [i.object_id for i in app.list(limit=100)] == ["jobs-good"]


def test_a_dropped_connection_is_made_again_without_loss_or_double(
        js: JetStream, app: perdure.App, caplog: pytest.LogCaptureFixture) -> None:
    """The connection is cut (through a proxy) right after a start committed and before
    its acknowledgement: the client reconnects by itself, the unacknowledged message
    comes again after ack_wait and starts nothing twice; every message is handled."""
    caplog.set_level(logging.INFO, logger="perdure.triggers")
    proxy = Proxy(js.url, 4222)
    triggers = Triggers()
    trigger = declare(triggers, js, servers=proxy.url, batch=4)
    commits = []

    def cut_on_third(trigger: Trigger, message: Message, result: Result) -> None:
        commits.append(message.message_id)
        if len(commits) == 3:
            proxy.cut()

    triggers.after_commit = cut_on_third
    js.publish(*[(job(n), {"Nats-Msg-Id": f"m-{n}"}) for n in range(12)])
    try:
        with running(triggers, app):
            wait_until("twelve objects", lambda: len(job_ids(app)) == 12)
            wait_until("every message acknowledged", lambda: settled(js, trigger.consumer))
    finally:
        proxy.close()
    assert proxy.cuts == 1
    assert job_ids(app) == sorted(f"jobs-m-{n}" for n in range(12))
    logged = said(caplog)
    assert "connected again" in logged
    assert "was applied before" in logged
    assert js.dead() == []


def _consumer(env: dict[str, str], kill_at: int | None) -> subprocess.Popen[str]:
    run_env = {**env}
    if kill_at:
        run_env["TRIGGER_TEST_KILL_AT"] = str(kill_at)
    return subprocess.Popen(
        [sys.executable, "-m", "perdure", "--app", "tests.triggers.trigger_app:app",
         "triggers", "run", "jobs-nats"],
        cwd=REPO, env=run_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _campaign(js: JetStream, tmp_path: Path, messages: int, kills: int) -> None:
    store = f"sqlite:///{tmp_path / 'store.db'}"
    env = {**os.environ, "TRIGGER_TEST_STORE": store, "TRIGGER_TEST_KEYS": str(tmp_path / "keys"),
           "TRIGGER_TEST_SUBJECT": js.subject, "TRIGGER_TEST_STREAM": js.stream,
           "TRIGGER_TEST_NATS": js.url}
    # Half with ids of their own, half known by their stream sequence.
    js.publish(*[(job(n), {"Nats-Msg-Id": f"m-{n}"} if n % 2 else {})
                 for n in range(messages)])
    logs = []
    for _ in range(kills):
        proc = _consumer(env, kill_at=random.randint(1, 3))
        output, _ = proc.communicate(timeout=60)
        logs.append(output)
        assert proc.returncode == -signal.SIGKILL, output
    app = trigger_app.app.with_settings(store=store, key_dir=tmp_path / "keys")
    try:
        proc = _consumer(env, kill_at=None)
        try:
            wait_until("every message's object",
                       lambda: len(job_ids(app)) == messages, timeout=60)
            wait_until("every message acknowledged", lambda: settled(js, "perdure-jobs-nats"))
        finally:
            proc.send_signal(signal.SIGTERM)
            output, _ = proc.communicate(timeout=30)
        logs.append(output)
        assert proc.returncode == 0, output
        expected = sorted(f"jobs-nats-m-{n}" if n % 2 else f"jobs-nats-{js.stream}:{n + 1}"
                          for n in range(messages))
        assert job_ids(app) == expected
        args = sorted(app.history(oid)[0].body["intent"]["args"][0] for oid in expected)
        assert args == list(range(messages))
    finally:
        app.close()
    assert js.dead() == []
    assert sum(log.count("was applied before") for log in logs[1:]) >= kills


def test_consumers_killed_between_commit_and_ack(js: JetStream, tmp_path: Path) -> None:
    """Consumer processes SIGKILLed right after a start committed, before its message's
    acknowledgement, three times: every message's object exists exactly once."""
    _campaign(js, tmp_path, messages=12, kills=3)


@pytest.mark.slow
def test_consumers_killed_between_commit_and_ack_soak(js: JetStream, tmp_path: Path) -> None:
    """The same, with 80 messages and 20 kills."""
    _campaign(js, tmp_path, messages=80, kills=20)


def test_a_missing_stream_stops_the_trigger_with_its_name(app: perdure.App) -> None:
    """A stream that does not exist is a ``ConfigurationError`` naming it."""
    triggers = Triggers()
    triggers.nats("nowhere.jobs", stream=unique("MISSING").replace("-", "_"), agent="job",
                  servers=need_nats())
    with pytest.raises(perdure.ConfigurationError, match=r"stream 'MISSING_.*' does not exist"), \
            running(triggers, app):
        pass
