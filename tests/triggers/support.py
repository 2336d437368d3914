"""What the trigger tests share: the brokers (real RabbitMQ and NATS servers), a TCP
proxy the test can cut, triggers running in a thread, and waiting on conditions.

The servers: ``PERDURE_TEST_RABBITMQ`` (default ``amqp://guest:guest@127.0.0.1:5672/``)
and ``PERDURE_TEST_NATS`` (default ``nats://127.0.0.1:4222``, JetStream on). ``./dev
test`` starts each if it is installed and not listening. A test whose server cannot be
reached skips, naming it; under CI that skip fails the run (``tests/skips.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

import perdure
from perdure.triggers import Triggers

RABBITMQ_URL = os.environ.get("PERDURE_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672/")
NATS_URL = os.environ.get("PERDURE_TEST_NATS", "nats://127.0.0.1:4222")


def reachable(url: str, default_port: int) -> bool:
    """Whether something listens at ``url``'s host and port."""
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1",
                                       parts.port or default_port), timeout=2):
            return True
    except OSError:
        return False


def need_rabbitmq() -> str:
    """The RabbitMQ URL, or skip (failing under CI) when no server answers."""
    pytest.importorskip("aio_pika", reason="needs aio-pika: pip install -e '.[rabbitmq]'")
    if not reachable(RABBITMQ_URL, 5672):
        pytest.skip(f"needs a RabbitMQ server at {RABBITMQ_URL} (PERDURE_TEST_RABBITMQ); "
                    "./dev test starts one if installed (rabbitmq-server -detached)")
    return RABBITMQ_URL


def need_nats() -> str:
    """The NATS URL, or skip (failing under CI) when no server answers."""
    pytest.importorskip("nats", reason="needs nats-py: pip install -e '.[nats]'")
    if not reachable(NATS_URL, 4222):
        pytest.skip(f"needs a NATS server with JetStream at {NATS_URL} (PERDURE_TEST_NATS); "
                    "./dev test starts one if installed (nats-server -js)")
    return NATS_URL


def unique(prefix: str) -> str:
    """A name no other test (or run) uses."""
    return f"{prefix}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def wait_until(what: str, check: Callable[[], bool], timeout: float = 20.0,
               poll: float = 0.02) -> None:
    """Poll ``check`` until true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(poll)


def said(caplog: pytest.LogCaptureFixture) -> str:
    """What the triggers logged (records of other loggers left out: the brokers' clients
    keep objects in theirs that do not always print)."""
    return "\n".join(r.getMessage() for r in caplog.records if r.name == "perdure.triggers")


def job_ids(app: perdure.App, agent: str = "job") -> list[str]:
    """The ids of the objects of ``agent`` in the store, sorted."""
    return sorted(info.object_id for info in app.list(agent=agent, limit=100_000))


class Proxy:
    """A TCP proxy between a client and a server, on threads: ``url`` is the server's
    URL pointed at the proxy; ``cut()`` closes every connection through it now (the
    client sees its broker connection drop), while new connections go through."""

    def __init__(self, target: str, default_port: int) -> None:
        parts = urlsplit(target)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or default_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        port = self._listener.getsockname()[1]
        userinfo = f"{parts.username}:{parts.password}@" if parts.username else ""
        self.url = f"{parts.scheme}://{userinfo}127.0.0.1:{port}{parts.path}"
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self.cuts = 0
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self._upstream, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._open += [client, server]
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """Drop every connection through the proxy, at once."""
        self.cuts += 1
        self._drop()

    def _drop(self) -> None:
        with self._lock:
            socks, self._open = self._open, []
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    def close(self) -> None:
        """Stop accepting and drop every connection."""
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()
        self._drop()


@contextlib.contextmanager
def running(triggers: Triggers, app: perdure.App, **options: Any) -> Iterator[None]:
    """Run ``triggers`` (all, or ``names=...``) in a thread of their own for the ``with``
    block; then stop them (draining) and raise what they raised."""
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    failure: list[BaseException] = []

    def main() -> None:
        try:
            loop.run_until_complete(triggers.run(stop, app=app, **options))
        except BaseException as exc:  # the test raises it
            failure.append(exc)
        finally:
            loop.close()

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    try:
        yield
    finally:
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=30)
        assert not thread.is_alive(), "the triggers did not stop"
    if failure:
        raise failure[0]
