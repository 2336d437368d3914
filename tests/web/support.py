"""A dashboard served on a free port, worker processes, and logging in over HTTP."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

import perdure
from perdure import web
from tests.web.agents import app as agents_app

ROOT = Path(__file__).resolve().parents[2]
MODULE = "tests.web.agents"


def free_port() -> int:
    """A TCP port nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Served:
    """A running dashboard: its URL, the tokens issued, the App it reads through."""

    url: str
    port: int
    tokens: dict[str, str]
    app: perdure.App
    server: Any

    def client(self, **options: Any) -> httpx.Client:
        """A plain HTTP client of the dashboard (no session)."""
        return httpx.Client(base_url=self.url, timeout=10, **options)

    def login(self, role: str = "operator", name: str = "alice") -> httpx.Client:
        """A client logged in with the ``role``'s token."""
        client = self.client()
        page = client.get("/login")
        csrf = csrf_of(page.text)
        done = client.post("/login", data={"csrf": csrf, "name": name,
                                           "secret": self.tokens[role]})
        assert done.status_code == 303, done.text
        return client


def csrf_of(html: str) -> str:
    """The CSRF token of a page's forms."""
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found is not None, html[:500]
    return found.group(1)


def serve(store_url: str, key_dir: Path, node_id: str | None = None,
          **options: Any) -> Served:
    """The dashboard over ``store_url`` (uvicorn in a thread on a free port), as node
    ``node_id`` (default: the key folder's)."""
    app = agents_app.with_settings(store=store_url, key_dir=key_dir, node_id=node_id)
    port = free_port()
    asgi, tokens = web.dashboard(app, port=port, **options)
    _, server = web.serve_in_thread(asgi, host="127.0.0.1", port=port)
    deadline = time.monotonic() + 10
    while not getattr(server, "started", False):
        if time.monotonic() > deadline:
            pytest.fail("the dashboard did not start")
        time.sleep(0.02)
    return Served(f"http://127.0.0.1:{port}", port, tokens, app, server)


def stop_serving(served: Served) -> None:
    """Stop the dashboard's server and close its App."""
    served.server.should_exit = True
    time.sleep(0.2)
    served.app.close()


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERDURE_")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra or {})
    return env


def start_worker(store_url: str, key_dir: Path, log: Path,
                 env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A ``perdure worker`` process serving the test agents (``env``: more variables)."""
    with open(log, "ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "perdure", "--store", store_url, "--key-dir", str(key_dir),
             "--app", f"{MODULE}:app", "worker", "--lease", "2", "--poll", "0.02"],
            cwd=ROOT, env=_env(env), stdout=sink, stderr=subprocess.STDOUT)


def stop_worker(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM a worker and wait for it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait_until(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    """Poll ``predicate`` until true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail("condition not reached in time")
        time.sleep(0.05)


def actions_noted(app: perdure.App, object_id: str) -> list[dict[str, Any]]:
    """The notes of who acted on the object, from its memory."""
    return [dict(r.body["fields"]["operator_action"]) for r in app.history(object_id)
            if r.kind == "progress" and "operator_action" in r.body.get("fields", {})]
