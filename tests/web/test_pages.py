"""The dashboard's reads and actions on both stores over HTTP: paging by key with every
filter, the inbox, the live stream, and actions noted in memory with who took them."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import httpx
import pytest

from perdure.core.lifecycle import Status
from perdure.errors import ConfigurationError
from perdure.web._queries import Filters, Queries
from tests.web.support import (
    ROOT,
    Served,
    _env,
    actions_noted,
    csrf_of,
    free_port,
    serve,
    start_worker,
    stop_serving,
    stop_worker,
    wait_until,
)

pytestmark = pytest.mark.timeout(120)


def test_paging_and_filters(served: Served) -> None:
    app = served.app
    made = [app.options(
        object_id=f"obj-{n:03d}", labels={"batch": "odd" if n % 2 else "even"}).start(
        "sleeper", 3600.0).object_id
            for n in range(75)]
    asked = app.options(object_id="question-1").start("asker", "q").object_id
    queries = Queries(app.store)
    seen: list[str] = []
    cursor = None
    while True:
        page = queries.page(Filters(), cursor=cursor, limit=20)
        seen += [r.object_id for r in page.rows]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert sorted(seen) == sorted([*made, asked]) and len(seen) == len(set(seen))
    created = [app.store.get(o).created_at for o in seen]  # type: ignore[union-attr]
    assert created == sorted(created, reverse=True)

    def ids(**given: str) -> set[str]:
        return {r.object_id for r in queries.page(Filters.from_query(given), limit=500).rows}

    assert ids(agent="asker") == {asked}
    assert ids(version="1") == {*made, asked}
    assert ids(label="batch=odd") == {o for n, o in enumerate(made) if n % 2}
    assert ids(label="batch=none") == set()
    assert ids(q="obj-07") == {f"obj-07{n}" for n in range(5)}
    assert ids(q="obj_") == set()  # a wildcard character is matched as itself
    assert ids(status="ready") == {*made, asked}
    assert ids(status="completed") == set()
    assert ids(phase="instantiated") == {*made, asked}
    assert ids(parent="nobody") == set()
    assert ids(node="nobody") == set()
    middle = app.store.get("obj-040").created_at  # type: ignore[union-attr]
    assert ids(since=str(middle)) >= {"obj-040", asked}
    assert "obj-000" in ids(until=str(middle)) and asked not in ids(until=str(middle))
    assert ids(since="2000-01-01 00:00") == {*made, asked}
    assert ids(until="2000-01-01T00:00:00+00:00") == set()
    for bad in ({"status": "nope"}, {"label": "no-equals"}, {"since": "x"},
                {"until": "nan"}, {"agent": "a\x00b"}, {"since": "2026-13-45"}):
        with pytest.raises(ConfigurationError):
            Filters.from_query(bad)
    with closing(served.login()) as client:
        page = client.get("/objects", params={"label": "batch=even"})
        assert page.status_code == 200 and "obj-073" not in page.text
        assert page.text.count('href="/objects/obj-') == 38
        first = client.get("/objects")
        assert "next page" in first.text
        nxt = first.text.split('class="next" href="')[1].split('"')[0].replace("&amp;", "&")
        second = client.get(nxt)
        assert second.status_code == 200
        assert set(_rows(first.text)).isdisjoint(_rows(second.text))


def _rows(html: str) -> list[str]:
    return [part.split('"')[0] for part in html.split('<tr><td><a href="/objects/')[1:]]


def test_inbox_stream_and_actions_noted(served: Served, tmp_path: Path,
                                        store_url: str, key_dir: Path) -> None:
    app = served.app
    worker = start_worker(store_url, key_dir, tmp_path / "worker.log")
    try:
        ask = app.start("asker", "colour").object_id
        nap = app.start("sleeper", 3600.0).object_id
        wait_until(lambda: app.get(ask).status is Status.DORMANT
                   and app.get(nap).status is Status.DORMANT)
        with closing(served.login(name="olga")) as client:
            inbox = client.get("/inbox").text
            assert f'data-object="{ask}"' in inbox and nap not in inbox
            assert "No tool call waits for approval." in inbox
            csrf = csrf_of(inbox)
            for action in ("pause", "resume"):
                got = client.post(f"/act/{action}", data={"csrf": csrf, "object_id": nap})
                assert got.status_code == 303
            wait_until(lambda: [n["action"] for n in actions_noted(app, nap)]
                       == ["pause", "resume"])
            nonce = inbox.split('name="nonce" value="')[1].split('"')[0]
            for _ in range(2):  # the same form sent twice: one event, one note
                got = client.post("/act/send", data={"csrf": csrf, "object_id": ask,
                                                     "event": "answer", "nonce": nonce,
                                                     "payload": '{"hex": "#00f"}'})
                assert got.status_code == 303
            done = client.get(f"/objects/{ask}").text
            # the second: already sent, or (if the object was quicker) already ended
            assert "(already sent)" in done or "terminated" in done
            assert served.app.handle(ask).result(timeout=20) == {
                "topic": "colour", "answer": {"hex": "#00f"}}
            assert [n["action"] for n in actions_noted(app, ask)] == ["send"]
            got = client.post("/act/send", data={"csrf": csrf, "object_id": nap,
                                                 "event": "answer", "nonce": "bad nonce!"})
            assert "nonce is damaged" in client.get(f"/objects/{nap}").text
            with client.stream("GET", "/stream", params={"id": ask}) as events:
                lines = [line for line in events.iter_lines() if line]
            data = [json.loads(x[6:]) for x in lines if x.startswith("data: {\"seq")]
            assert [d["seq"] for d in data] == list(range(1, len(data) + 1))
            assert data[-1]["kind"] == "terminated" and "event: end" in lines
            assert "send by olga (operator, token) via dashboard" in " ".join(
                d["line"] for d in data)
            later = [x for x in client.get("/stream", params={"id": ask},
                                           headers={"last-event-id": "4"}).text.splitlines()
                     if x.startswith("id: ")]
            assert later[0] == "id: 5"
            client.post("/act/cancel", data={"csrf": csrf, "object_id": nap})
            wait_until(lambda: app.get(nap).status is Status.CANCELLED)
            assert [n["action"] for n in actions_noted(app, nap)] == [
                "pause", "resume", "cancel"]
            assert all(n["by"] == "olga" for n in actions_noted(app, nap))
            # Acting on an ended object changes nothing and says why.
            before = app.store.get(nap)
            client.post("/act/cancel", data={"csrf": csrf, "object_id": nap})
            assert "terminated" in client.get(f"/objects/{nap}").text
            assert app.store.get(nap) == before
            assert app.verify(nap).ok and app.verify(ask).ok
            page = client.get(f"/objects/{ask}", params={"verify": "1"}).text
            assert "verified: " in page
            hour = client.get("/api/hour").json()
            assert sum(hour["completed"]) == 1 and sum(hour["failed"]) == 1
    finally:
        stop_worker(worker)


def test_worker_serves_the_dashboard(sqlite_url: str, key_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "worker.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "perdure", "--store", sqlite_url, "--key-dir", str(key_dir),
             "--app", "tests.web.agents:app", "worker", "--ui", "--ui-port", str(port)],
            cwd=ROOT, env=_env(), stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while "operator: " not in log.read_text():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        text = log.read_text()
        token = text.split("operator: ")[1].split()[0]
        assert f"dashboard on http://127.0.0.1:{port}/" in text
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            while True:
                try:
                    csrf = csrf_of(client.get("/login").text)
                    break
                except httpx.ConnectError:
                    assert time.monotonic() < deadline
                    time.sleep(0.1)
            client.post("/login", data={"csrf": csrf, "name": "w", "secret": token})
            wait_until(lambda: "1 live node" in client.get("/nodes").text)
    finally:
        stop_worker(proc)
    # The token was printed once: a second start prints none.
    assert log.read_text().count("operator: ") == 1


def test_a_long_memory_shows_its_intent_and_newest_records(
        served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past a size, an object's page reads the intent, its refinements and the newest
    records only (set small here: 3 records whole, then the newest 2)."""
    from perdure.web import _server

    monkeypatch.setattr(_server, "_WHOLE_MEMORY", 3)
    monkeypatch.setattr(_server, "_TAIL", 2)
    app = served.app
    with app.background_worker():
        oid = app.options(object_id="long-1").start("asker", "long").object_id
        wait_until(lambda: app.get(oid).status is Status.DORMANT)
        app.refine(oid, goal={"why": "longer"})
        app.send(oid, "answer", 42)
        app.handle(oid).result(timeout=20)
    total = app.get(oid).records
    with closing(served.login()) as client:
        page = client.get(f"/objects/{oid}").text
    assert f"Memory ({total} records)" in page
    assert f"{total - 2} older record(s) not shown" in page
    assert "asker@1" in page and "&quot;why&quot;: &quot;longer&quot;" in page
    assert page.count("<tr class=\"k-") == 2


def test_damaged_memory_is_shown_not_served(sqlite_url: str, key_dir: Path) -> None:
    """A record whose body was overwritten with bytes that are not JSON: the object's page
    says its memory cannot be read, verify names the record, the list goes on."""
    import sqlite3

    from tests.web.support import serve, stop_serving

    served = serve(sqlite_url, key_dir)
    try:
        app = served.app
        with app.background_worker():
            oid = app.options(object_id="hurt").start("asker", "x").object_id
            wait_until(lambda: app.get(oid).status is Status.DORMANT)
        db = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))
        db.execute("UPDATE records SET body = X'ff00fe' WHERE object_id = ? AND seq = 2",
                   (oid,))
        db.commit()
        db.close()
        with closing(served.login()) as client:
            page = client.get(f"/objects/{oid}")
            assert page.status_code == 200 and "memory cannot be read" in page.text
            checked = client.get(f"/objects/{oid}", params={"verify": "1"}).text
            assert "verify FAILED at record #2" in checked
            assert client.get("/objects").status_code == 200
            assert client.get("/").status_code == 200
            lines = client.get("/stream", params={"id": oid}).text
            assert "event: problem" in lines
    finally:
        stop_serving(served)


def test_parked_objects_wait_in_the_inbox(served: Served) -> None:
    app = served.app
    with app.background_worker():
        oid = app.start("fickle").object_id  # a fresh id: fickle remembers ids per process
        wait_until(lambda: app.get(oid).status is Status.DORMANT)
        app.send(oid, "go")
        wait_until(lambda: app.get(oid).status is Status.PARKED)
        with closing(served.login(name="pat")) as client:
            inbox = client.get("/inbox").text
            assert "Parked (1)" in inbox and oid in inbox
            client.post("/act/retry", data={"csrf": csrf_of(inbox), "object_id": oid,
                                            "back": "inbox"})
            assert "retry asked" in client.get("/inbox").text
            wait_until(lambda: any(n["action"] == "retry"
                                   for n in actions_noted(app, oid)))
    with closing(served.login("viewer")) as client:
        assert "retry-btn" not in client.get("/inbox").text


def test_the_dashboard_reads_a_memory_store(key_dir: Path) -> None:
    """On an in-memory store (``memory:``) every page the dashboard draws from the
    store's ``Browse`` role works: the overview, the filtered list and its pages, the
    inbox, the nodes and the last hour."""
    served = serve("memory:", key_dir)
    try:
        app = served.app
        with app.background_worker():
            ask = app.options(labels={"team": "red"}).start("asker", "colour").object_id
            naps = [app.options(object_id=f"nap-{n}").start("sleeper", 3600.0).object_id
                    for n in range(3)]
            wait_until(lambda: all(app.get(o).status is Status.DORMANT for o in [ask, *naps]))
            with closing(served.login(name="mo")) as client:
                assert "dormant" in client.get("/").text
                listed = client.get("/objects", params={"status": "dormant"}).text
                assert sorted(_rows(listed)) == sorted([ask, *naps])
                assert _rows(client.get("/objects", params={"label": "team=red"}).text) == [
                    ask]
                assert _rows(client.get("/objects", params={"q": "nap-"}).text) == naps[::-1]
                assert f'data-object="{ask}"' in client.get("/inbox").text
                assert "1 live node" in client.get("/nodes").text
                assert client.get("/api/hour").json()["sampled_objects"] == 4
    finally:
        stop_serving(served)
