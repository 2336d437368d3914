"""The SQLite file under a store: connections, transactions, migrations, driver errors.

Writes take ``BEGIN IMMEDIATE`` so that concurrent processes queue on SQLite's lock
instead of failing. Every ``sqlite3`` error is translated here into a ``StoreError``
that says what to do, and text a damaged file holds that is not UTF-8 is read with
the damage marked rather than failing the read.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from perdure.errors import StoreCorruptError, StoreError
from perdure.stores._rows import object_row
from perdure.stores._sql import load_migrations, load_queries
from perdure.stores.base import ObjectRow

__all__ = ["Busy", "Q", "SQLiteFile", "bad_text", "damaged_row", "object_of", "text"]

T = TypeVar("T")

Q = load_queries("sqlite")
_BEGIN, _COMMIT, _ROLLBACK = Q["begin"], Q["commit"], Q["rollback"]

# What the driver raises: its own errors, and UnicodeDecodeError when SQLite reports an
# error whose text (quoting a damaged schema) is not UTF-8.
_DRIVER_ERRORS = (sqlite3.Error, UnicodeDecodeError)

_DAMAGED = ("Restore the file from a backup, or check it with "
            "`sqlite3 FILE 'PRAGMA integrity_check'`")


def translate(exc: sqlite3.Error | UnicodeDecodeError, path: str) -> StoreError:
    """Turn a driver error into a perdure error that says what to do."""
    if isinstance(exc, UnicodeDecodeError):
        return StoreCorruptError(
            f"SQLite store {path} is damaged: text in its schema is not valid UTF-8 ({exc}); "
            f"nothing was resumed from it. {_DAMAGED}"
        )
    text = str(exc)
    low = text.lower()
    if "malformed" in low or "not a database" in low or "file is not a database" in low:
        return StoreCorruptError(
            f"SQLite store {path} is damaged ({text}); nothing was resumed from it. {_DAMAGED}"
        )
    if "full" in low:
        return StoreError(
            f"SQLite store {path}: the disk is full ({text}); nothing was written. Free space "
            "and the workers carry on"
        )
    if "locked" in low or "busy" in low:
        return StoreError(
            f"SQLite store {path} stayed locked past the busy timeout ({text}); "
            "another process holds a long write. Retry, or raise busy_timeout in the store URL"
        )
    if "unable to open" in low or "readonly" in low or "read-only" in low:
        return StoreError(
            f"SQLite store {path} cannot be opened for writing ({text}); check the path "
            "and its permissions"
        )
    return StoreError(f"SQLite store {path}: {text}")


def object_of(cur: sqlite3.Cursor, row: tuple[Any, ...]) -> ObjectRow:
    """An ``objects`` row read through ``cur`` as an ``ObjectRow``."""
    return object_row({col[0]: value for col, value in zip(cur.description, row, strict=True)},
                      json.loads)


_TEXT_OF_OBJECTS = frozenset(("object_id", "agent", "agent_version", "status", "phase",
                              "lease_owner", "waiting_event", "note", "parent_id", "requires",
                              "avoid"))


def bad_text(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite's refusal to read a TEXT value that is not UTF-8."""
    cause = exc.__cause__ if isinstance(exc, StoreError) else exc
    return (isinstance(cause, sqlite3.OperationalError)
            and "could not decode to utf-8" in str(cause).lower())


def text(value: Any) -> Any:
    """A TEXT value read as bytes, decoded with damage marked (U+FFFD)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def damaged_row(columns: Sequence[str], row: tuple[Any, ...]) -> ObjectRow:
    """An object row whose text columns were read as bytes (one is not UTF-8)."""
    data = {name: text(value) if name in _TEXT_OF_OBJECTS else value
            for name, value in zip(columns, row, strict=True)}
    return object_row(data, json.loads)


@functools.cache
def _expected_columns() -> dict[str, tuple[str, ...]]:
    """Each table's columns, in order, as applying every migration gives them."""
    conn = sqlite3.connect(":memory:")
    try:
        for _version, _name, script in load_migrations("sqlite"):
            for statement in script.split(";"):
                if statement.strip():
                    conn.execute(statement)
        tables = [row[0] for row in conn.execute(Q["table_names"])]
        return {table: tuple(row[1] for row in conn.execute(Q["table_columns"], (table,)))
                for table in tables}
    finally:
        conn.close()


class Busy(Exception):  # noqa: N818 - internal control flow
    """The write lock is taken and the caller asked not to wait for it."""


class SQLiteFile:
    """Connections to one SQLite file (WAL mode), its transactions and its migrations.

    Three connections: one to read, one to write that waits out the busy timeout, and
    one to write that never waits (``_write(wait=False)``), each behind a lock of this
    process (a connection serves one thread at a time).
    """

    def __init__(self, path: str | os.PathLike[str], *, synchronous: str,
                 busy_timeout: float) -> None:
        self.path = str(path)
        if synchronous.lower() not in ("full", "normal", "off", "extra"):
            raise StoreError(f"synchronous must be full, normal, extra or off, not {synchronous!r}")
        self._synchronous = synchronous.upper()
        self._busy_timeout = busy_timeout
        parent = Path(self.path).parent
        if not parent.exists():
            raise StoreError(
                f"SQLite store {self.path}: folder {parent} does not exist; create it first"
            )
        self._wlock = threading.Lock()
        self._rlock = threading.Lock()
        self._w = self._connect()
        self._w_now = self._connect(busy_timeout=0.0)  # apply_now: never waits for the lock
        self._r = self._connect()
        self._opening(self._migrate)

    def _connect(self, busy_timeout: float | None = None) -> sqlite3.Connection:
        timeout = self._busy_timeout if busy_timeout is None else busy_timeout
        return self._opening(lambda: self._open_connection(timeout))

    def _open_connection(self, timeout: float) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path,
            timeout=timeout,
            isolation_level=None,
            check_same_thread=False,
        )
        try:
            conn.execute(Q["journal_mode_wal"])
            conn.execute(Q["synchronous"].format(level=self._synchronous))
            conn.execute(Q["foreign_keys_on"])
        except BaseException:
            conn.close()
            raise
        return conn

    def _opening(self, step: Callable[[], T]) -> T:
        """Run a step of opening the store, retrying transient lock errors.

        While another process opens or closes the same file, SQLite can report the
        database as locked without waiting on the busy timeout (switching to WAL,
        or the last connection resetting the WAL as it closes). Those moments are
        brief: retry them until the busy timeout, then fail with ``StoreError``.
        """
        deadline = time.monotonic() + self._busy_timeout
        delay = 0.005
        while True:
            try:
                return step()
            except (*_DRIVER_ERRORS, StoreError) as exc:
                cause = exc.__cause__ if isinstance(exc, StoreError) else exc
                transient = isinstance(cause, sqlite3.OperationalError) and any(
                    word in str(cause).lower() for word in ("locked", "busy"))
                if not transient or time.monotonic() > deadline:
                    if isinstance(exc, StoreError):
                        raise
                    raise translate(exc, self.path) from exc
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    @contextlib.contextmanager
    def _write(self, *, wait: bool = True) -> Iterator[sqlite3.Connection]:
        """A write transaction; with ``wait=False`` it raises ``Busy`` instead of waiting
        for another thread of this process or another process to finish writing."""
        if not self._wlock.acquire(blocking=wait):
            raise Busy
        try:
            conn = self._w if wait else self._w_now
            try:
                conn.execute(_BEGIN)
            except _DRIVER_ERRORS as exc:
                if not wait and isinstance(exc, sqlite3.OperationalError) and any(
                        word in str(exc).lower() for word in ("locked", "busy")):
                    raise Busy from exc
                raise translate(exc, self.path) from exc
            try:
                yield conn
                conn.execute(_COMMIT)
            except BaseException as exc:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute(_ROLLBACK)
                if isinstance(exc, _DRIVER_ERRORS):
                    raise translate(exc, self.path) from exc
                raise
        finally:
            self._wlock.release()

    @contextlib.contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with self._rlock:
            try:
                yield self._r
            except _DRIVER_ERRORS as exc:
                raise translate(exc, self.path) from exc

    def _migrate(self) -> None:
        migrations = load_migrations("sqlite")
        with self._read() as conn:
            current = conn.execute(Q["user_version"]).fetchone()[0]
        if current >= migrations[-1][0]:
            if current == migrations[-1][0]:
                self._check_schema()
            return
        with self._write() as conn:
            current = conn.execute(Q["user_version"]).fetchone()[0]
            for version, _name, script in migrations:
                if version <= current:
                    continue
                for statement in script.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(Q["set_user_version"].format(version=int(version)))

    def _check_schema(self) -> None:
        """Every table has the columns the migrations give it: a damaged schema (a byte
        changed in a column's name, say) is ``StoreCorruptError`` now, not a puzzling
        "no such column" later."""
        with self._read() as conn:
            for table, columns in _expected_columns().items():
                try:
                    found = tuple(row[1] for row in conn.execute(Q["table_columns"], (table,)))
                except sqlite3.OperationalError as exc:
                    if not bad_text(exc):
                        raise
                    raise StoreCorruptError(
                        f"SQLite store {self.path} is damaged: the schema of table {table!r} "
                        f"holds text that is not UTF-8; nothing was resumed from it. {_DAMAGED}"
                    ) from exc
                if found != columns:
                    missing = [c for c in columns if c not in found] or ["(order)"]
                    raise StoreCorruptError(
                        f"SQLite store {self.path} is damaged: table {table!r} lacks "
                        f"column(s) {', '.join(missing)} its schema must have; nothing was "
                        f"resumed from it. {_DAMAGED}")

    def check_damage(self) -> None:
        """Read every page of the file and check its structure (``PRAGMA quick_check``):
        ``StoreCorruptError`` naming the file and what SQLite found when a page is damaged,
        so a worker says so before it claims anything rather than when a run first reads
        the page. Takes about as long as reading the file once."""
        with self._read() as conn:
            found = [str(row[0]) for row in conn.execute(Q["quick_check"]).fetchall()]
        if found != ["ok"]:
            raise StoreCorruptError(
                f"SQLite store {self.path} is damaged ({'; '.join(found)[:300]}); nothing "
                f"was resumed from it. {_DAMAGED}")

    def close(self) -> None:
        """Close every connection."""
        with self._wlock, self._rlock:
            self._w.close()
            self._w_now.close()
            self._r.close()

    def _rows(self, sql: str, params: Sequence[Any] | dict[str, Any], *,
              text_at: tuple[int, ...]) -> builtins.list[tuple[Any, ...]]:
        """All rows of a read; where a TEXT value is not UTF-8 (damage), the columns at
        ``text_at`` are read with the damage marked (U+FFFD) instead of failing the read."""
        try:
            with self._read() as conn:
                return conn.execute(sql, params).fetchall()
        except StoreError as exc:
            if not bad_text(exc):
                raise
        _, rows = self._as_bytes(sql, params)
        return [tuple(text(v) if at in text_at else v for at, v in enumerate(row))
                for row in rows]

    def _as_bytes(self, sql: str, params: Sequence[Any] | dict[str, Any]
                  ) -> tuple[builtins.list[str], builtins.list[tuple[Any, ...]]]:
        """Run a read with TEXT columns returned as bytes: the way to read rows holding
        text that is not UTF-8 (damage) and say which."""
        with self._read() as conn:
            conn.text_factory = bytes
            try:
                cur = conn.execute(sql, params)
                return [col[0] for col in cur.description], cur.fetchall()
            finally:
                conn.text_factory = str
