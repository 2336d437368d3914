"""The API's waits over real sockets: an event stream broken off and picked up again with
``Last-Event-ID`` gets each event once; a long poll answers as the object ends; a caller
that goes away (stream or long poll) leaves no wait, task or store subscription behind."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from perdure.core.lifecycle import Status
from tests.web.api_support import ServedApi, raw_request, serve_api, stop_api
from tests.web.support import wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def served(sqlite_url: str, key_dir: Path) -> Iterator[ServedApi]:
    """The API over a fresh SQLite store; idle streams say they are alive each 0.2 s."""
    api = serve_api(sqlite_url, key_dir, keepalive=0.2)
    yield api
    stop_api(api)


def _events(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """The server-sent events of ``lines``: ``{"id", "event", "data"}`` each (comments
    kept as ``{"comment": ...}``)."""
    event: dict[str, Any] = {}
    for line in lines:
        if line == "":
            if event:
                yield event
            event = {}
        elif line.startswith(":"):
            yield {"comment": line[1:].strip()}
        else:
            key, _, value = line.partition(":")
            event[key] = value.removeprefix(" ")


def test_a_reconnecting_reader_gets_each_event_once(served: ServedApi) -> None:
    app = served.app
    seen: list[dict[str, Any]] = []
    with app.background_worker(), closing(served.client("reader")) as client:
        oid = client.post("/objects", json={"agent": "ticker", "args": [3]},
                          headers={"Authorization": f"Bearer {served.tokens['operator']}"}
                          ).json()["object"]["object_id"]
        with client.stream("GET", f"/objects/{oid}/stream") as first:
            assert first.headers["content-type"].startswith("text/event-stream")
            for event in _events(first.iter_lines()):
                if "data" in event:
                    seen.append(event)
                if len(seen) == 2:
                    break  # the reader breaks off after two ticks
        assert [json.loads(e["data"])["data"] for e in seen] == [{"n": 0}, {"n": 1}]
        wait_until(lambda: served.api.open_waits == 0 and served.subscriptions(oid) == 0)
        wait_until(lambda: app.get(oid).status is Status.DORMANT)
        app.send(oid, "go", "now")
        last = seen[-1]["id"]
        comments = 0
        with client.stream("GET", f"/objects/{oid}/stream", params={"after": 0},
                           headers={"Last-Event-ID": last}) as second:
            for event in _events(second.iter_lines()):
                if "comment" in event:
                    comments += 1
                elif "data" in event:
                    seen.append(event)
        # the stream ended by itself after the object's end
    kinds = [(e["event"], json.loads(e["data"]).get("name")) for e in seen]
    assert kinds == [("emitted", "tick")] * 3 + [("emitted", "done"), ("terminated", None)]
    ids = [int(e["id"]) for e in seen]
    assert ids == sorted(set(ids))
    emitted = [r.seq for r in app.history(oid) if r.kind in ("emitted", "terminated")]
    assert ids == emitted  # every emitted record once, and its end
    assert json.loads(seen[-1]["data"])["outcome"] == "completed"
    del comments  # an idle stream may or may not have said it was alive meanwhile
    wait_until(lambda: served.api.open_waits == 0 and served.subscriptions(oid) == 0)


def test_an_idle_stream_says_it_is_alive(served: ServedApi) -> None:
    app = served.app
    oid = app.start("ticker", 0).object_id  # no worker: nothing is written
    sock = raw_request(served.port, f"/objects/{oid}/stream", served.tokens["reader"])
    with closing(sock):
        got = b""
        while got.count(b": keep-alive") < 2:
            chunk = sock.recv(4096)
            assert chunk, got
            got += chunk
        assert b"200 OK" in got.split(b"\r\n")[0]
        assert served.api.open_waits == 1 and served.subscriptions(oid) == 1
    wait_until(lambda: served.api.open_waits == 0 and served.subscriptions(oid) == 0)


@pytest.mark.parametrize("what", ["stream", "long-poll"])
def test_a_caller_that_goes_away_costs_nothing(served: ServedApi, what: str) -> None:
    app = served.app
    oid = app.start("ticker", 1).object_id  # no worker: it never ends
    assert served.api.open_waits == 0 and served.subscriptions(oid) == 0
    path = (f"/objects/{oid}/stream" if what == "stream"
            else f"/objects/{oid}/result?wait=60")
    # More waits than the client's threads (app.aio's 8): each waits without one.
    many = 12
    socks = [raw_request(served.port, path, served.tokens["reader"]) for _ in range(many)]
    try:
        wait_until(lambda: served.api.open_waits == many
                   and served.subscriptions(oid) == many)
        with closing(served.client("reader")) as client:  # and the server answers
            assert client.get(f"/objects/{oid}").json()["object_id"] == oid
    finally:
        for sock in socks:
            sock.shutdown(socket.SHUT_RDWR)
            sock.close()
    wait_until(lambda: served.api.open_waits == 0 and served.subscriptions(oid) == 0,
               timeout=10)
    # the server still answers, and a new wait works
    with closing(served.client("reader")) as client:
        assert client.get(f"/objects/{oid}/result", params={"wait": 0.1}).json()[
            "done"] is False


def test_a_long_poll_answers_as_the_object_ends(served: ServedApi) -> None:
    app = served.app
    with app.background_worker(), closing(served.client("operator")) as client:
        oid = client.post("/objects", json={"agent": "ticker", "args": [1]}).json()[
            "object"]["object_id"]
        wait_until(lambda: app.get(oid).status is Status.DORMANT)
        sock = raw_request(served.port, f"/objects/{oid}/result?wait=60",
                           served.tokens["reader"])
        with closing(sock):
            wait_until(lambda: served.api.open_waits == 1)
            client.post(f"/objects/{oid}/events", json={"name": "go", "payload": 7})
            got = b""
            while b"\r\n\r\n" not in got or not got.endswith(b"}"):
                chunk = sock.recv(4096)
                assert chunk, got
                got += chunk
        body = json.loads(got.split(b"\r\n\r\n", 1)[1])
        assert body == {"object_id": oid, "status": "completed", "done": True, "note": None,
                        "result": {"ticks": 1, "go": 7}}
    wait_until(lambda: served.api.open_waits == 0 and served.subscriptions(oid) == 0)


def test_too_many_waits_are_refused(sqlite_url: str, key_dir: Path) -> None:
    served = serve_api(sqlite_url, key_dir, max_open=2)
    try:
        oid = served.app.start("ticker", 1).object_id
        socks = [raw_request(served.port, f"/objects/{oid}/stream", served.tokens["reader"])
                 for _ in range(2)]
        try:
            wait_until(lambda: served.api.open_waits == 2)
            with closing(served.client("reader")) as client:
                busy = client.get(f"/objects/{oid}/result", params={"wait": 5})
                assert busy.status_code == 503 and busy.headers["retry-after"] == "5"
                assert busy.json()["status"] == 503
                assert client.get(f"/objects/{oid}/result").json()["done"] is False
        finally:
            for sock in socks:
                sock.close()
        wait_until(lambda: served.api.open_waits == 0)
    finally:
        stop_api(served)
