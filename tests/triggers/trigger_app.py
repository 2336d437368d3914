"""The App the trigger tests run in consumer processes (``perdure --app
tests.triggers.trigger_app:app triggers run``), set by the environment:

- ``TRIGGER_TEST_STORE``, ``TRIGGER_TEST_KEYS``: the store and key folder;
- ``TRIGGER_TEST_QUEUE`` (and ``TRIGGER_TEST_RABBITMQ``): a RabbitMQ trigger ``jobs-rabbit``;
- ``TRIGGER_TEST_SUBJECT``, ``TRIGGER_TEST_STREAM`` (and ``TRIGGER_TEST_NATS``): a NATS
  trigger ``jobs-nats``;
- ``TRIGGER_TEST_FOLDER``: a folder trigger ``files`` starting ``take`` (a file's path);
- ``TRIGGER_TEST_KILL_AT=N``: the process kills itself with SIGKILL right after its N-th
  committed start, before that message is acknowledged.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import perdure
from perdure.triggers import Message, Result, Trigger, Triggers

app = perdure.App(store=os.environ.get("TRIGGER_TEST_STORE", "sqlite:///trigger-test.db"),
                  key_dir=os.environ.get("TRIGGER_TEST_KEYS"))


@app.agent()
async def job(run: perdure.Run, n: int) -> int:
    """Started by a message: its number."""
    return n


@app.agent()
async def inbox(run: perdure.Run, expected: int) -> list[Any]:
    """Signalled by messages: keeps the payload of each ``ping`` until it has
    ``expected`` of them."""
    got = []
    while len(got) < expected:
        got.append(await run.wait_for("ping"))
    return got


@app.agent()
async def take(run: perdure.Run, path: str) -> str:
    """Started by a file: what it holds."""
    return await run.step(_read, path)


def _read(path: str) -> str:
    with open(path) as file:
        return file.read()


triggers = Triggers.of(app)
if os.environ.get("TRIGGER_TEST_FOLDER"):
    triggers.folder(os.environ["TRIGGER_TEST_FOLDER"], agent=take, name="files",
                    interval=0.05)
if os.environ.get("TRIGGER_TEST_QUEUE"):
    triggers.rabbitmq(os.environ["TRIGGER_TEST_QUEUE"], agent=job, name="jobs-rabbit",
                      url=os.environ.get("TRIGGER_TEST_RABBITMQ",
                                         "amqp://guest:guest@127.0.0.1:5672/"), prefetch=4)
if os.environ.get("TRIGGER_TEST_SUBJECT"):
    triggers.nats(os.environ["TRIGGER_TEST_SUBJECT"], stream=os.environ["TRIGGER_TEST_STREAM"],
                  agent=job, name="jobs-nats", ack_wait=1.0, batch=4,
                  servers=os.environ.get("TRIGGER_TEST_NATS", "nats://127.0.0.1:4222"))

_kill_at = int(os.environ.get("TRIGGER_TEST_KILL_AT", "0"))
_committed = [0]


def _kill_before_ack(trigger: Trigger, message: Message, result: Result) -> None:
    _committed[0] += 1
    if _committed[0] == _kill_at:
        os.kill(os.getpid(), signal.SIGKILL)


if _kill_at:
    triggers.after_commit = _kill_before_ack
