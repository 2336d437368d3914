"""The HTTP API served on a free port (uvicorn in a thread), its event loop watched for
stalls, with a token per kind of caller."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

import perdure
from perdure import web
from perdure.engine.stalls import LoopWatchdog, Stall
from tests.web.agents import app as agents_app
from tests.web.support import free_port

# Who the tests' tokens are, and what each may do.
CALLERS = {
    "reader": ("read",),
    "operator": ("read", "operate"),
    "approver": ("read", "approve"),
    "nothing-but-approve": ("approve",),
}


class Watched:
    """An ASGI application whose event loop a ``LoopWatchdog`` watches (100 ms), from
    the first thing the server hands it (its lifespan) on."""

    def __init__(self, asgi: Any) -> None:
        self.asgi = asgi
        self.stalls: list[Stall] = []
        self.dog: LoopWatchdog | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self.dog is None:
            self.dog = LoopWatchdog(0.1, self.stalls.append)
            self.dog.start()
        await self.asgi(scope, receive, send)


@dataclass
class ServedApi:
    """A running API: its URL, the App it serves, the ``Api`` itself, tokens by caller."""

    url: str
    port: int
    app: perdure.App
    api: Any
    server: Any
    thread: Any
    watched: Watched
    tokens: dict[str, str] = field(default_factory=dict)
    token_ids: dict[str, str] = field(default_factory=dict)

    def client(self, caller: str | None = "operator", **options: Any) -> httpx.Client:
        """An HTTP client sending ``caller``'s token (none for ``None``)."""
        headers = {} if caller is None else {"Authorization": f"Bearer {self.tokens[caller]}"}
        headers.update(options.pop("headers", {}))
        return httpx.Client(base_url=f"{self.url}/api/v1", timeout=30, headers=headers,
                            **options)

    def subscriptions(self, object_id: str) -> int:
        """Subscribers to pushes about ``object_id`` in the served App's store (each
        counted once, whatever kinds of push it hears)."""
        hub = self.app.store._hub  # the tests look at what the store holds
        return len({id(cb) for by_id in hub._subs.values()
                    for cb in by_id.get(object_id, ())})


def serve_api(store_url: str, key_dir: Path, *, node_id: str | None = None,
              **limits: Any) -> ServedApi:
    """The API over ``store_url`` as node ``node_id`` (default: the key folder's), with a
    token for each of ``CALLERS``."""
    app = agents_app.with_settings(store=store_url, key_dir=key_dir, node_id=node_id,
                                   lease_seconds=2.0, poll_interval=0.01)
    app.open_sealed = True
    api = web.api(app, **limits)
    tokens = web.api_tokens(app.identity.folder.path)
    served = ServedApi("", 0, app, api, None, None, Watched(api))
    for caller, scopes in CALLERS.items():
        token, kept = tokens.create(caller, scopes)
        served.tokens[caller] = token
        served.token_ids[caller] = kept.token_id
    port = free_port()
    thread, server = web.serve_in_thread(served.watched, host="127.0.0.1", port=port)
    deadline = time.monotonic() + 10
    while not getattr(server, "started", False):
        if time.monotonic() > deadline:
            pytest.fail("the API did not start")
        time.sleep(0.02)
    served.url, served.port = f"http://127.0.0.1:{port}", port
    served.server, served.thread = server, thread
    return served


def stop_api(served: ServedApi) -> None:
    """Stop the server, close the App, and fail if the server's loop stalled."""
    served.server.should_exit = True
    served.thread.join(timeout=10)
    if served.watched.dog is not None:
        served.watched.dog.stop()
    served.app.close()
    stalls = [f"{s.seconds * 1000:.0f} ms at:\n{s.stack}" for s in served.watched.stalls]
    assert not stalls, "the API's event loop stalled:\n" + "\n".join(stalls)


def raw_request(port: int, path: str, token: str, headers: dict[str, str] | None = None
                ) -> socket.socket:
    """A GET sent on a socket of its own, left open (to drop it mid-answer)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    lines = [f"GET /api/v1{path} HTTP/1.1", f"Host: 127.0.0.1:{port}",
             f"Authorization: Bearer {token}",
             *(f"{k}: {v}" for k, v in (headers or {}).items()), "", ""]
    sock.sendall("\r\n".join(lines).encode())
    return sock


def problem(response: httpx.Response, status: int, field: str | None = None) -> dict[str, Any]:
    """The problem document of ``response``, checked: its status, its media type, and
    the field it names."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/problem+json")
    doc: dict[str, Any] = response.json()
    assert doc["status"] == status and doc["type"].startswith("urn:perdure:problem:")
    assert doc["title"] and doc["detail"]
    if field is not None:
        assert doc.get("field") == field, doc
    return doc
