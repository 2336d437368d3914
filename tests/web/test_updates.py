"""Updates on both stores with real worker processes: a caller's request goes into a
waiting object and its reply comes back; a refused request leaves no record; a handler
that raises answers with its error and the object goes on; a worker SIGKILLed between
the acceptance and the reply is replaced and the reply comes once, each effect done
once; the HTTP API's route answers the same."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

import perdure
from perdure.core.events import UPDATE_EVENT
from perdure.core.lifecycle import Status
from perdure.errors import (
    ObjectNotFoundError,
    UnknownUpdateError,
    UpdateFailedError,
    UpdateRefusedError,
)
from tests.web.agents import EFFECTS_ENV, HOLD_ENV
from tests.web.api_support import ServedApi, problem, serve_api, stop_api
from tests.web.support import start_worker, stop_worker, wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def served(store_url: str, key_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
           ) -> Iterator[ServedApi]:
    monkeypatch.setenv(EFFECTS_ENV, str(tmp_path / "effects.txt"))
    monkeypatch.setenv(HOLD_ENV, str(tmp_path / "hold"))
    api = serve_api(store_url, key_dir)
    yield api
    stop_api(api)


def _env(tmp_path: Path) -> dict[str, str]:
    return {EFFECTS_ENV: str(tmp_path / "effects.txt"), HOLD_ENV: str(tmp_path / "hold")}


def _effects(tmp_path: Path) -> list[str]:
    path = tmp_path / "effects.txt"
    return path.read_text().splitlines() if path.exists() else []


def _replies(app: perdure.App, oid: str) -> list[dict[str, Any]]:
    return [r.body["data"] for r in app.history(oid, opened=True)
            if r.kind == "emitted" and r.body.get("name") == UPDATE_EVENT]


def test_updates_reply_refuse_and_fail(served: ServedApi, store_url: str, key_dir: Path,
                                       tmp_path: Path) -> None:
    app = served.app
    worker = start_worker(store_url, key_dir, tmp_path / "worker.log", env=_env(tmp_path))
    try:
        oid = app.options(object_id="cart-1").start("cart", "ann").object_id
        wait_until(lambda: app.get(oid).status is Status.DORMANT)
        assert app.update(oid, "add_item", "tea", timeout=30) == 1
        assert app.update(oid, "add_item", "milk", timeout=30) == 2

        # Refused in the caller: the reason comes back, nothing is written.
        head = app.get(oid).records
        with pytest.raises(UpdateRefusedError, match="non-empty name"):
            app.update(oid, "add_item", "")
        with pytest.raises(UnknownUpdateError, match="add_item"):
            app.update(oid, "remove_item", "tea")
        with pytest.raises(ObjectNotFoundError):
            app.update("nobody", "add_item", "tea")
        assert app.get(oid).records == head and app.store.pending_events(oid) == []

        # The handler raises: the caller gets its error, the object goes on waiting.
        with pytest.raises(UpdateFailedError, match="no room for boom"):
            app.update(oid, "add_item", "boom", timeout=30)
        assert asyncio.run(app.aio.update(oid, "add_item", "jam", timeout=30)) == 3

        # Over HTTP, with the operate scope.
        with closing(served.client("operator")) as client, \
                closing(served.client("reader")) as reader:
            got = client.post(f"/objects/{oid}/updates/add_item", json={"args": ["salt"]})
            assert got.status_code == 200, got.text
            assert got.json() == {"reply": 4}
            problem(client.post(f"/objects/{oid}/updates/add_item", json={"args": [""]}),
                    422)
            problem(client.post(f"/objects/{oid}/updates/nope", json={"args": []}), 404)
            problem(reader.post(f"/objects/{oid}/updates/add_item", json={"args": ["x"]}),
                    403)

        app.send(oid, "checkout", {"card": "visa"})
        done = app.handle(oid).result(timeout=30)
    finally:
        stop_worker(worker)
    assert done == {"owner": "ann", "items": ["tea", "milk", "jam", "salt"],
                    "paid": {"card": "visa"}}
    assert _effects(tmp_path) == ["reserve tea", "reserve milk", "reserve boom",
                                  "reserve jam", "reserve salt"]
    assert [r["ok"] for r in _replies(app, oid)] == [True, True, False, True, True]
    assert app.verify(oid).ok
    # Replaying the whole memory does not run a handler's step again.
    [report] = app.replay_check([oid])
    assert report.verdict == "compatible", report


def test_a_worker_killed_between_accept_and_reply(served: ServedApi, store_url: str,
                                                  key_dir: Path, tmp_path: Path) -> None:
    app = served.app
    env = _env(tmp_path)
    (tmp_path / "hold").touch()
    first = start_worker(store_url, key_dir, tmp_path / "w1.log", env=env)
    second = None
    try:
        oid = app.options(object_id="cart-2").start("cart", "bob").object_id
        wait_until(lambda: app.get(oid).status is Status.DORMANT)
        replies: list[Any] = []
        caller = threading.Thread(target=lambda: replies.append(
            app.update(oid, "add_item", "slow-1", timeout=60)))
        caller.start()
        wait_until(lambda: "hold slow-1" in _effects(tmp_path))
        # Accepted (its receipt and the first step are committed), not yet replied.
        assert any(r.kind == "event_received" and r.body["name"] == UPDATE_EVENT
                   for r in app.history(oid))
        assert _replies(app, oid) == []
        first.kill()
        first.wait()
        (tmp_path / "hold").unlink()
        second = start_worker(store_url, key_dir, tmp_path / "w2.log", env=env)
        caller.join(60)
        assert replies == [1]
        app.send(oid, "checkout", "cash")
        assert app.handle(oid).result(timeout=30)["items"] == ["slow-1"]
    finally:
        first.kill()
        if second is not None:
            stop_worker(second)
    effects = _effects(tmp_path)
    assert effects.count("reserve slow-1") == 1  # recorded before the kill: not redone
    assert effects.count("hold slow-1") == 2  # the step that was running runs again
    assert len(_replies(app, oid)) == 1
    assert app.verify(oid).ok


def test_an_update_to_a_wait_inside_a_gather_is_refused_once(
        served: ServedApi, store_url: str, key_dir: Path, tmp_path: Path) -> None:
    """A gathered branch's wait takes no update: the request is refused with the reason
    (once), and the object is not woken for it again: it stays dormant, its memory
    still."""
    app = served.app
    worker = start_worker(store_url, key_dir, tmp_path / "worker.log", env=_env(tmp_path))
    try:
        oid = app.options(object_id="gathered-1").start("gathered_cart", "ann").object_id
        wait_until(lambda: app.get(oid).status is Status.DORMANT)
        with pytest.raises(UpdateRefusedError, match=r"inside run\.gather"):
            app.update(oid, "add_item", "tea", timeout=30)
        # Woken again and again, the object would be claimed again and again (its epoch,
        # the count of its claims, climbing); left be, it stays as it is over a second
        # and a half of the worker's looks.
        wait_until(lambda: app.get(oid).status is Status.DORMANT)
        row = app.store.get(oid)
        assert row is not None
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            now = app.store.get(oid)
            assert now is not None and now.epoch == row.epoch, "woken again for the update"
            time.sleep(0.05)
        assert now.ready_at is None
        assert [r["ok"] for r in _replies(app, oid)] == [False]
        app.send(oid, "left", 1)
        app.send(oid, "right", 2)
        assert app.handle(oid).result(timeout=30) == [1, 2]
    finally:
        stop_worker(worker)
