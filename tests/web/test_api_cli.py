"""``perdure api`` and ``perdure api-token`` as real processes: tokens made, listed and
revoked, kept only as hashes (mode 0600); a revoked or expired token stops working at its
next request; the API served alone with the agents of ``--app``; a non-loopback address
without TLS refused in one line; the OpenAPI document written."""

from __future__ import annotations

import json
import socket
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from perdure import web
from perdure.errors import ConfigurationError
from tests.web.agents import app as agents_app
from tests.web.api_support import problem
from tests.web.support import MODULE, ROOT, _env, free_port, wait_until

pytestmark = pytest.mark.timeout(120)


def _perdure(*args: str, store: str, key_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "perdure", "--store", store, "--key-dir", str(key_dir), *args],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=60)


def test_tokens_made_listed_and_revoked(sqlite_url: str, key_dir: Path) -> None:
    made = _perdure("api-token", "create", "ci-bot", "--scope", "read,operate",
                    store=sqlite_url, key_dir=key_dir)
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert token.startswith("pdr_") and "shown this once" in made.stderr
    kept = key_dir / "api-tokens.json"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert token.split("_", 2)[2] not in kept.read_text()  # only its hash is kept
    listed = json.loads(_perdure("api-token", "list", "--json", store=sqlite_url,
                                 key_dir=key_dir).stdout)
    assert [(t["name"], t["scopes"]) for t in listed] == [("ci-bot", ["read", "operate"])]
    tokens = web.api_tokens(key_dir)
    found = tokens.check(token)
    assert found is not None and found.name == "ci-bot"
    assert tokens.check(token[:-1] + ("A" if token[-1] != "A" else "B")) is None
    assert tokens.check("pdr_" + "0" * 12 + "_" + "x" * 43) is None
    revoked = _perdure("api-token", "revoke", listed[0]["id"], store=sqlite_url,
                       key_dir=key_dir)
    assert revoked.returncode == 0
    assert tokens.check(token) is None  # the entry is gone: the token proved before fails
    again = _perdure("api-token", "revoke", listed[0]["id"], store=sqlite_url,
                     key_dir=key_dir)
    assert again.returncode == 2 and "no API token" in again.stderr
    bad = _perdure("api-token", "create", "x", "--scope", "admin", store=sqlite_url,
                   key_dir=key_dir)
    assert bad.returncode != 0 and "unknown scope 'admin'" in bad.stderr
    with pytest.raises(ConfigurationError, match="at least one scope"):
        tokens.create("x", [])
    expiring, _ = tokens.create("brief", ["read"], days=1e-6)
    wait_until(lambda: tokens.check(expiring) is None, timeout=5)
    with pytest.raises(ConfigurationError, match="damaged"):
        kept.write_text("[]")
        tokens.list()


def test_the_api_served_alone(sqlite_url: str, key_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    setup = agents_app.with_settings(store=sqlite_url, key_dir=key_dir)
    first = setup.start("asker", "sets the key folder up").object_id
    setup.close()
    token, kept = web.api_tokens(key_dir).create("svc", ["read", "operate"])
    log = tmp_path / "api.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "perdure", "--store", sqlite_url, "--key-dir",
             str(key_dir), "--app", f"{MODULE}:app", "api", "--port", str(port)],
            cwd=ROOT, env=_env(), stdout=sink, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}/api/v1"
        auth = {"Authorization": f"Bearer {token}"}

        def up() -> bool:
            try:
                return httpx.get(f"{url}/openapi.json", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(up, timeout=30)
        assert f"API on http://127.0.0.1:{port}/api/v1" in log.read_text()
        started = httpx.post(f"{url}/objects", json={"agent": "asker", "args": ["cli"]},
                             headers=auth, timeout=10)
        assert started.status_code == 201, started.text
        oid = started.json()["object"]["object_id"]
        assert httpx.get(f"{url}/objects/{oid}", headers=auth, timeout=10).json()[
            "agent"] == "asker"
        listed = httpx.get(f"{url}/objects", headers=auth, timeout=10).json()["objects"]
        assert {o["object_id"] for o in listed} == {first, oid}
        problem(httpx.get(f"http://127.0.0.1:{port}/elsewhere", timeout=10), 404)
        web.api_tokens(key_dir).revoke(kept.token_id)
        problem(httpx.get(f"{url}/objects/{oid}", headers=auth, timeout=10), 401)
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def test_a_network_address_needs_tls(sqlite_url: str, key_dir: Path) -> None:
    _perdure("api-token", "create", "x", "--scope", "read", store=sqlite_url,
             key_dir=key_dir)
    refused = _perdure("api", "--host", "0.0.0.0", "--port", str(free_port()),
                       store=sqlite_url, key_dir=key_dir)
    assert refused.returncode == 2
    assert refused.stderr.strip().count("\n") == 0
    assert "refusing to serve the API on 0.0.0.0" in refused.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        busy = _perdure("api", "--port", str(taken.getsockname()[1]), store=sqlite_url,
                        key_dir=key_dir)
    assert busy.returncode == 2 and busy.stderr.strip().count("\n") == 0, busy.stderr
    assert "cannot serve the API on 127.0.0.1:" in busy.stderr
    assert "the port is in use (another API?)" in busy.stderr
    with pytest.raises(ConfigurationError):
        web.check_api_bind("10.1.2.3", tls=False)
    web.check_api_bind("10.1.2.3", tls=True)
    web.check_api_bind("::1", tls=False)


def test_the_openapi_document_is_written(tmp_path: Path, sqlite_url: str,
                                         key_dir: Path) -> None:
    out = tmp_path / "openapi.json"
    done = _perdure("api", "--write-openapi", str(out), store=sqlite_url, key_dir=key_dir)
    assert done.returncode == 0, done.stderr
    assert out.read_text() == web.openapi_text()
    printed = _perdure("api", "--write-openapi", "-", store=sqlite_url, key_dir=key_dir)
    assert printed.stdout == web.openapi_text()
