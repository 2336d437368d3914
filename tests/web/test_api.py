"""The HTTP API over a real server (uvicorn on a free port, its loop watched for stalls)
and real workers, on both stores: start, read, list, wait for a result, answer, send,
control, query; who acted is noted in memory; a token without the scope, no token, bad
input and unknown objects are refused with problem documents and change nothing."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from perdure.core.lifecycle import Status
from tests.web.api_support import ServedApi, problem, serve_api, stop_api
from tests.web.support import (
    actions_noted,
    serve,
    start_worker,
    stop_serving,
    stop_worker,
    wait_until,
)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def served(store_url: str, key_dir: Path) -> Iterator[ServedApi]:
    """The API over a fresh store of the backend under test."""
    api = serve_api(store_url, key_dir)
    yield api
    stop_api(api)


@pytest.fixture
def sqlite_served(sqlite_url: str, key_dir: Path) -> Iterator[ServedApi]:
    """The API over a fresh SQLite store."""
    api = serve_api(sqlite_url, key_dir)
    yield api
    stop_api(api)


def test_start_wait_answer_and_read_through_a_worker_process(
        served: ServedApi, store_url: str, key_dir: Path, tmp_path: Path) -> None:
    app = served.app
    worker = start_worker(store_url, key_dir, tmp_path / "worker.log")
    try:
        with closing(served.client("operator")) as client:
            got = client.post("/objects", json={"agent": "asker", "kwargs": {"topic": "tea"},
                                                "object_id": "ask/1", "labels": {"team": "a"},
                                                "deadline": 600})
            assert got.status_code == 201, got.text
            assert got.headers["location"] == "/api/v1/objects/ask%2F1"
            assert got.json()["created"] is True and got.json()["object"]["agent"] == "asker"
            again = client.post("/objects", json={"agent": "asker", "kwargs": {"topic": "c"},
                                                  "object_id": "ask/1"})
            assert again.status_code == 200 and again.json()["created"] is False
            assert "arguments" in again.json()["differs"]

            wait_until(lambda: app.get("ask/1").status is Status.DORMANT)
            waited = client.get("/objects/ask%2F1/result", params={"wait": 0.5})
            assert waited.json() == {"object_id": "ask/1", "status": "dormant",
                                     "done": False, "note": waited.json()["note"]}
            one = client.get("/objects/ask%2F1").json()
            assert one["waiting_event"] == "answer" and one["status"] == "dormant"
            asked = client.get("/questions").json()["questions"]
            assert [(q["object_id"], q["event"]) for q in asked] == [("ask/1", "answer")]
            listed = client.get("/objects", params={"status": "dormant", "agent": "asker",
                                                    "label": "team=a"}).json()
            assert [o["object_id"] for o in listed["objects"]] == ["ask/1"]
            assert listed["next_cursor"] is None

            answered = client.post("/objects/ask%2F1/answer", json={
                "answer": "green", "dedupe_key": "answer-1"})
            assert answered.status_code == 202 and answered.json() == {"sent": True,
                                                                      "event": "answer"}
            done = client.get("/objects/ask%2F1/result", params={"wait": 30}).json()
            assert done == {"object_id": "ask/1", "status": "completed", "done": True,
                            "note": None, "result": {"topic": "tea", "answer": "green"}}
            problem(client.post("/objects/ask%2F1/events", json={"name": "answer"}), 409)
    finally:
        stop_worker(worker)
    noted = actions_noted(app, "ask/1")
    assert [(n["action"], n["by"], n["role"], n["via"], n["token"]) for n in noted] == [
        ("start", "operator", "operate", "api", served.token_ids["operator"]),
        ("send", "operator", "operate", "api", served.token_ids["operator"])]
    assert app.verify("ask/1").ok


def test_send_control_query_and_paging(sqlite_served: ServedApi) -> None:
    served = sqlite_served
    app = served.app
    with app.background_worker(), closing(served.client("operator")) as client:
        ids = [client.post("/objects", json={"agent": "ticker", "args": [2]}).json()[
            "object"]["object_id"] for _ in range(5)]
        first = client.get("/objects", params={"agent": "ticker", "limit": 2}).json()
        second = client.get("/objects", params={"agent": "ticker", "limit": 2,
                                                "cursor": first["next_cursor"]}).json()
        third = client.get("/objects", params={"agent": "ticker", "limit": 2,
                                               "cursor": second["next_cursor"]}).json()
        paged = [o["object_id"] for page in (first, second, third) for o in page["objects"]]
        assert sorted(paged) == sorted(ids) and third["next_cursor"] is None

        oid = ids[0]
        wait_until(lambda: app.get(oid).status is Status.DORMANT)
        assert client.post(f"/objects/{oid}/queries/ticks", json={"args": [2]}).json() == {
            "answer": [{"n": 0}, {"n": 1}]}
        assert client.post(f"/objects/{oid}/queries/ticks").json()["answer"] == [
            {"n": 0}, {"n": 1}]
        problem(client.post(f"/objects/{oid}/queries/nope"), 404)
        assert client.post(f"/objects/{oid}/pause").json()["status"] == "paused"
        assert client.post(f"/objects/{oid}/resume", json={}).json()["status"] != "paused"
        problem(client.post(f"/objects/{oid}/retry"), 409)
        sent = [client.post(f"/objects/{oid}/events", json={
            "name": "go", "payload": {"by": "curl"}, "dedupe_key": "go-1"}) for _ in range(2)]
        assert [s.status_code for s in sent] == [202, 202]
        assert [s.json()["sent"] for s in sent] == [True, False]
        assert client.get(f"/objects/{oid}/result", params={"wait": 20}).json()[
            "result"] == {"ticks": 2, "go": {"by": "curl"}}

        victim = ids[1]
        cancelled = client.post(f"/objects/{victim}/cancel")
        assert cancelled.status_code == 200
        assert client.get(f"/objects/{victim}/result", params={"wait": 20}).json() == {
            "object_id": victim, "status": "cancelled", "done": True, "note": None}
    assert [n["action"] for n in actions_noted(app, oid)] == [
        "start", "pause", "resume", "send"]
    assert [n["action"] for n in actions_noted(app, victim)] == ["start", "cancel"]


def test_a_token_without_the_scope_changes_nothing(sqlite_served: ServedApi) -> None:
    served = sqlite_served
    app = served.app
    with app.background_worker():
        oid = app.start("asker", "who").object_id
        wait_until(lambda: app.get(oid).status is Status.DORMANT)
    row = app.store.get(oid)
    assert row is not None
    objects = len(app.list())
    with closing(served.client("reader")) as reader, \
            closing(served.client(None)) as anonymous, \
            closing(served.client("operator",
                                  headers={"Authorization": "Bearer pdr_0123456789ab_" + "x" * 43})
                    ) as forged:
        for client, status in ((reader, 403), (anonymous, 401), (forged, 401)):
            problem(client.post("/objects", json={"agent": "asker", "args": ["x"]}), status)
            problem(client.post(f"/objects/{oid}/events", json={"name": "answer"}), status)
            problem(client.post(f"/objects/{oid}/answer", json={"answer": 1}), status)
            for verb in ("pause", "cancel", "resume", "retry"):
                problem(client.post(f"/objects/{oid}/{verb}"), status)
        problem(anonymous.get(f"/objects/{oid}"), 401)
        refused = reader.post(f"/objects/{oid}/pause")
        assert 'error="insufficient_scope", scope="operate"' in refused.headers[
            "www-authenticate"]
        assert reader.get(f"/objects/{oid}").status_code == 200
    with closing(served.client("nothing-but-approve")) as approver:
        problem(approver.get(f"/objects/{oid}"), 403)
        problem(approver.get("/questions"), 403)
    assert app.store.get(oid) == row  # same head, flags, epoch
    assert app.store.pending_events(oid) == []
    assert len(app.list()) == objects


def test_bad_input_is_a_problem_naming_the_field(sqlite_served: ServedApi) -> None:
    served = sqlite_served
    app = served.app
    oid = app.start("asker", "input").object_id
    head = app.get(oid).records
    with closing(served.client("operator")) as client:
        problem(client.post("/objects", content=b"{not json"), 400)
        problem(client.post("/objects", content=b""), 400)
        problem(client.post("/objects", content=b"[" * 100_000 + b"]" * 100_000), 400)
        problem(client.post("/objects", json=["asker"]), 422, "body")
        problem(client.post("/objects", json={}), 422, "agent")
        problem(client.post("/objects", json={"agent": 5}), 422, "agent")
        problem(client.post("/objects", json={"agent": "nobody"}), 422, "agent")
        problem(client.post("/objects", json={"agent": "asker", "args": "x"}), 422, "args")
        problem(client.post("/objects", json={"agent": "asker", "kwargs": [1]}), 422, "kwargs")
        problem(client.post("/objects", json={"agent": "asker", "args": []}), 422, "args")
        problem(client.post("/objects", json={"agent": "asker", "kwargs": {"nope": 1}}),
                422, "kwargs")
        problem(client.post("/objects", json={"agent": "asker", "args": ["x"],
                                              "deadline": "soon"}), 422, "deadline")
        problem(client.post("/objects", json={"agent": "asker", "args": ["x"],
                                              "deadline": -1}), 422, "deadline")
        problem(client.post("/objects", json={"agent": "asker", "args": ["x"],
                                              "max_failures": 1.5}), 422, "max_failures")
        problem(client.post("/objects", json={"agent": "asker", "args": ["x"],
                                              "object_id": "has space"}), 422, "object_id")
        problem(client.post("/objects", json={"agent": "asker", "args": ["x"],
                                              "labels": {"k": 1}}), 422, "labels")
        problem(client.post("/objects", json={"agent": "asker", "args": ["x"],
                                              "budget": {"tokens": "many"}}), 422, "budget")
        problem(client.post("/objects", json={"agent": "asker", "args": ["x"],
                                              "kwarg": {}}), 422, "kwarg")
        problem(client.post("/objects", json={"agent": "sleeper", "args": [1],
                                              "object_id": oid}), 409)
        problem(client.post(f"/objects/{oid}/events", json={"payload": 1}), 422, "name")
        problem(client.post(f"/objects/{oid}/events", json={"name": "perdure:approval"}),
                422, "name")
        problem(client.post(f"/objects/{oid}/events", json={"name": "a", "dedupe_key": 7}),
                422, "dedupe_key")
        problem(client.post(f"/objects/{oid}/answer", json={"event": "answer"}), 422,
                "answer")
        problem(client.post(f"/objects/{oid}/answer", json={"answer": 1}), 409)
        problem(client.post(f"/objects/{oid}/queries/ticks", json={"args": {}}), 422, "args")
        problem(client.get("/objects", params={"status": "sleepy"}), 422, "status")
        problem(client.get("/objects", params={"since": "yesterday"}), 422, "since")
        problem(client.get("/objects", params={"limit": "0"}), 422, "limit")
        problem(client.get("/objects", params={"cursor": "!!"}), 422, "cursor")
        problem(client.get("/objects", params={"colour": "red"}), 422, "colour")
        problem(client.get(f"/objects/{oid}/result", params={"wait": "1000"}), 422, "wait")
        problem(client.get(f"/objects/{oid}/result", params={"wait": "nan"}), 422, "wait")
        problem(client.get(f"/objects/{oid}/stream", params={"after": "-1"}), 422, "after")
        problem(client.get(f"/objects/{oid}/stream", headers={"Last-Event-ID": "x"}), 422,
                "Last-Event-ID")
        for path in ("/objects/nobody", "/objects/nobody/result", "/objects/nobody/stream"):
            problem(client.get(path), 404)
        for path in ("/objects/nobody/pause", "/objects/nobody/cancel"):
            problem(client.post(path), 404)
        problem(client.post("/objects/nobody/events", json={"name": "x"}), 404)
        problem(client.get("/nothing/here"), 404)
        problem(client.get(f"/objects/{oid}/nothing"), 404)
        refused = problem(client.delete(f"/objects/{oid}"), 405)
        assert "GET" in refused["detail"]
        problem(client.post("/objects", content=b'{"agent": "' + b"a" * 2_000_000 + b'"}'),
                413)
    assert app.get(oid).records == head
    assert app.store.pending_events(oid) == []
    assert [o.object_id for o in app.list()] == [oid]


def test_the_dashboard_serves_the_api(store_url: str, key_dir: Path) -> None:
    dashboard = serve(store_url, key_dir)
    try:
        from perdure import web

        token, _ = web.api_tokens(key_dir).create("dash-caller", ["read", "operate"])
        with closing(dashboard.client()) as client:
            assert client.get("/api/v1/openapi.json").json() == web.openapi()
            problem(client.get("/api/v1/objects"), 401)
            with closing(dashboard.login()) as browser:  # a session is no bearer token
                problem(browser.get("/api/v1/objects"), 401)
            got = client.post("/api/v1/objects", json={"agent": "asker", "args": ["d"]},
                              headers={"Authorization": f"Bearer {token}"})
            assert got.status_code == 201
            oid = got.json()["object"]["object_id"]
            assert client.get(f"/api/v1/objects/{oid}", headers={
                "Authorization": f"Bearer {token}"}).json()["agent"] == "asker"
    finally:
        stop_serving(dashboard)
