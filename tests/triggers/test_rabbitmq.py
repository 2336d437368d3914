"""RabbitMQ triggers against a real RabbitMQ server: each message starts one object (or
signals one) exactly once, whatever is redelivered; poison goes to the dead-letter
queue with its reason; a dropped connection is made again without loss."""

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

pytest.importorskip("aio_pika", reason="needs aio-pika: pip install -e '.[rabbitmq]'")

import perdure
from perdure.triggers import Message, Result, Trigger, Triggers
from tests.triggers import trigger_app
from tests.triggers.rabbit import Rabbit
from tests.triggers.support import (
    Proxy,
    job_ids,
    need_rabbitmq,
    running,
    said,
    unique,
    wait_until,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def rabbit() -> Iterator[Rabbit]:
    """A queue of this test's own, with its dead-letter queue; deleted afterwards."""
    made = Rabbit(need_rabbitmq(), unique("perdure-test"))
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


def test_each_message_starts_one_object_once(rabbit: Rabbit, app: perdure.App) -> None:
    """Five messages, one of them published twice under its id: five objects, named by
    the message ids, each with its message's arguments; every message acknowledged."""
    triggers = Triggers()
    triggers.rabbitmq(rabbit.queue, agent="job", url=rabbit.url, name="jobs")
    rabbit.publish(*[(job(n), f"m-{n}", {}) for n in range(5)], (job(2), "m-2", {}))
    with running(triggers, app):
        wait_until("five objects", lambda: len(job_ids(app)) == 5)
        wait_until("the queue emptied", lambda: rabbit.ready() == 0)
    assert job_ids(app) == [f"jobs-m-{n}" for n in range(5)]
    for n in range(5):
        first = app.history(f"jobs-m-{n}")[0].body
        assert first["context"]["labels"] == {"trigger": "jobs"}
        assert first["intent"]["args"] == [n]
    assert rabbit.ready() == 0  # nothing requeued when the consumer closed: all acknowledged
    assert rabbit.dead() == []


def test_the_id_header_names_a_message(rabbit: Rabbit, app: perdure.App) -> None:
    """A message is known by its x-message-id header before its message_id property (a
    publisher may fill that with a random id, new each time it publishes again)."""
    triggers = Triggers()
    triggers.rabbitmq(rabbit.queue, agent="job", url=rabbit.url, name="jobs")
    rabbit.publish((job(7), None, {"x-message-id": "order 7/a"}),
                   (job(7), "other", {"x-message-id": "order 7/a"}))
    with running(triggers, app):
        wait_until("the queue emptied", lambda: rabbit.ready() == 0 and len(job_ids(app)) == 1)
    (only,) = job_ids(app)
    assert only.startswith("jobs-sha256-")  # an id with a space and a slash is hashed


def test_signals_reach_the_named_object_once(rabbit: Rabbit, app: perdure.App) -> None:
    """Signal mode: each message's body is the payload of event ``ping`` to the object
    its header names, once per message id, so a message delivered twice is one event."""
    triggers = Triggers()
    triggers.rabbitmq(rabbit.queue, url=rabbit.url, name="pings", mode="signal",
                      event="ping", object_header="x-object", prefetch=1)  # one at a time
    handle = app.options(object_id="box").start("inbox", 3)
    to_box = {"x-object": "box"}
    rabbit.publish((b'{"n": 1}', "p-1", to_box), (b'{"n": 2}', "p-2", to_box),
                   (b'{"n": 1}', "p-1", to_box), (b'{"n": 3}', "p-3", to_box))
    with running(triggers, app), app.background_worker():
        assert handle.result(timeout=30) == [{"n": 1}, {"n": 2}, {"n": 3}]
        wait_until("the queue emptied", lambda: rabbit.ready() == 0)
    assert rabbit.dead() == []


def test_poison_goes_to_the_dead_letter_queue_with_its_reason(
        rabbit: Rabbit, app: perdure.App, caplog: pytest.LogCaptureFixture) -> None:
    """A body that is not JSON, an unknown agent, arguments the agent does not take, a
    field a start message does not have: each rejected to the dead-letter exchange, its
    reason logged, nothing started; the good message beside them starts its object."""
    caplog.set_level(logging.WARNING, logger="perdure.triggers")
    triggers = Triggers()
    triggers.rabbitmq(rabbit.queue, url=rabbit.url, name="any")  # the message names the agent
    rabbit.publish(
        (b"{not json", "bad-json", {}),
        (b'{"agent": "nope", "args": [1]}', "bad-agent", {}),
        (b'{"agent": "job", "kwargs": {"m": 1}}', "bad-args", {}),
        (b'{"agent": "job", "args": [1], "extra": true}', "bad-field", {}),
        (b'{"agent": "job", "args": [1]}', "good", {}))
    with running(triggers, app):
        wait_until("four dead letters", lambda: rabbit.ready(rabbit.dead_queue) == 4)
        wait_until("the good object", lambda: job_ids(app) == ["any-good"])
    dead = rabbit.dead()
    assert sorted(str(m.message_id) for m in dead) == sorted(
        ["bad-json", "bad-agent", "bad-args", "bad-field"])
    for message in dead:
        death = message.headers["x-death"][0]  # RabbitMQ's account of the dead-lettering
        assert death["reason"] == "rejected" and death["queue"] == rabbit.queue
    logged = said(caplog)
    assert "message bad-json from" in logged and "cannot decode the message" in logged
    assert "'nope' is not registered" in logged
    assert "agent 'job' takes" in logged
    assert "unknown field(s) extra" in logged
    assert job_ids(app) == ["any-good"]
    assert [i.object_id for i in app.list(limit=100)] == ["any-good"]


def test_a_dropped_connection_is_made_again_without_loss_or_double(
        rabbit: Rabbit, app: perdure.App, caplog: pytest.LogCaptureFixture) -> None:
    """The broker connection is cut (through a proxy) right after a start committed and
    before its acknowledgement: the consumer connects again by itself, the unacknowledged
    messages come again and start nothing twice, and every message is handled."""
    caplog.set_level(logging.INFO, logger="perdure.triggers")
    proxy = Proxy(rabbit.url, 5672)
    triggers = Triggers()
    triggers.rabbitmq(rabbit.queue, agent="job", url=proxy.url, name="jobs", prefetch=4)
    commits = []

    def cut_on_third(trigger: Trigger, message: Message, result: Result) -> None:
        commits.append(message.message_id)
        if len(commits) == 3:
            proxy.cut()

    triggers.after_commit = cut_on_third
    rabbit.publish(*[(job(n), f"m-{n}", {}) for n in range(12)])
    try:
        with running(triggers, app):
            wait_until("twelve objects", lambda: len(job_ids(app)) == 12)
            wait_until("every message acknowledged", lambda: rabbit.ready() == 0)
    finally:
        proxy.close()
    assert proxy.cuts == 1
    assert job_ids(app) == sorted(f"jobs-m-{n}" for n in range(12))
    logged = said(caplog)
    assert "connected again" in logged
    assert "was applied before" in logged  # the cut-off message came again, changed nothing
    assert rabbit.dead() == []


def _consumer(env: dict[str, str], kill_at: int | None) -> subprocess.Popen[str]:
    run_env = {**env}
    if kill_at:
        run_env["TRIGGER_TEST_KILL_AT"] = str(kill_at)
    return subprocess.Popen(
        [sys.executable, "-m", "perdure", "--app", "tests.triggers.trigger_app:app",
         "triggers", "run", "jobs-rabbit"],
        cwd=REPO, env=run_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _campaign(rabbit: Rabbit, tmp_path: Path, messages: int, kills: int) -> None:
    store = f"sqlite:///{tmp_path / 'store.db'}"
    env = {**os.environ, "TRIGGER_TEST_STORE": store, "TRIGGER_TEST_KEYS": str(tmp_path / "keys"),
           "TRIGGER_TEST_QUEUE": rabbit.queue, "TRIGGER_TEST_RABBITMQ": rabbit.url}
    rabbit.publish(*[(job(n), f"m-{n}", {}) for n in range(messages)])
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
            wait_until("every message acknowledged", lambda: rabbit.ready() == 0)
        finally:
            proc.send_signal(signal.SIGTERM)
            output, _ = proc.communicate(timeout=30)
        logs.append(output)
        assert proc.returncode == 0, output
        assert job_ids(app) == sorted(f"jobs-rabbit-m-{n}" for n in range(messages))
        for n in range(messages):
            assert app.history(f"jobs-rabbit-m-{n}")[0].body["intent"]["args"] == [n]
    finally:
        app.close()
    assert rabbit.ready() == 0 and rabbit.dead() == []
    # Each killed process's last start came again to the next one and changed nothing.
    assert sum(log.count("was applied before") for log in logs[1:]) >= kills


def test_consumers_killed_between_commit_and_ack(rabbit: Rabbit, tmp_path: Path) -> None:
    """Consumer processes SIGKILLed right after a start committed, before its message's
    acknowledgement, three times: every message's object exists exactly once."""
    _campaign(rabbit, tmp_path, messages=12, kills=3)


@pytest.mark.slow
def test_consumers_killed_between_commit_and_ack_soak(rabbit: Rabbit, tmp_path: Path) -> None:
    """The same, with 80 messages and 20 kills."""
    _campaign(rabbit, tmp_path, messages=80, kills=20)


def test_a_missing_queue_stops_the_trigger_with_its_name(app: perdure.App) -> None:
    """The trigger looks its queue up and declares nothing: a queue that does not exist
    is a ``ConfigurationError`` naming it."""
    triggers = Triggers()
    triggers.rabbitmq(unique("perdure-missing"), agent="job", url=need_rabbitmq())
    with pytest.raises(perdure.ConfigurationError, match="does not exist at amqp://guest:"
                       r"\*\*\*@"), running(triggers, app):
        pass
