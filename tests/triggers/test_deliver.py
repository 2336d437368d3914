"""``perdure.triggers.deliver``, the one path from a message to a committed start or
send, and the checks of a declaration; on a real SQLite store, no broker needed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import perdure
from perdure import ConfigurationError
from perdure.triggers import Message, Outcome, Result, Trigger, Triggers, deliver
from tests.triggers import trigger_app
from tests.triggers.support import wait_until


@pytest.fixture
def app(tmp_path: Path) -> Iterator[perdure.App]:
    """The trigger tests' App (its agents) on this test's SQLite store."""
    made = trigger_app.app.with_settings(store=f"sqlite:///{tmp_path / 'store.db'}",
                                         key_dir=tmp_path / "keys")
    yield made
    made.close()


def message(body: Any, message_id: str | None = "m-1", *, redelivered: bool = False,
            **headers: str) -> Message:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return Message(body=raw, headers=headers, message_id=message_id, source="test",
                   redelivered=redelivered)


def rabbit(**options: Any) -> Trigger:
    options.setdefault("agent", "job")
    return Triggers().rabbitmq("q", name="t", **options)


def run(app: perdure.App, trigger: Trigger, msg: Message) -> Result:
    return asyncio.run(deliver(app, trigger, msg))


def test_a_start_is_named_by_the_message_id(app: perdure.App) -> None:
    """The same id twice: one object, the second delivery ``DONE`` without applying; an
    id that is not plain text is hashed into the object id."""
    trigger = rabbit()
    first = run(app, trigger, message({"args": [1]}))
    again = run(app, trigger, message({"args": [1]}, redelivered=True))
    assert first == Result(Outcome.DONE, "t-m-1", applied=True)
    assert again == Result(Outcome.DONE, "t-m-1", applied=False)
    odd = run(app, trigger, message({"args": [2]}, "order 2 / ü"))
    assert odd.outcome is Outcome.DONE and odd.object_id is not None
    assert odd.object_id.startswith("t-sha256-") and len(odd.object_id) == len("t-sha256-") + 40
    assert len(app.list()) == 2


def test_an_id_used_for_other_arguments_is_dead(app: perdure.App) -> None:
    """A second message under an id already used, with other arguments: dead, with a
    reason naming the difference; the object keeps its first arguments."""
    trigger = rabbit()
    assert run(app, trigger, message({"args": [1]})).applied
    reused = run(app, trigger, message({"args": [2]}))
    assert reused.outcome is Outcome.DEAD and "started otherwise" in reused.reason
    assert app.history("t-m-1")[0].body["intent"]["args"] == [1]


def test_poison_is_dead_and_starts_nothing(app: perdure.App) -> None:
    """No id, no JSON, not an object, a wrong type of args, an agent the trigger does
    not start: each ``DEAD`` with its reason, and the store holds nothing."""
    trigger = rabbit()
    cases = {
        "the message has no id": message({"args": [1]}, None),
        "cannot decode the message: UnicodeDecodeError": message(b"\xff"),
        "cannot decode the message: JSONDecodeError": message(b"{"),
        "a start message is a JSON object": message([1]),
        "args is a JSON list": message({"args": {"n": 1}}),
        "this trigger starts 'job'": message({"agent": "inbox", "args": [1]}),
    }
    for reason, msg in cases.items():
        result = run(app, trigger, msg)
        assert result.outcome is Outcome.DEAD and reason in result.reason, (reason, result)
    assert app.list() == []


def test_a_decoder_turns_any_body_into_a_start(app: perdure.App) -> None:
    """``decoder`` replaces JSON: its value is read as the body would be; what it raises
    makes the message dead with its text."""

    def csv(msg: Message) -> dict[str, Any]:
        n = int(msg.body.decode())
        return {"args": [n]}

    trigger = rabbit(decoder=csv)
    assert run(app, trigger, message(b"41")).applied
    assert app.history("t-m-1")[0].body["intent"]["args"] == [41]
    bad = run(app, trigger, message(b"forty", "m-2"))
    assert bad.outcome is Outcome.DEAD
    assert "ValueError: invalid literal for int()" in bad.reason


def test_signals_are_deduplicated_by_the_message_id(app: perdure.App) -> None:
    """A signal's dedupe key is the trigger's name and the message id: the same message
    twice is one event; an unknown object is dead; an ended object is dead, unless the
    message is a redelivery (its first delivery may have been the one it took)."""
    trigger = rabbit(agent=None, mode="signal", event="ping", object_header="to")
    app.options(object_id="box").start("inbox", 5)
    assert run(app, trigger, message({"n": 1}, to="box")).applied
    assert run(app, trigger, message({"n": 1}, to="box")) == Result(Outcome.DONE, "box")
    missing = run(app, trigger, message({"n": 1}, "m-2", to="nobody"))
    assert missing.outcome is Outcome.DEAD and "no object 'nobody'" in missing.reason
    no_header = run(app, trigger, message({"n": 1}, "m-3"))
    assert no_header.outcome is Outcome.DEAD and "no header 'to'" in no_header.reason
    app.cancel("box")
    with app.background_worker():
        wait_until("the box to end", lambda: app.get("box").terminal)
    late = run(app, trigger, message({"n": 2}, "m-4", to="box"))
    assert late.outcome is Outcome.DEAD and "was not delivered" in late.reason
    again = run(app, trigger, message({"n": 2}, "m-4", redelivered=True, to="box"))
    assert again.outcome is Outcome.DONE and not again.applied


def test_a_store_that_cannot_be_reached_is_retry(tmp_path: Path) -> None:
    """The store down: ``RETRY`` (the consumer hands the message back), never dead."""
    pytest.importorskip("psycopg")
    down = trigger_app.app.with_settings(store="postgresql://postgres@127.0.0.1:9/none",
                                         key_dir=tmp_path / "keys")
    try:
        result = run(down, rabbit(), message({"args": [1]}))
    finally:
        down.close()
    assert result.outcome is Outcome.RETRY and result.reason


def test_declarations_are_checked(app: perdure.App) -> None:
    """A bad declaration is a ``ConfigurationError`` naming what to change."""
    triggers = Triggers()
    with pytest.raises(ConfigurationError, match="give event=NAME"):
        triggers.rabbitmq("q", mode="signal", object_field="to")
    with pytest.raises(ConfigurationError, match="exactly one of"):
        triggers.rabbitmq("q", mode="signal", event="e", object_field="a", object_header="b")
    with pytest.raises(ConfigurationError, match="go with mode='signal'"):
        triggers.rabbitmq("q", agent="job", event="e")
    with pytest.raises(ConfigurationError, match="prefetch"):
        triggers.rabbitmq("q", prefetch=0)
    with pytest.raises(ConfigurationError, match="amqp://"):
        triggers.rabbitmq("q", url="http://x")
    with pytest.raises(ConfigurationError, match="ack_wait"):
        triggers.nats("s", stream="S", ack_wait=0)
    with pytest.raises(ConfigurationError, match="not an agent"):
        triggers.folder("x", agent=print)
    triggers.rabbitmq("q")
    with pytest.raises(ConfigurationError, match="declared already"):
        triggers.rabbitmq("q")
    with pytest.raises(ConfigurationError, match="no trigger 'nope'"):
        triggers.select(["nope"])
    assert Triggers.of(app) is Triggers.of(app) and Triggers.of(app) is not triggers
