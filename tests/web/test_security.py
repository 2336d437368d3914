"""The dashboard's guard, attacked over plain HTTP: no session, a wrong token, a
cross-origin POST, a forged Host header, a viewer acting, a bad CSRF token. Each is
refused and logged, and the store is left exactly as it was."""

from __future__ import annotations

import json
import logging
import stat
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

import perdure
from perdure import web
from perdure.errors import ConfigurationError
from perdure.web._auth import AUTH_FILE
from tests.web.support import ROOT, Served, _env, csrf_of

pytestmark = pytest.mark.timeout(120)


def _snapshot(app: perdure.App, object_id: str) -> tuple[object, ...]:
    row = app.store.get(object_id)
    assert row is not None
    return (row.head_seq, row.head_hash, row.paused, row.cancel_requested, row.parked,
            row.status, tuple(e.event_id for e in app.store.pending_events(object_id)))


def _target(served: Served) -> str:
    return served.app.options(object_id="target-1").start("sleeper", 3600.0).object_id


def _refused(caplog: pytest.LogCaptureFixture, why: str) -> bool:
    return any("dashboard refused" in r.getMessage() and why in r.getMessage()
               for r in caplog.records)


def test_no_session_is_refused(served: Served, caplog: pytest.LogCaptureFixture) -> None:
    oid = _target(served)
    before = _snapshot(served.app, oid)
    caplog.set_level(logging.INFO, "perdure.web")
    with served.client() as anon:
        page = anon.get("/objects", headers={"accept": "text/html"})
        assert page.status_code == 303 and page.headers["location"] == "/login"
        for path in ("/", "/objects", f"/objects/{oid}", "/inbox", "/nodes", "/api/hour",
                     f"/stream?id={oid}", "/queues", "/schedules"):
            got = anon.get(path)
            assert got.status_code == 401, path
            assert oid not in got.text
        for action in ("cancel", "pause", "send"):
            got = anon.post(f"/act/{action}", data={"object_id": oid, "event": "x"})
            assert got.status_code == 401
        for action in ("pause", "delete"):
            got = anon.post(f"/schedules/{action}", data={"name": "x", "confirm": "yes"})
            assert got.status_code == 401
        anon.cookies.set("perdure_session", "made-up-session-id")
        forged = anon.post("/act/cancel", data={"object_id": oid})
        assert forged.status_code == 401
    assert _snapshot(served.app, oid) == before
    assert _refused(caplog, "no valid session")


def test_a_wrong_token_opens_no_session(served: Served,
                                        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "perdure.web")
    with served.client() as client:
        for secret in ("wrong", served.tokens["operator"][:-1], "", "x" * 5000, "again"):
            csrf = csrf_of(client.get("/login").text)
            got = client.post("/login", data={"csrf": csrf, "name": "mallory",
                                              "secret": secret})
            assert got.status_code in (401, 429)
            assert "perdure_session" not in got.cookies
        assert client.get("/objects").status_code == 401
        # After five failures the client is turned away even with the right token.
        csrf = csrf_of(client.get("/login").text)
        got = client.post("/login", data={"csrf": csrf, "name": "mallory",
                                          "secret": served.tokens["operator"]})
        assert got.status_code == 429
    assert any("login failed" in r.getMessage() for r in caplog.records)
    assert _refused(caplog, "login throttled")


def test_logins_sent_at_once_cannot_outrun_the_throttle(served: Served) -> None:
    """Many wrong secrets and the right one, posted at the same moment from one client:
    attempts still being checked count, so no more than the throttle allows are evaluated
    and every other one is turned away (429) without its secret being tried."""
    import threading

    allowed = 5
    secrets = [f"wrong-{n}" for n in range(23)] + [served.tokens["operator"]]
    clients = [served.client() for _ in secrets]
    forms = [csrf_of(c.get("/login").text) for c in clients]
    start = threading.Barrier(len(secrets))
    codes: list[int] = [0] * len(secrets)

    def post(n: int) -> None:
        start.wait()
        codes[n] = clients[n].post("/login", data={"csrf": forms[n], "name": "mallory",
                                                   "secret": secrets[n]}).status_code

    threads = [threading.Thread(target=post, args=(n,)) for n in range(len(secrets))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for client in clients:
        client.close()
    evaluated = [c for c in codes if c != 429]
    assert all(c in (303, 401, 429) for c in codes), codes
    assert len(evaluated) <= allowed, codes
    assert codes.count(429) >= len(secrets) - allowed
    # The window is still closed for that client, right token or not (none of the five
    # let in was the right one, or it logged in and took only its own attempt back).
    with served.client() as late:
        csrf = csrf_of(late.get("/login").text)
        again = late.post("/login", data={"csrf": csrf, "name": "mallory",
                                          "secret": served.tokens["operator"]})
        assert again.status_code == (303 if codes.count(401) < allowed else 429)


def test_login_needs_its_form(served: Served) -> None:
    """A login posted from elsewhere (no form cookie, or another origin) is refused."""
    with served.client() as client:
        got = client.post("/login", data={"csrf": "x", "name": "a",
                                          "secret": served.tokens["operator"]})
        assert got.status_code == 403
        csrf = csrf_of(client.get("/login").text)
        got = client.post("/login", data={"csrf": csrf, "name": "a",
                                          "secret": served.tokens["operator"]},
                          headers={"origin": "http://evil.example"})
        assert got.status_code == 403


def test_cross_origin_and_csrf_are_refused(served: Served,
                                           caplog: pytest.LogCaptureFixture) -> None:
    oid = _target(served)
    before = _snapshot(served.app, oid)
    caplog.set_level(logging.INFO, "perdure.web")
    with closing(served.login()) as client:
        csrf = csrf_of(client.get(f"/objects/{oid}").text)
        for headers in ({"origin": "http://evil.example"}, {"origin": "null"},
                        {"origin": f"https://127.0.0.1:{served.port}"},
                        {"sec-fetch-site": "cross-site"}, {"sec-fetch-site": "same-site"}):
            got = client.post("/act/cancel", data={"csrf": csrf, "object_id": oid},
                              headers=headers)
            assert got.status_code == 403, headers
        for token in ("", "wrong", csrf[:-1]):
            got = client.post("/act/cancel", data={"csrf": token, "object_id": oid})
            assert got.status_code == 403
        got = client.post("/act/send", data={"object_id": oid, "event": "x"})
        assert got.status_code == 403
        for headers in ({"origin": "http://evil.example"}, {"sec-fetch-site": "cross-site"}):
            got = client.post("/schedules/pause", data={"csrf": csrf, "name": "x"},
                              headers=headers)
            assert got.status_code == 403, headers
        assert _snapshot(served.app, oid) == before
        # The same request from the dashboard's own page goes through.
        got = client.post("/act/pause", data={"csrf": csrf, "object_id": oid},
                          headers={"origin": served.url, "sec-fetch-site": "same-origin"})
        assert got.status_code == 303
    assert served.app.store.get(oid).paused  # type: ignore[union-attr]
    assert _refused(caplog, "Origin 'http://evil.example'")
    assert _refused(caplog, "Sec-Fetch-Site cross-site")
    assert _refused(caplog, "bad CSRF token")


def test_a_forged_host_is_refused(served: Served, caplog: pytest.LogCaptureFixture) -> None:
    oid = _target(served)
    before = _snapshot(served.app, oid)
    caplog.set_level(logging.INFO, "perdure.web")
    with closing(served.login()) as client:
        csrf = csrf_of(client.get("/").text)
        for host in ("evil.example", f"evil.example:{served.port}", "127.0.0.1.evil.example",
                     ""):
            assert client.get("/", headers={"host": host}).status_code == 400
            got = client.post("/act/cancel", data={"csrf": csrf, "object_id": oid},
                              headers={"host": host})
            assert got.status_code == 400
        assert client.get("/login", headers={"host": "evil.example"}).status_code == 400
        assert client.get("/", headers={"host": f"localhost:{served.port}"}).status_code == 200
    assert _snapshot(served.app, oid) == before
    assert _refused(caplog, "Host header 'evil.example'")


def test_a_viewer_reads_but_cannot_act(served: Served,
                                       caplog: pytest.LogCaptureFixture) -> None:
    oid = _target(served)
    before = _snapshot(served.app, oid)
    caplog.set_level(logging.INFO, "perdure.web")
    with closing(served.login("viewer", name="victor")) as client:
        page = client.get(f"/objects/{oid}")
        assert page.status_code == 200 and "Viewers read" in page.text
        assert 'action="/act/cancel"' not in page.text
        csrf = csrf_of(page.text)
        for action in ("cancel", "pause", "resume", "retry", "send", "fork"):
            got = client.post(f"/act/{action}", data={"csrf": csrf, "object_id": oid,
                                                      "event": "answer", "at": "1"})
            assert got.status_code == 403, action
        for verdict in ("approve", "reject"):
            got = client.post(f"/inbox/{verdict}", data={"csrf": csrf, "object_id": oid,
                                                         "proposal_id": "p", "reason": "r"})
            assert got.status_code == 403
    assert _snapshot(served.app, oid) == before
    assert _refused(caplog, "viewer tried to act")


def test_cookies_and_headers(served: Served) -> None:
    with served.client() as client:
        csrf = csrf_of(client.get("/login").text)
        got = client.post("/login", data={"csrf": csrf, "name": "alice",
                                          "secret": served.tokens["operator"]})
        cookie = next(v for k, v in got.headers.multi_items()
                      if k == "set-cookie" and v.startswith("perdure_session="))
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie
        assert "Secure" not in cookie  # plain http on loopback
        page = client.get("/")
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
        assert page.headers["x-frame-options"] == "DENY"
        assert page.headers["cache-control"] == "no-store"
        assert served.tokens["operator"] not in page.text
        # Logging out ends the session for good.
        client.post("/logout", data={"csrf": csrf_of(page.text)})
        assert client.get("/objects").status_code == 401


def test_secure_cookie_over_https(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    app = perdure.App(store=f"sqlite:///{tmp_path / 's.db'}", key_dir=tmp_path / "keys")
    asgi, tokens = web.dashboard(app, port=8377, https=True)
    with TestClient(asgi, base_url="https://127.0.0.1:8377") as client:  # type: ignore[arg-type]
        csrf = csrf_of(client.get("/login").text)
        got = client.post("/login", data={"csrf": csrf, "name": "a",
                                          "secret": tokens["operator"]},
                          headers={"origin": "https://127.0.0.1:8377"},
                          follow_redirects=False)
        cookie = got.headers["set-cookie"]
        assert "Secure" in cookie and "HttpOnly" in cookie
        page = client.get("/")
        assert page.headers["strict-transport-security"].startswith("max-age=")
        # Over https, a POST from the http origin of the same host is cross-origin.
        refused = client.post("/act/pause", data={"csrf": csrf_of(page.text),
                                                  "object_id": "x"},
                              headers={"origin": "http://127.0.0.1:8377"})
        assert refused.status_code == 403
    app.close()


def test_tokens_are_stored_hashed_and_shown_once(tmp_path: Path) -> None:
    app = perdure.App(store=f"sqlite:///{tmp_path / 's.db'}", key_dir=tmp_path / "keys")
    _, tokens = web.dashboard(app)
    assert set(tokens) == {"operator", "viewer"}
    stored = tmp_path / "keys" / AUTH_FILE
    text = stored.read_text()
    assert all(token not in text for token in tokens.values())
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    _, again = web.dashboard(app)
    assert again == {}  # printed once: a second start issues none
    _, fresh = web.dashboard(app, new_tokens=True)
    assert fresh and fresh["operator"] != tokens["operator"]
    stored.write_text("{not json")
    with pytest.raises(ConfigurationError, match="remove"):
        web.dashboard(app)
    app.close()


def test_a_public_address_needs_a_password(tmp_path: Path) -> None:
    app = perdure.App(store=f"sqlite:///{tmp_path / 's.db'}", key_dir=tmp_path / "keys")
    for host in ("0.0.0.0", "192.168.1.10", "::", "example.com"):
        with pytest.raises(ConfigurationError, match="without a password"):
            web.dashboard(app, host=host)
    with pytest.raises(ConfigurationError, match="shorter than 8"):
        web.dashboard(app, host="0.0.0.0", passwords={"operator": "short"})
    web.dashboard(app, host="0.0.0.0", passwords={"operator": "a long password"})
    app.client.certified()  # the folder set up as a worker's is: `ui` refuses an empty one
    app.close()
    done = subprocess.run(
        [sys.executable, "-m", "perdure", "--store", f"sqlite:///{tmp_path / 's.db'}",
         "--key-dir", str(tmp_path / "keys"), "ui", "--host", "0.0.0.0"],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "without a password" in lines[0], done.stderr


def test_a_password_logs_in_with_its_role(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    app = perdure.App(store=f"sqlite:///{tmp_path / 's.db'}", key_dir=tmp_path / "keys")
    asgi, _ = web.dashboard(app, port=8377, passwords={"viewer": "viewer password 1"})
    with TestClient(asgi, base_url="http://127.0.0.1:8377") as client:  # type: ignore[arg-type]
        csrf = csrf_of(client.get("/login").text)
        client.post("/login", data={"csrf": csrf, "name": "vera",
                                    "secret": "viewer password 1"})
        page = client.get("/")
        assert page.status_code == 200 and "vera · viewer" in page.text
    app.close()


def test_hostile_values_are_shown_escaped(served: Served) -> None:
    evil = "<script>alert(1)</script>"
    oid = served.app.options(object_id=evil, labels={"k": "<img src=x onerror=alert(2)>"}).start(
        "asker", evil).object_id
    with closing(served.login()) as client:
        for path in ("/objects", f"/objects/{evil}", "/inbox", f"/objects?q={evil}"):
            page = client.get(path)
            assert page.status_code == 200
            assert "<script>alert" not in page.text and "<img src=x" not in page.text
        got = client.get("/objects?cursor=not-a-cursor")
        assert got.status_code == 400 and "cursor is damaged" in got.text
        got = client.get("/objects?status=bogus")
        assert got.status_code == 400 and "unknown status" in got.text
        got = client.get("/objects?since=soon")
        assert got.status_code == 400
        assert client.get("/objects/no-such-object").status_code == 404
        csrf = csrf_of(client.get("/").text)
        got = client.post("/act/send", data={"csrf": csrf, "object_id": oid,
                                             "event": "perdure:refine", "payload": "{}"})
        assert got.status_code == 303
        page = client.get(f"/objects/{evil}")
        assert "is reserved" in page.text
        got = client.post("/act/explode", data={"csrf": csrf, "object_id": oid})
        assert got.status_code == 303
        assert "unknown action" in client.get(f"/objects/{evil}").text
        big = client.post("/act/send", content=b"a=" + b"x" * 300_000,
                          headers={"content-type": "application/x-www-form-urlencoded"})
        assert big.status_code == 413
    assert json.loads(json.dumps(served.app.store.pending_events(oid) == []))
