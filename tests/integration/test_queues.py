"""Queues through the App: declaring them, starting objects on them (with keys,
priorities and dedupe keys), bad input refused before anything is stored, and
``perdure queues``."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import perdure
from perdure.errors import (
    ConfigurationError,
    ObjectConflictError,
    UnknownQueueError,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


def _app(make_app: Callable[..., perdure.App]) -> perdure.App:
    app = make_app()

    @app.agent(name="greet")
    async def greet(run: perdure.Run, who: str) -> str:
        await run.wait_for("go", timeout=60)
        return f"hello {who}"

    @app.agent(name="other")
    async def other(run: perdure.Run) -> str:
        return "other"

    app.queue("emails", concurrency=2, per_key=1, priority=True)
    app.queue(perdure.Queue("plain"))
    return app


def test_a_dedupe_key_returns_the_live_object_then_frees(
        make_app: Callable[..., perdure.App]) -> None:
    """A second start with the same (queue, dedupe key) while the first lives returns a
    handle to the first (``created=False``, ``differs`` saying what differs); once the
    first ended, a start creates a new object."""
    app = _app(make_app)
    first = app.options(queue="emails", dedupe_key="user-42").start("greet", "ann")
    assert first.created
    again = app.options(queue="emails", dedupe_key="user-42").start("greet", "bob")
    assert (again.object_id, again.created) == (first.object_id, False)
    assert again.differs is not None and "argument" in again.differs
    same = app.options(queue="emails", dedupe_key="user-42").start("greet", "ann")
    assert (same.object_id, same.created, same.differs) == (first.object_id, False, None)
    assert len(app.list(agent="greet")) == 1
    with pytest.raises(ObjectConflictError, match="dedupe key 'user-42'"):
        app.options(queue="emails", dedupe_key="user-42").start("other")
    with app.background_worker(concurrency=4):
        first.send("go", None)
        assert first.result(timeout=30) == "hello ann"
        fresh = app.options(queue="emails", dedupe_key="user-42").start("greet", "cy")
        assert fresh.created and fresh.object_id != first.object_id
        fresh.send("go", None)
        assert fresh.result(timeout=30) == "hello cy"


def test_async_options_take_the_queue_options(make_app: Callable[..., perdure.App]) -> None:
    """``app.aio.options`` takes the same queue options and starts on the queue."""
    app = _app(make_app)

    async def main() -> tuple[str, str]:
        one = await app.aio.options(queue="emails", key="k", priority=2,
                                    dedupe_key="d").start("greet", "a")
        two = await app.aio.options(queue="emails", dedupe_key="d").start("greet", "a")
        await app.aio.aclose()
        return one.object_id, two.object_id

    first, second = asyncio.run(main())
    assert first == second
    assert app.store.queue_holder("emails", "d") == first


@pytest.mark.parametrize(("options", "error"), [
    ({"queue": "nowhere"}, UnknownQueueError),
    ({"queue": perdure.Queue("emails", concurrency=9)}, ConfigurationError),
    ({"queue": 5}, ConfigurationError),
    ({"key": "k"}, ConfigurationError),
    ({"dedupe_key": "d"}, ConfigurationError),
    ({"priority": 1}, ConfigurationError),
    ({"queue": "plain", "priority": 1}, ConfigurationError),
    ({"queue": "emails", "priority": -1}, ConfigurationError),
    ({"queue": "emails", "priority": 1.5}, ConfigurationError),
    ({"queue": "emails", "key": ""}, ConfigurationError),
    ({"queue": "emails", "key": 7}, ConfigurationError),
    ({"queue": "emails", "dedupe_key": "a\nb"}, ConfigurationError),
])
def test_bad_queue_options_start_nothing(make_app: Callable[..., perdure.App],
                                         options: dict[str, Any],
                                         error: type[Exception]) -> None:
    """A queue the App did not declare, or an option that makes no sense, is a typed
    error from ``options`` itself; nothing is stored."""
    app = _app(make_app)
    with pytest.raises(error):
        app.options(**options).start("greet", "x")
    assert app.list() == []


def test_bad_declarations_are_refused(make_app: Callable[..., perdure.App]) -> None:
    """A limit that makes no sense, or one name declared twice with other limits, is a
    ``ConfigurationError``; the same declaration again returns the declared queue."""
    app = _app(make_app)
    for bad in ({"concurrency": 0}, {"per_key": -1}, {"worker_concurrency": 2.5},
                {"limiter": {"limit": 3}}, {"limiter": {"limit": 3, "period": -1}}):
        with pytest.raises(ConfigurationError):
            app.queue("bad", **bad)
    with pytest.raises(ConfigurationError, match="declared twice"):
        app.queue("emails", concurrency=3)
    with pytest.raises(ConfigurationError):
        app.queue(perdure.Queue("x"), concurrency=3)
    assert app.queue("emails", concurrency=2, per_key=1, priority=True) is app.queues["emails"]
    assert "bad" not in app.queues


def test_the_cli_lists_queues(make_app: Callable[..., perdure.App], store_url: str,
                              key_dir: Path) -> None:
    """``perdure queues --json`` lists every queue in the store with its limits and
    counts; without ``--json``, one table row each."""
    app = _app(make_app)
    app.queue("paced", limiter={"limit": 5, "period": 60})
    for n in range(3):
        app.options(queue="emails", key=f"k{n}").start("greet", f"p{n}")
    app.options(queue="paced").start("greet", "q")
    env_cmd = [sys.executable, "-m", "perdure", "--store", store_url, "--key-dir",
               str(key_dir), "queues"]
    got = subprocess.run([*env_cmd, "--json"], capture_output=True, text=True, timeout=60,
                         cwd=REPO_ROOT, check=True)
    doc = {q["name"]: q for q in json.loads(got.stdout)}
    assert set(doc) == {"emails", "paced"}  # "plain" had no start and no worker yet
    assert doc["emails"] == {"name": "emails", "concurrency": 2, "per_key": 1,
                             "worker_concurrency": None, "limiter": None, "priority": True,
                             "held": 0, "ready": 3, "waiting": 0, "started": 0}
    assert doc["paced"]["limiter"] == {"limit": 5, "period": 60.0}
    table = subprocess.run(env_cmd, capture_output=True, text=True, timeout=60,
                           cwd=REPO_ROOT, check=True).stdout
    assert "emails" in table and "5/60s" in table
