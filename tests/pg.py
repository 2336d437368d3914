"""Real PostgreSQL databases for tests: one template per session, one clone per test.

The server comes from ``PERDURE_TEST_PG`` (an admin URL, default
``postgresql://postgres@127.0.0.1:5432/postgres``). Backends under test come from
``PERDURE_TEST_BACKENDS`` (default ``sqlite,postgresql``). A template database with
the schema migrated is created once per session; each test gets
``CREATE DATABASE ... TEMPLATE`` of it (fast) and it is dropped afterwards.

Under pytest-xdist every worker process is its own session: it makes its own template
and clones only from that one (PostgreSQL refuses to clone a template another session is
connected to), and every name carries the worker id (``PYTEST_XDIST_WORKER``), the pid
and a random part, so parallel workers, and parallel runs on one server, never share a
database.

Cloning waits on the server's disk (a checkpoint) for a few tenths of a second, so one
background thread per process keeps a couple of clones ready ahead of the tests that ask
for them, and drops a test's database after the test instead of making it wait. Each
test still gets a database nobody else has opened, cloned from the template. ``close``
(called from ``tests/conftest.py`` when the session ends) drops the unused clones and
the template; dropping the template again when the process exits is the fallback.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import subprocess
import threading
import uuid
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

ADMIN_URL = os.environ.get("PERDURE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
BACKENDS = [
    name.strip()
    for name in os.environ.get("PERDURE_TEST_BACKENDS", "sqlite,postgresql").split(",")
    if name.strip()
]

#: The one reason a test that needs a PostgreSQL server gives when the run leaves the
#: backend out (``tests/skips.py`` expects it then, and only then).
NO_SERVER = "needs a PostgreSQL server: PERDURE_TEST_BACKENDS leaves out postgresql"

#: Mark a test that needs the server at ``ADMIN_URL`` whatever its own backend is (a
#: ``PostgresSession`` resource, a migration target): skipped, saying so, without it.
needs_server = pytest.mark.skipif("postgresql" not in BACKENDS, reason=NO_SERVER)


def pg_bin() -> Path | None:
    """The folder holding PostgreSQL's server programs (``initdb``, ``pg_ctl``), or ``None``.

    ``PERDURE_TEST_PG_BIN`` when set; else what ``pg_config --bindir`` names, if it holds
    ``initdb`` (on Debian it names the client's folder, which does not); else the newest
    ``/usr/lib/postgresql/*/bin`` holding ``initdb`` (Debian's layout, any version).
    """
    chosen = os.environ.get("PERDURE_TEST_PG_BIN")
    if chosen:
        return Path(chosen)
    config = shutil.which("pg_config")
    if config is not None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            found = subprocess.run([config, "--bindir"], capture_output=True, text=True,
                                   timeout=10, check=True).stdout.strip()
            if found and (Path(found) / "initdb").exists():
                return Path(found)
    versions = [p.parent for p in Path("/usr/lib/postgresql").glob("*/bin/initdb")]
    versions.sort(key=lambda folder: _version_key(folder.parent.name))
    return versions[-1] if versions else None


def _version_key(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in name.split(".") if part.isdigit())

_lock = threading.Lock()
_template: str | None = None


def _worker_tag() -> str:
    """``gw0``, ``gw1``, ... under pytest-xdist; ``main`` in a serial run."""
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


def url_for(database: str) -> str:
    """The admin URL pointed at ``database``."""
    parts = urlsplit(ADMIN_URL)
    return urlunsplit(parts._replace(path=f"/{database}"))


def _admin(sql: str) -> None:
    import psycopg

    with psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=5) as conn:
        conn.execute(sql.encode())


_strategy: str | None = None


def _copy_strategy() -> str:
    """`` STRATEGY FILE_COPY`` on PostgreSQL 15 and later, where the default (WAL_LOG)
    takes about three times as long to clone a small database; nothing before 15."""
    global _strategy
    if _strategy is None:
        import psycopg

        with psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=5) as conn:
            version = conn.info.server_version
        _strategy = " STRATEGY FILE_COPY" if version >= 150000 else ""
    return _strategy


def template() -> str:
    """Create (once per process) a database holding the current schema; return its name."""
    global _template
    with _lock:
        if _template is None:
            from perdure.stores.postgres import PostgresStore

            name = f"perdure_tpl_{_worker_tag()}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
            try:
                _admin(f'CREATE DATABASE "{name}"')
            except Exception as exc:  # the server is required when the backend is selected
                raise RuntimeError(
                    f"PostgreSQL at {ADMIN_URL} is needed for the postgresql backend ({exc}); "
                    "start it or set PERDURE_TEST_BACKENDS=sqlite"
                ) from exc
            store = PostgresStore(url_for(name))
            store.close()
            _template = name
            atexit.register(_drop, name)
        return _template


def _drop(name: str) -> None:
    with contextlib.suppress(Exception):
        _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _new_name() -> str:
    return f"perdure_t_{_worker_tag()}_{os.getpid()}_{uuid.uuid4().hex[:12]}"


def _clone() -> str:
    """A new database cloned from the template; its name."""
    name = _new_name()
    _admin(f'CREATE DATABASE "{name}" TEMPLATE "{template()}"{_copy_strategy()}')
    return name


class _Clones:
    """Clones of the template made ahead of need, and drops, in one background thread.

    One thread does every clone and every drop in the order asked, so clones never race
    each other on the template. ``take`` hands out the oldest clone made ahead (waiting
    for it if it is not ready yet) and asks for another; nothing is made ahead until the
    first test asks for a migrated database.
    """

    AHEAD = 2

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread: ThreadPoolExecutor | None = None
        self._ahead: deque[Future[str]] = deque()

    def take(self) -> str:
        """The name of a fresh clone of the template, private to the caller."""
        with self._lock:
            if self._thread is None:
                template()  # no server: the error surfaces here, in the test that asked
                self._thread = ThreadPoolExecutor(1, thread_name_prefix="perdure-test-pg")
            while len(self._ahead) <= self.AHEAD:
                self._ahead.append(self._thread.submit(_clone))
            ready = self._ahead.popleft()
        return ready.result()

    def drop(self, name: str) -> None:
        """Drop ``name`` in the background (at once when no thread runs)."""
        with self._lock:
            if self._thread is not None:
                self._thread.submit(_drop, name)
                return
        _drop(name)

    def close(self) -> None:
        """Drop the clones made ahead, and wait for every pending drop."""
        with self._lock:
            thread, self._thread = self._thread, None
            ahead = list(self._ahead)
            self._ahead.clear()
        for ready in ahead:
            with contextlib.suppress(Exception):
                _drop(ready.result())
        if thread is not None:
            thread.shutdown(wait=True)


_clones = _Clones()


def close() -> None:
    """Drop this process's unused clones and its template (at the end of the session)."""
    global _template
    _clones.close()
    with _lock:
        if _template is not None:
            _drop(_template)
            _template = None


@contextlib.contextmanager
def fresh_database(*, migrated: bool = True) -> Iterator[str]:
    """A new, private database (cloned from the template when ``migrated``); its URL."""
    if migrated:
        name = _clones.take()
    else:
        name = _new_name()
        _admin(f'CREATE DATABASE "{name}"')
    try:
        yield url_for(name)
    finally:
        _clones.drop(name)
