"""The App the alert tests' worker processes load, a webhook receiver that checks each
delivery's Standard Webhooks signature on its own, and agents for the in-process tests.

``perdure --app tests.telemetry.alerts_support:app worker`` runs the declared rules
(``FewWorkers(2)``, evaluated every 0.05 s), delivering to ``ALERT_TEST_URL`` signed with
``ALERT_TEST_SECRET`` when those are set.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import perdure
from perdure.telemetry import Alerts, FewWorkers

__all__ = ["Receiver", "app", "asks", "drifts", "fails", "holds"]

SECRET = "alert-test-secret-0123456789"

app = perdure.App(store="sqlite:///never-opened.db", lease_seconds=1.0, poll_interval=0.01)


@app.agent(name="idle")
async def idle(run: perdure.Run) -> str:
    """Nothing: the worker processes need an agent to serve."""
    return "ok"


Alerts(app, rules=[FewWorkers(2)], every=0.05, backoff=0.05,
       webhook=os.environ.get("ALERT_TEST_URL"),
       secret=perdure.Secret(os.environ.get("ALERT_TEST_SECRET", SECRET)))


def _hold(path: str) -> str:
    while not Path(path).exists():
        time.sleep(0.01)
    return "released"


async def holds(run: perdure.Run, path: str) -> str:
    """One step that runs (writing nothing) until ``path`` exists."""
    return str(await run.step(_hold, path, name="hold"))


async def asks(run: perdure.Run) -> Any:
    """Asks a person a question, and returns the answer."""
    return await run.wait_for("answer", prompt="Ship it?", choices=["yes", "no"])


class Receiver:
    """A webhook receiver on a free local port: it checks each request's signature with
    ``secret`` (recomputed here from the headers and the body, not with perdure's own
    signing code) and keeps the JSON bodies of the valid ones; ``fail_first`` requests
    are answered 500 first (a receiver that is down for a while)."""

    def __init__(self, secret: str = SECRET, fail_first: int = 0) -> None:
        self.secret = secret
        self.bodies: list[dict[str, Any]] = []
        self.ids: list[str] = []
        self.refused = 0
        self.failing = fail_first
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                code = outer.take(self.headers["webhook-id"], self.headers["webhook-timestamp"],
                                  self.headers["webhook-signature"], body)
                self.send_response(code)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                del format, args

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/alerts"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def take(self, delivery: str, timestamp: str, signature: str, body: bytes) -> int:
        """Check and keep one delivery; the HTTP status to answer."""
        content = f"{delivery}.{timestamp}.".encode() + body
        expected = base64.b64encode(hmac.new(self.secret.encode(), content,
                                             hashlib.sha256).digest()).decode()
        with self._lock:
            if signature != f"v1,{expected}" or abs(time.time() - int(timestamp)) > 60:
                self.refused += 1
                return 401
            if self.failing > 0:
                self.failing -= 1
                return 500
            self.bodies.append(json.loads(body))
            self.ids.append(delivery)
            return 204

    def close(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()


def _noop() -> None:
    return None


async def drifts(run: perdure.Run, flag: str) -> str:
    """A step whose name depends on whether ``flag`` exists (made after the first run,
    replay no longer matches memory and the object parks), then a wait for ``go``."""
    await run.step(_noop, name="drifted" if Path(flag).exists() else "fixed")
    await run.wait_for("go")
    return "done"


async def fails(run: perdure.Run) -> None:
    """Fails for good at once."""
    raise ValueError("no such luck")
