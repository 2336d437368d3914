"""Webhooks over a real server (uvicorn on a free port, its loop watched for stalls), on
both stores: a signed POST starts or signals one object, a redelivery changes nothing,
and every refused request (unsigned, forged, stale, from the future, too large,
malformed, for an unknown agent, object or webhook) is a problem document that leaves
the store as it was."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest

from perdure import Secret
from perdure.core.lifecycle import Status
from perdure.errors import ConfigurationError, WebhookRefusedError
from perdure.triggers import Triggers, WebhookTrigger, sign
from tests.web.api_support import ServedApi, problem, serve_api, stop_api
from tests.web.support import start_worker, stop_worker, wait_until

pytestmark = pytest.mark.timeout(120)

SECRET = "s3cret-for-the-webhook-tests-0123456789"


def _declared() -> Triggers:
    declared = Triggers()
    declared.webhook("asks", agent="asker", secret=Secret(SECRET), labels={"from": "hook"})
    declared.webhook("answers", mode="signal", event="answer", object_field="object",
                     secret_env="PERDURE_TEST_HOOK_SECRET", tolerance=60, skew=5,
                     max_body=4096)
    return declared


@pytest.fixture
def served(store_url: str, key_dir: Path, monkeypatch: pytest.MonkeyPatch
           ) -> Iterator[ServedApi]:
    """The API over a fresh store of the backend under test, serving two webhooks."""
    monkeypatch.setenv("PERDURE_TEST_HOOK_SECRET", SECRET)
    api = serve_api(store_url, key_dir, triggers=_declared())
    yield api
    stop_api(api)


def _hook(served: ServedApi) -> httpx.Client:
    return httpx.Client(base_url=f"{served.url}/api/v1/hooks", timeout=30)


def _post(client: httpx.Client, name: str, doc: Any, *, delivery: str | None = None,
          at: float | None = None, secret: str = SECRET,
          headers: dict[str, str] | None = None) -> httpx.Response:
    body = json.dumps(doc).encode() if not isinstance(doc, bytes) else doc
    signed = sign(secret, body, int(time.time() if at is None else at), delivery)
    return client.post(f"/{name}", content=body, headers={
        **signed, "Content-Type": "application/json", **(headers or {})})


def _snapshot(served: ServedApi) -> tuple[list[str], list[Any]]:
    """What the store holds: the objects and every pending event."""
    ids = sorted(info.object_id for info in served.app.list())
    return ids, [served.app.store.pending_events(oid) for oid in ids]


def test_a_delivery_starts_one_object_and_a_redelivery_changes_nothing(
        served: ServedApi, store_url: str, key_dir: Path, tmp_path: Path) -> None:
    app = served.app
    worker = start_worker(store_url, key_dir, tmp_path / "worker.log",
                          env={"PERDURE_TEST_HOOK_SECRET": SECRET})
    try:
        with closing(_hook(served)) as client:
            first = _post(client, "asks", {"args": ["tea"]}, delivery="msg_2Lz")
            assert first.status_code == 200, first.text
            assert first.json() == {"object_id": "asks-msg_2Lz", "applied": True,
                                    "delivery": "msg_2Lz"}
            # The sender retries later: a new timestamp and signature, the same id.
            again = _post(client, "asks", {"args": ["tea"]}, delivery="msg_2Lz",
                          at=time.time() - 30)
            assert again.status_code == 200, again.text
            assert again.json() == {"object_id": "asks-msg_2Lz", "applied": False,
                                    "delivery": "msg_2Lz"}
            info = app.get("asks-msg_2Lz")
            assert info.agent == "asker"
            labels = app.history("asks-msg_2Lz")[0].body["context"]["labels"]
            assert labels == {"from": "hook", "trigger": "asks"}
            wait_until(lambda: app.get("asks-msg_2Lz").status is Status.DORMANT)

            # The signal webhook answers it: once, however often it is delivered (paused
            # meanwhile, so that the second delivery finds it still running).
            app.pause("asks-msg_2Lz")
            doc = {"object": "asks-msg_2Lz", "colour": "green"}
            sent = [_post(client, "answers", doc, delivery="evt-7") for _ in range(2)]
            assert [s.status_code for s in sent] == [200, 200], [s.text for s in sent]
            assert [s.json()["applied"] for s in sent] == [True, False]
            assert sent[0].json()["object_id"] == "asks-msg_2Lz"
            app.resume("asks-msg_2Lz")
            done = app.handle("asks-msg_2Lz").result(timeout=30)
            assert done == {"topic": "tea", "answer": doc}
            # Once it has ended, an event for it is refused: 409, nothing queued.
            late = problem(_post(client, "answers", doc, delivery="evt-8"), 409)
            assert "completed" in late["detail"]
    finally:
        stop_worker(worker)
    assert [i.object_id for i in app.list()] == ["asks-msg_2Lz"]
    received = [r for r in app.history("asks-msg_2Lz") if r.kind == "event_received"]
    assert len(received) == 1
    assert app.verify("asks-msg_2Lz").ok


def test_without_an_id_the_signature_names_the_delivery(served: ServedApi) -> None:
    app = served.app
    body = json.dumps({"args": ["coffee"]}).encode()
    at = int(time.time())
    with closing(_hook(served)) as client:
        headers = {**sign(SECRET, body, at), "Content-Type": "application/json"}
        assert "Webhook-Id" not in headers
        first = client.post("/asks", content=body, headers=headers)
        second = client.post("/asks", content=body, headers=headers)  # the same request
        assert first.status_code == second.status_code == 200, (first.text, second.text)
        assert first.json()["object_id"] == second.json()["object_id"]
        assert first.json()["object_id"].startswith("asks-sig-")
        assert [first.json()["applied"], second.json()["applied"]] == [True, False]
        # Signed without an id, the request cannot be given one afterwards.
        problem(client.post("/asks", content=body,
                            headers={**headers, "Webhook-Id": "other"}), 401)
    assert len(app.list()) == 1


def test_refused_requests_change_nothing(served: ServedApi) -> None:
    app = served.app
    with closing(_hook(served)) as client:
        started = _post(client, "asks", {"args": ["x"]}, delivery="base")
        assert started.status_code == 200
    before = _snapshot(served)
    body = json.dumps({"args": ["tea"]}).encode()
    now = time.time()
    with closing(_hook(served)) as client:
        # Not signed, signed with another secret, a signature over other bytes.
        assert problem(client.post("/asks", content=body), 401)["type"].endswith(
            "bad-signature")
        problem(_post(client, "asks", {"args": ["tea"]}, secret="another-secret-0123456789"),
                401)
        forged = sign(SECRET, b'{"args": ["other"]}', int(now), "d-1")
        assert problem(client.post("/asks", content=body, headers=forged), 401)[
            "type"] == "urn:perdure:problem:bad-signature"
        problem(client.post("/asks", content=body, headers={
            **sign(SECRET, body, int(now), "d-1"), "Webhook-Signature": "v1,!!notbase64"}), 401)
        problem(client.post("/asks", content=body, headers={
            **sign(SECRET, body, int(now), "d-1"), "Webhook-Signature": "v2,abc"}), 401)
        # Outside the replay window: old, and ahead of the server's clock.
        stale = problem(_post(client, "asks", {"args": ["tea"]}, delivery="d-2",
                              at=now - 400), 401)
        assert stale["type"].endswith("stale-timestamp") and "the 300 s" in stale["detail"]
        assert problem(_post(client, "asks", {"args": ["tea"]}, delivery="d-3",
                             at=now + 600), 401)["type"].endswith("future-timestamp")
        assert problem(_post(client, "answers", {"object": "asks-base"}, delivery="d-4",
                             at=now - 90), 401)["type"].endswith("stale-timestamp")
        # Malformed headers and bodies.
        problem(client.post("/asks", content=body, headers={
            **sign(SECRET, body, int(now)), "Webhook-Timestamp": "soon"}), 400)
        problem(_post(client, "asks", b"{not json", delivery="d-5"), 400)
        problem(_post(client, "asks", {"args": "tea"}, delivery="d-6"), 422)
        problem(_post(client, "asks", {"args": ["tea"], "extra": 1}, delivery="d-7"), 422)
        problem(_post(client, "asks", {"args": ["tea", "too", "many"]}, delivery="d-8"), 422)
        problem(_post(client, "asks", {"agent": "sleeper", "args": [1]}, delivery="d-9"), 422)
        too_big = problem(_post(client, "answers", {"object": "asks-base", "pad": "x" * 5000},
                                delivery="d-10"), 413)
        assert "4096" in too_big["detail"]
        # The object to signal does not exist, or the body does not name one.
        problem(_post(client, "answers", {"object": "nobody"}, delivery="d-11"), 404)
        problem(_post(client, "answers", {"answer": 1}, delivery="d-12"), 422)
        # No such webhook; not a POST.
        assert problem(_post(client, "nope", {"args": ["tea"]}), 404)["type"].endswith(
            "unknown-webhook")
        problem(client.get("/asks"), 405)
        # The same id signed again for other arguments: the object stays as it was.
        problem(_post(client, "asks", {"args": ["y"]}, delivery="base"), 409)
    assert _snapshot(served) == before
    assert app.get("asks-base").records == 1


def test_a_server_without_the_secret_refuses_and_says_so(
        sqlite_url: str, key_dir: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv("PERDURE_TEST_HOOK_SECRET", raising=False)
    served = serve_api(sqlite_url, key_dir, triggers=_declared())
    try:
        app = served.app
        oid = app.start("asker", "t").object_id
        with closing(_hook(served)) as client:
            refused = problem(_post(client, "answers", {"object": oid}, delivery="e-1"), 500)
            assert "secret" not in refused["detail"].lower() or "see its log" in refused[
                "detail"]
        assert app.store.pending_events(oid) == []
        assert any("PERDURE_TEST_HOOK_SECRET" in r.getMessage() for r in caplog.records)
    finally:
        stop_api(served)


def test_verify_and_declarations() -> None:
    hook = WebhookTrigger(name="h", agent="a", secret=Secret(SECRET), tolerance=10, skew=2)
    body = b'{"args": []}'
    headers = {k.lower(): v for k, v in sign(SECRET, body, 1000, "id-1").items()}
    assert hook.verify(headers, body, 1005) == "id-1"
    assert hook.verify(headers, body, 998.5) == "id-1"
    for now, kind in ((1011, "stale-timestamp"), (997, "future-timestamp")):
        with pytest.raises(WebhookRefusedError) as refused:
            hook.verify(headers, body, now)
        assert refused.value.kind == kind and refused.value.status == 401
    # Several signatures (a sender rotating its secret): any one that matches will do.
    rotated = {**headers, "webhook-signature": "v1,b2xk " + headers["webhook-signature"]}
    assert hook.verify(rotated, body, 1000) == "id-1"
    # A whsec_ secret is the base64 of its key, as Standard Webhooks gives them.
    std = WebhookTrigger(name="s", agent="a", secret=Secret("whsec_" + "QUJD" * 8))
    std_headers = {k.lower(): v for k, v in sign("whsec_" + "QUJD" * 8, body, 50).items()}
    assert std.verify(std_headers, body, 50).startswith("sig-")
    assert "Secret('***')" in repr(std.describe()) and "QUJD" not in repr(std.describe())
    for bad in ({"secret": None}, {"secret": Secret("short")}, {"secret": SECRET},
                {"secret": Secret(SECRET), "secret_env": "X"}, {"secret": Secret(SECRET),
                                                               "tolerance": 0},
                {"secret": Secret(SECRET), "max_body": 0},
                {"secret": Secret("whsec_not base64!!!!!")}):
        with pytest.raises(ConfigurationError):
            WebhookTrigger(name="bad", agent="a", **bad)
    declared = Triggers()
    declared.webhook("one", agent="a", secret_env="X")
    with pytest.raises(ConfigurationError):
        declared.webhook("one", agent="a", secret_env="X")
    assert list(declared.webhooks()) == ["one"]
