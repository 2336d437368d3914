"""Wake-ups and results are pushed, not polled, on every store.

Workers here poll only every 30 s where they cannot be pushed (``--poll 30``, which is
also their idle safety look), and callers wait with ``poll=30``; every wait below is
shorter than that, so each would fail if only polling found the change.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import perdure
from perdure.hooks import ClaimRound
from tests.integration.engine_support import kill_process, wait_until
from tests.integration.push_support import (
    push_emitter,
    push_quick,
    push_sleeper,
    push_waiter,
    start_worker,
    wake_folder,
)

AppFactory = Callable[..., perdure.App]
SLOW = 30.0  # the fallback poll: longer than any wait of these tests
WAIT = 15.0  # how long a test waits for what a push brings


def _client(make_app: AppFactory) -> perdure.App:
    app = make_app(lease_seconds=5.0)
    app.poll_interval = SLOW
    for fn, name in ((push_waiter, "push_waiter"), (push_quick, "push_quick"),
                     (push_sleeper, "push_sleeper")):
        app.agent(name=name)(fn)
    return app


def _worker(store_url: str, key_dir: Path, tmp_path: Path, name: str = "worker"
            ) -> tuple[subprocess.Popen[bytes], Path]:
    log = tmp_path / f"{name}.log"
    return start_worker(store_url, key_dir, log, poll=SLOW), log


def _running_worker_sleeps(app: perdure.App, proc: subprocess.Popen[bytes], log: Path
                           ) -> None:
    """Wait until the worker process has looked once and gone idle: it ran a first
    object to its end (so it listens, and its next look is the slow one)."""
    first = app.options(object_id=f"first-{proc.pid}").start("push_quick")
    assert first.result(timeout=60, poll=0.05) == "quick", log.read_text()


def test_a_worker_that_polls_rarely_is_woken_by_a_send_and_a_start_from_another_process(
        make_app: AppFactory, store_url: str, key_dir: Path, tmp_path: Path) -> None:
    app = _client(make_app)
    app.options(object_id="w").start("push_waiter")
    proc, log = _worker(store_url, key_dir, tmp_path)
    try:
        assert wait_until(lambda: app.get("w").status == "dormant", 60), log.read_text()
        _running_worker_sleeps(app, proc, log)
        app.send("w", "go", {"n": 1})
        assert wait_until(lambda: app.get("w").status == "completed", WAIT), log.read_text()
        started = app.options(object_id="q").start("push_quick")
        assert wait_until(lambda: app.get("q").status == "completed", WAIT), log.read_text()
        assert started.result(timeout=1, poll=SLOW) == "quick"
    finally:
        kill_process(proc)
    assert app.handle("w").result(timeout=1) == {"n": 1}


def test_a_result_awaited_in_another_process_comes_with_the_end(
        make_app: AppFactory, store_url: str, key_dir: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    app = _client(make_app)
    handle = app.options(object_id="r").start("push_waiter")
    proc, log = _worker(store_url, key_dir, tmp_path)
    try:
        assert wait_until(lambda: app.get("r").status == "dormant", 60), log.read_text()
        looked = threading.Event()
        get = app.get

        def seen_get(*args: Any, **kwargs: Any) -> perdure.ObjectInfo:
            info = get(*args, **kwargs)
            looked.set()
            return info

        monkeypatch.setattr(app, "get", seen_get)
        got: list[Any] = []
        waiter = threading.Thread(
            target=lambda: got.append(handle.result(timeout=WAIT, poll=SLOW)))
        waiter.start()
        assert looked.wait(WAIT)  # result() read the store and now waits for the push
        app.send("r", "go", "done")
        waiter.join(WAIT + 5)
        assert got == ["done"], log.read_text()
    finally:
        kill_process(proc)


def test_a_timer_wakes_an_idle_worker(make_app: AppFactory, store_url: str, key_dir: Path,
                                      tmp_path: Path) -> None:
    app = _client(make_app)
    proc, log = _worker(store_url, key_dir, tmp_path)
    try:
        _running_worker_sleeps(app, proc, log)
        before = time.time()
        handle = app.options(object_id="t").start("push_sleeper", 1.0)
        woke = handle.result(timeout=WAIT, poll=SLOW)
        assert woke >= before + 1.0, log.read_text()
    finally:
        kill_process(proc)


def test_an_idle_worker_makes_a_bounded_number_of_claim_rounds(make_app: AppFactory) -> None:
    """An idle in-process worker whose store pushes does not poll: over a second it
    looks a few times at most (once as it starts), where polling every 10 ms would
    look about a hundred times."""
    app = _client(make_app)
    app.poll_interval = 0.01
    rounds: list[ClaimRound] = []
    first = threading.Event()

    def heard(event: ClaimRound) -> None:
        rounds.append(event)
        first.set()

    stop = app.hooks.subscribe(heard, ClaimRound)
    try:
        with app.background_worker():
            assert first.wait(WAIT)
            threading.Event().wait(1.0)  # the window the rounds are counted over
            counted = len(rounds)
            handle = app.start("push_quick")  # and a push still wakes it
            assert handle.result(timeout=WAIT, poll=SLOW) == "quick"
    finally:
        stop()
    assert counted <= 4, [r.claimed for r in rounds]


def test_a_killed_listeners_socket_does_not_stop_others_being_told(
        make_sqlite_app: AppFactory, sqlite_url: str, key_dir: Path, tmp_path: Path) -> None:
    app = _client(make_sqlite_app)
    dead, dead_log = _worker(sqlite_url, key_dir, tmp_path, "dead")
    folder = wake_folder(sqlite_url)

    def socket_of(pid: int) -> list[str]:
        return [n for n in os.listdir(folder) if f".{pid}." in n] if folder.is_dir() else []

    try:
        assert wait_until(lambda: bool(socket_of(dead.pid)), 60), dead_log.read_text()
    finally:
        dead.send_signal(signal.SIGKILL)
        dead.wait(10)
    assert socket_of(dead.pid)  # left behind: nobody removed it
    proc, log = _worker(sqlite_url, key_dir, tmp_path)
    try:
        _running_worker_sleeps(app, proc, log)
        waiting = app.options(object_id="k").start("push_waiter")
        assert wait_until(lambda: app.get("k").status == "dormant", WAIT), log.read_text()
        waiting.send("go", 7)
        assert waiting.result(timeout=WAIT, poll=SLOW) == 7, log.read_text()
    finally:
        kill_process(proc)
    assert not socket_of(dead.pid)  # the first sender that found it dead removed it


def test_an_unusable_folder_falls_back_to_polling_with_one_log_line(
        make_sqlite_app: AppFactory, sqlite_url: str, caplog: pytest.LogCaptureFixture
        ) -> None:
    folder = wake_folder(sqlite_url)
    folder.write_text("not a folder")  # what a read-only place would refuse as well
    app = make_sqlite_app()
    app.agent(name="push_quick")(push_quick)
    with caplog.at_level(logging.WARNING, logger="perdure.store"):
        assert app.store.subscribe(lambda _oid: None) is None
        assert app.store.subscribe_results(lambda _oid: None) is None
        with app.background_worker():  # polls every 10 ms (make_sqlite_app)
            assert app.start("push_quick").result(timeout=WAIT, poll=0.01) == "quick"
    lines = [r for r in caplog.records if "cannot listen for wake-ups" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in caplog.records]


def test_a_follower_is_pushed_each_commit_on_sqlite(make_sqlite_app: AppFactory) -> None:
    """On SQLite a follower waiting with a 30 s poll sees an emitted event as it is
    committed (the object still running), then the end."""
    app = make_sqlite_app(lease_seconds=5.0)
    app.agent(name="push_emitter")(push_emitter)
    handle = app.options(object_id="f").start("push_emitter")
    seen: list[str] = []
    emitted = threading.Event()

    def follow() -> None:
        for event in handle.stream(poll=SLOW, timeout=4 * SLOW):
            seen.append(event.kind)
            if event.kind == "emitted":
                emitted.set()

    follower = threading.Thread(target=follow)
    follower.start()
    with app.background_worker():
        assert wait_until(lambda: app.get("f").waiting_event == "go", WAIT)
        handle.send("go", 1)
        assert emitted.wait(WAIT), seen
        assert app.get("f").status != "completed"
        handle.send("stop", 1)
        follower.join(WAIT)
    assert not follower.is_alive()
    assert seen == ["emitted", "terminated"], seen
