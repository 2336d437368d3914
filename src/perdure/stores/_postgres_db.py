"""The PostgreSQL database under a store: its pool, each event loop's own connection,
migrations, and the driver's errors translated into ``StoreError``.

Imported by ``perdure.stores.postgres`` once psycopg is known to be installed.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import re
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import ConnectionPool, PoolTimeout

from perdure.errors import (
    LeaseLostError,
    ObjectNotFoundError,
    ObjectTerminatedError,
    RecordDecodeError,
    StoreError,
)
from perdure.stores._rows import object_row
from perdure.stores._sql import load_migrations, load_queries
from perdure.stores.base import ObjectRow

__all__ = ["PostgresDatabase", "Q", "object_of", "translate", "where"]

Q = {name: sql.encode() for name, sql in load_queries("postgres").items()}
_MIGRATION_LOCK = 0x70657264  # "perd": advisory lock serialising schema changes


def object_of(cur: psycopg.Cursor[Any], row: tuple[Any, ...]) -> ObjectRow:
    """An ``objects`` row read through ``cur`` as an ``ObjectRow``."""
    assert cur.description is not None
    return object_row({col.name: value for col, value in zip(cur.description, row, strict=True)},
                      tuple)


def where(conninfo: str) -> str:
    """``PostgreSQL at HOST:PORT/DB``: how errors name the database (no user, no password)."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        return "PostgreSQL"
    host = params.get("host", "localhost")
    port = params.get("port", "5432")
    db = params.get("dbname", "")
    return f"PostgreSQL at {host}:{port}/{db}"


_MISSING_DATABASE = re.compile(r'database "([^"]+)" does not exist')


def translate(exc: BaseException, where: str) -> StoreError:
    """Turn a driver error into a perdure error that says what to do."""
    if isinstance(exc, PoolTimeout):
        return StoreError(
            f"{where} is unreachable (no connection within the pool timeout: {exc}); "
            "check that the server runs and accepts connections; workers retry by themselves"
        )
    if isinstance(exc, pg_errors.DiskFull):
        return StoreError(f"{where}: the disk is full ({exc}); nothing was written")
    if isinstance(exc, psycopg.OperationalError):
        missing = _MISSING_DATABASE.search(str(exc))
        if missing:  # retrying will not help: someone has to create it
            return StoreError(
                f"{where}: the database {missing.group(1)!r} does not exist; create it "
                f"(createdb {missing.group(1)}, or CREATE DATABASE in psql) and run again")
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return StoreError(
            f"{where} is unavailable ({first}); check the server and the URL; "
            "workers retry by themselves"
        )
    return StoreError(f"{where}: {type(exc).__name__}: {exc}")


class PostgresDatabase:
    """Connections to one PostgreSQL database: a pool for the threads, and one
    asynchronous connection per event loop that commits through it.

    ``pool_size`` bounds this process's pooled connections; ``connect_timeout`` is how
    long a call waits for a connection before it fails with ``StoreError``.
    """

    def __init__(self, conninfo: str, *, pool_size: int, connect_timeout: float,
                 idle_tx_timeout: float) -> None:
        self.conninfo = conninfo
        self._where = where(conninfo)
        self._connect_timeout = connect_timeout
        self._idle_tx_ms = int(idle_tx_timeout * 1000)
        # apply_async: one asynchronous connection per event loop that commits through it
        self._aconns: dict[asyncio.AbstractEventLoop, psycopg.AsyncConnection[Any]] = {}
        try:  # one direct attempt first: a wrong URL fails at once with the server's reason
            with psycopg.connect(conninfo, connect_timeout=max(1, int(connect_timeout))):
                pass
        except psycopg.Error as exc:
            raise translate(exc, self._where) from exc
        self._pool = ConnectionPool(
            conninfo,
            min_size=1,
            max_size=max(2, pool_size),
            timeout=connect_timeout,
            kwargs={"connect_timeout": max(1, int(connect_timeout)), "autocommit": True},
            open=False,
            name="perdure",
            reconnect_timeout=0,
            configure=self._configure,
        )
        try:
            self._pool.open(wait=True, timeout=connect_timeout)
        except (PoolTimeout, psycopg.Error) as exc:
            self._pool.close()
            raise self._why_unreachable(exc) from exc
        self._migrate()

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        """Per connection: a node frozen mid-transaction (SIGSTOP, VM pause) must not hold
        row locks forever; the server ends such a session after ``idle_tx_timeout``."""
        if self._idle_tx_ms > 0:
            conn.execute(Q["idle_tx_timeout"], (str(self._idle_tx_ms),))
            conn.commit()

    def _why_unreachable(self, exc: BaseException) -> StoreError:
        """The server's own reason (no such database, refused, bad password) if it gives one."""
        try:
            with psycopg.connect(self.conninfo, connect_timeout=max(1, int(self._connect_timeout))):
                pass
        except psycopg.Error as direct:
            return translate(direct, self._where)
        return translate(exc, self._where)

    @contextlib.contextmanager
    def _single(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection for one statement, its own transaction (one round trip)."""
        with self._tx(transaction=False) as conn:
            yield conn

    @contextlib.contextmanager
    def _tx(self, *, transaction: bool = True) -> Iterator[psycopg.Connection[Any]]:
        try:
            with self._pool.connection() as conn:
                if transaction:
                    with conn.transaction():
                        yield conn
                else:
                    yield conn
        except (LeaseLostError, ObjectNotFoundError,
                ObjectTerminatedError, RecordDecodeError):
            raise
        except (psycopg.Error, PoolTimeout) as exc:
            if isinstance(exc, psycopg.OperationalError | PoolTimeout):
                # The server may have restarted: drop every broken idle connection now
                # rather than failing once per pooled connection.
                with contextlib.suppress(Exception):
                    self._pool.check()
            raise translate(exc, self._where) from exc

    def _migrate(self) -> None:
        migrations = load_migrations("postgres")
        with self._tx() as conn:
            conn.execute(Q["migration_lock"], (_MIGRATION_LOCK,))
            conn.execute(Q["create_migrations_table"])
            done = {row[0] for row in conn.execute(Q["applied_migrations"])}
            for version, name, script in migrations:
                if version in done:
                    continue
                conn.execute(script.encode())
                conn.execute(Q["note_migration"], (version, name))

    async def _async_conn(self, loop: asyncio.AbstractEventLoop
                          ) -> psycopg.AsyncConnection[Any]:
        """The asynchronous connection of ``loop`` (the running loop), opened if need be."""
        conn = self._aconns.get(loop)
        if conn is None or conn.closed:
            conn = await psycopg.AsyncConnection.connect(
                self.conninfo, autocommit=True,
                connect_timeout=max(1, int(self._connect_timeout)))
            if self._idle_tx_ms > 0:
                try:
                    await conn.execute(Q["idle_tx_timeout"], (str(self._idle_tx_ms),))
                except BaseException:
                    await conn.close()  # not kept: it would be left open
                    raise
            old = self._aconns.get(loop)
            if old is not None and not old.closed:  # opened meanwhile by another task
                await conn.close()
                return old
            self._aconns[loop] = conn
        return conn

    async def _drop_async_conn(self, loop: asyncio.AbstractEventLoop) -> None:
        """Close and forget ``loop``'s asynchronous connection (broken, or done with)."""
        conn = self._aconns.pop(loop, None)
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    def close(self) -> None:
        """Close the pool, and any loop's asynchronous connection left open."""
        for conn in builtins.list(self._aconns.values()):
            with contextlib.suppress(Exception):
                conn.pgconn.finish()
        self._aconns.clear()
        self._pool.close()
