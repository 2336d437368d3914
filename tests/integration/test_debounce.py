"""Debounced starts through the App on each store, with a real worker: rapid starts with
one debounce key collapse into one object that runs once, with the last arguments; a
start after the object began (or ended) makes a new one; bad input is refused before
anything is stored."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

import perdure
from perdure.core.codec import MAX_DEPTH, encode
from perdure.core.events import DEBOUNCED_START, REFINE_EVENT
from perdure.core.lifecycle import Status
from perdure.errors import ConfigurationError
from tests.web.support import wait_until

pytestmark = pytest.mark.timeout(120)

QUIET = 2.0  # seconds: wide enough that five starts in a row fall within it


def _app(make_app: Callable[..., perdure.App], ran: list[tuple[str, int]]) -> perdure.App:
    app = make_app()

    @app.agent(name="digest")
    async def digest(run: perdure.Run, user: str, count: int = 0) -> str:
        ran.append((user, count))
        return f"{user}:{count}"

    @app.agent(name="slow")
    async def slow(run: perdure.Run, n: int) -> int:
        ran.append(("slow", n))
        await run.wait_for("go", timeout=60)
        return n

    app.queue("mail", concurrency=4)
    return app


def test_rapid_starts_collapse_into_one_run_with_the_last_arguments(
        make_app: Callable[..., perdure.App]) -> None:
    ran: list[tuple[str, int]] = []
    app = _app(make_app, ran)
    with app.background_worker(concurrency=4):
        starter = app.options(queue="mail", debounce_key="user-1", debounce=QUIET)
        handles = [starter.start("digest", "ann", count=n) for n in range(5)]
        other = app.options(queue="mail", debounce_key="user-2",
                            debounce=timedelta(seconds=QUIET)).start("digest", "bob")
        assert [h.created for h in handles] == [True, False, False, False, False]
        assert len({h.object_id for h in handles}) == 1
        assert other.created and other.object_id != handles[0].object_id
        assert handles[0].result(timeout=30) == "ann:4"
        assert other.result(timeout=30) == "bob:0"
    assert sorted(ran) == [("ann", 4), ("bob", 0)]  # each ran once
    oid = handles[0].object_id
    kinds = [r.kind for r in app.history(oid)]
    assert kinds.count("intent_refined") == 4  # the four later starts, in memory
    assert app.get(oid).status is Status.COMPLETED
    assert app.verify(oid).ok
    assert [r.verdict for r in app.replay_check([oid])] == ["compatible"]
    assert len(app.list(agent="digest")) == 2


def test_a_start_after_the_object_began_or_ended_makes_a_new_one(
        make_app: Callable[..., perdure.App]) -> None:
    ran: list[tuple[str, int]] = []
    app = _app(make_app, ran)
    starter = app.options(queue="mail", debounce_key="k", debounce=0.2)
    with app.background_worker(concurrency=4):
        first = starter.start("slow", 1)
        wait_until(lambda: ("slow", 1) in ran)  # it began: the key is no longer its
        second = starter.start("slow", 2)
        assert second.created and second.object_id != first.object_id
        wait_until(lambda: ("slow", 2) in ran)
        first.send("go", None)
        second.send("go", None)
        assert (first.result(timeout=30), second.result(timeout=30)) == (1, 2)
        third = starter.start("slow", 3)  # spaced beyond the period: a new object
        assert third.created and third.object_id not in (first.object_id,
                                                         second.object_id)
        wait_until(lambda: ("slow", 3) in ran)
        third.send("go", None)
        assert third.result(timeout=30) == 3
    assert set(ran) == {("slow", 1), ("slow", 2), ("slow", 3)}  # (each replayed on resume)


BAD: list[dict[str, Any]] = [
    {"debounce_key": "k", "debounce": 1.0},  # no queue
    {"queue": "mail", "debounce_key": "k"},  # no period
    {"queue": "mail", "debounce": 1.0},  # no key
    {"queue": "mail", "debounce_key": "k", "debounce": -1.0},
    {"queue": "mail", "debounce_key": "k", "debounce": 0},
    {"queue": "mail", "debounce_key": "k", "debounce": math.nan},
    {"queue": "mail", "debounce_key": "k", "debounce": "soon"},
    {"queue": "mail", "debounce_key": "", "debounce": 1.0},
    {"queue": "mail", "debounce_key": 7, "debounce": 1.0},
    {"queue": "mail", "debounce_key": "k", "debounce": 1.0, "dedupe_key": "d"},
    {"queue": "mail", "debounce_key": "k", "debounce": 1.0, "delay": 5},
    {"queue": "mail", "debounce_key": "k", "debounce": 1.0, "object_id": "x"},
]


def test_bad_debounce_options_store_nothing(make_app: Callable[..., perdure.App]) -> None:
    app = _app(make_app, [])
    for options in BAD:
        with pytest.raises(ConfigurationError):
            app.options(**options).start("digest", "ann")
    assert app.list() == []
    assert app.store.queue_stats(0.0) == []


def test_a_debounced_start_reaching_an_object_that_ran_is_rejected_in_memory(
        make_app: Callable[..., perdure.App]) -> None:
    """The store refuses a debounced start once the object was claimed; should such an
    event reach it all the same (sent past that guard), its node records it rejected and
    the object keeps the arguments it runs with."""
    ran: list[tuple[str, int]] = []
    app = _app(make_app, ran)
    with app.background_worker():
        handle = app.options(queue="mail").start("slow", 1)
        wait_until(lambda: app.get(handle.object_id).status is Status.DORMANT
                   and ("slow", 1) in ran)
        data = encode({DEBOUNCED_START: {"args": [9], "kwargs": {}, "start_at": 0.0}},
                      max_depth=MAX_DEPTH)
        oid = handle.object_id
        app.store.send(oid, REFINE_EVENT, data, None, time.time(),
                       app.client.seal_event(oid, REFINE_EVENT, data, None))
        wait_until(lambda: any("refinement_rejected" in r.body.get("fields", {})
                               for r in app.history(oid) if r.kind == "progress"))
        handle.send("go", None)
        assert handle.result(timeout=30) == 1
    assert "intent_refined" not in [r.kind for r in app.history(oid)]
    assert ("slow", 9) not in ran
