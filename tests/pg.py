"""Real PostgreSQL databases for tests: one template per session, one clone per test.

The server comes from ``PERDURE_TEST_PG`` (an admin URL, default
``postgresql://postgres@127.0.0.1:5432/postgres``). Backends under test come from
``PERDURE_TEST_BACKENDS`` (default ``sqlite,postgresql``). A template database with
the schema migrated is created once per session; each test gets
``CREATE DATABASE ... TEMPLATE`` of it (fast) and it is dropped afterwards.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

ADMIN_URL = os.environ.get("PERDURE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
BACKENDS = [
    name.strip()
    for name in os.environ.get("PERDURE_TEST_BACKENDS", "sqlite,postgresql").split(",")
    if name.strip()
]

_lock = threading.Lock()
_template: str | None = None


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

            name = f"perdure_tpl_{os.getpid()}_{uuid.uuid4().hex[:6]}"
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


@contextlib.contextmanager
def fresh_database(*, migrated: bool = True) -> Iterator[str]:
    """A new, private database (cloned from the template when ``migrated``); its URL."""
    name = f"perdure_t_{uuid.uuid4().hex[:12]}"
    if migrated:
        _admin(f'CREATE DATABASE "{name}" TEMPLATE "{template()}"{_copy_strategy()}')
    else:
        _admin(f'CREATE DATABASE "{name}"')
    try:
        yield url_for(name)
    finally:
        _drop(name)
