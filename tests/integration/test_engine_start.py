"""Starting objects: idempotent on id, by name, and nodes that lack an object's agent."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import perdure
from perdure.engine.worker import Worker, WorkerSettings
from tests.integration.engine_support import kinds

AppFactory = Callable[..., perdure.App]


def test_start_with_existing_object_id_returns_the_same_object(make_app: AppFactory) -> None:
    """A second ``start`` with the same id (even other arguments) neither creates nor reruns."""
    app = make_app()
    runs: list[str] = []

    @app.agent(name="echo")
    async def echo(run: perdure.Run, text: str) -> str:
        runs.append(text)
        return text

    first = app.options(object_id="echo-1").start(echo, "one")
    second = app.options(object_id="echo-1").start(echo, "two")
    assert first.object_id == second.object_id == "echo-1"
    assert len(app.history("echo-1")) == 1
    with app.background_worker():
        assert first.result(timeout=5) == "one"
        third = app.options(object_id="echo-1").start(echo, "three")
        assert third.result(timeout=5) == "one"
    assert runs == ["one"]
    assert len(app.list(agent="echo")) == 1


def test_start_by_registered_name(make_app: AppFactory) -> None:
    """An agent can be started by its registered name as well as by its function."""
    app = make_app()

    @app.agent(name="greeter")
    def greeter(run: perdure.SyncRun, who: str, *, punctuation: str = ".") -> str:
        return f"hello {who}{punctuation}"

    by_name = app.start("greeter", "ana", punctuation="!")
    by_function = app.start(greeter, "bo")
    with app.background_worker():
        assert by_name.result(timeout=5) == "hello ana!"
        assert by_function.result(timeout=5) == "hello bo."
    assert by_name.info().agent == "greeter"


def test_unknown_agent_raises(make_app: AppFactory) -> None:
    """Starting an unregistered agent (by name or function) raises ``UnknownAgentError``."""
    app = make_app()

    async def stray(run: perdure.Run) -> None:
        return None

    with pytest.raises(perdure.UnknownAgentError, match="nobody"):
        app.start("nobody")
    with pytest.raises(perdure.UnknownAgentError):
        app.start(stray)
    assert app.list() == []


def test_object_of_an_agent_this_node_lacks_is_left_alone(make_app: AppFactory) -> None:
    """A node without the object's agent never claims it (no spinning, memory untouched);
    ``get`` says why it waits; a node that serves the agent then runs it to completion."""
    owner = make_app()

    @owner.agent(name="special")
    async def special(run: perdure.Run) -> str:
        return "done by a node that has it"

    handle = owner.options(object_id="special-1").start("special")

    other = make_app()

    @other.agent(name="unrelated")
    async def unrelated(run: perdure.Run) -> None:
        return None

    settings = WorkerSettings(lease_seconds=2.0, poll_interval=0.01, unknown_agent_retry=0.3)
    worker = Worker(store=other.store, signer=other.signer, policy=other.policy,
                    agents=other.agents, settings=settings, verifier=other.verifier)

    async def serve_briefly() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run(stop))
        await asyncio.sleep(0.5)
        stop.set()
        await task

    asyncio.run(serve_briefly())
    info = other.get("special-1")
    assert info.epoch == 0, "a node that does not serve special@1 never claims it"
    assert info.status is perdure.Status.READY
    assert info.note == "waiting: no live node serves special@1", info.note
    assert kinds(other, "special-1") == ["instantiated"], "memory was not touched"

    with owner.background_worker():
        assert handle.result(timeout=5) == "done by a node that has it"


def test_worker_started_before_its_store_is_reachable_waits_for_it(
    tmp_path: Path, key_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A node whose store cannot be opened yet logs that once and keeps trying; once the
    store is there it serves objects as usual."""
    folder = tmp_path / "later"
    url = f"sqlite:///{folder / 'store.db'}"
    node = perdure.App(store=url, key_dir=key_dir, poll_interval=0.01)
    client = perdure.App(store=url, key_dir=key_dir)

    @node.agent(name="hello")
    @client.agent(name="hello")
    async def hello(run: perdure.Run, who: str) -> str:
        return f"hello {who}"

    caplog.set_level(logging.INFO, logger="perdure")
    with node.background_worker():
        time.sleep(0.8)
        down = [r for r in caplog.records if getattr(r, "action", None) == "store_down"]
        assert len(down) == 1, [r.getMessage() for r in caplog.records]
        folder.mkdir()
        handle = client.options(object_id="late-1").start(hello, "later")
        assert handle.result(timeout=15) == "hello later"
    assert any(getattr(r, "action", None) == "store_up" for r in caplog.records)
    node.close()
    client.close()
