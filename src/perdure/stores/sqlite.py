"""SQLite store: one file shared by any number of worker processes (WAL mode).

Writes take ``BEGIN IMMEDIATE`` so that concurrent processes queue on SQLite's
lock instead of failing. Many appends are applied in one transaction (group
commit); each runs inside its own savepoint so a refused append (lost lease)
does not undo the others. Every ``sqlite3`` error is translated here.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from perdure._gc import gc_paused
from perdure.core.chain import CommitSeal, chain_from_rows
from perdure.core.records import GENESIS_HASH, Record
from perdure.errors import (
    CancelRequestedError,
    LeaseLostError,
    NodeIdentityError,
    ObjectNotFoundError,
    ObjectTerminatedError,
    StoreCorruptError,
    StoreError,
)
from perdure.stores._rows import (
    append_params,
    checked_chain,
    claim_from_row,
    create_params,
    notices_cancel,
    object_row,
    record_from_row,
    record_params,
    seal_from_row,
    seal_params,
)
from perdure.stores._sql import load_migrations, load_queries
from perdure.stores.base import Append, Claim, Event, NewObject, NodeInfo, ObjectRow, Route

__all__ = ["SQLiteStore"]

log = logging.getLogger("perdure.store")

T = TypeVar("T")

_Q = load_queries("sqlite")
_TERMINAL = ("completed", "failed", "cancelled")


# What the driver raises: its own errors, and UnicodeDecodeError when SQLite reports an
# error whose text (quoting a damaged schema) is not UTF-8.
_DRIVER_ERRORS = (sqlite3.Error, UnicodeDecodeError)


def _translate(exc: sqlite3.Error | UnicodeDecodeError, path: str) -> StoreError:
    """Turn a driver error into a perdure error that says what to do."""
    if isinstance(exc, UnicodeDecodeError):
        return StoreCorruptError(
            f"SQLite store {path} is damaged: text in its schema is not valid UTF-8 ({exc}); "
            "nothing was resumed from it. Restore the file from a backup, or check it with "
            "`sqlite3 FILE 'PRAGMA integrity_check'`"
        )
    text = str(exc)
    low = text.lower()
    if "malformed" in low or "not a database" in low or "file is not a database" in low:
        return StoreCorruptError(
            f"SQLite store {path} is damaged ({text}); nothing was resumed from it. "
            "Restore the file from a backup, or check it with "
            "`sqlite3 FILE 'PRAGMA integrity_check'`"
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


def _row(cur: sqlite3.Cursor, row: tuple[Any, ...]) -> ObjectRow:
    return object_row({col[0]: value for col, value in zip(cur.description, row, strict=True)},
                      json.loads)


_TEXT_OF_OBJECTS = frozenset(("object_id", "agent", "agent_version", "status", "phase",
                              "lease_owner", "waiting_event", "note", "parent_id", "requires",
                              "avoid"))


def _bad_text(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite's refusal to read a TEXT value that is not UTF-8."""
    cause = exc.__cause__ if isinstance(exc, StoreError) else exc
    return (isinstance(cause, sqlite3.OperationalError)
            and "could not decode to utf-8" in str(cause).lower())


def _text(value: Any) -> Any:
    """A TEXT value read as bytes, decoded with damage marked (U+FFFD)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _damaged_row(columns: Sequence[str], row: tuple[Any, ...]) -> ObjectRow:
    """An object row whose text columns were read as bytes (one is not UTF-8)."""
    data = {name: _text(value) if name in _TEXT_OF_OBJECTS else value
            for name, value in zip(columns, row, strict=True)}
    return object_row(data, json.loads)


def _is_step_append(op: Append) -> bool:
    """Whether ``op`` only adds records while the node keeps running the object.

    Such an append changes nothing in the row but the head when the row already says
    running, in this phase, ready at this time, waiting for nothing: it is tried with the
    narrower ``append_step`` statement first, which leaves the indexed columns (and their
    index pages) alone. PostgreSQL needs no such split: an update that leaves indexed
    values as they were can be a heap-only (HOT) update there.
    """
    return (bool(op.records) and op.status == "running" and not op.release
            and op.waiting_event is None and op.result is None and not op.consume_event_ids
            and not op.parked and op.note is None and op.signal is None and op.requires is None
            and op.avoid_node is None and not op.clear_avoid and not op.cancel_children)


_ROWS_PER_STATEMENT = 200  # rows of one grouped statement (8 or 11 parameters each)


@functools.cache
def _grouped(name: str, rows: int) -> str:
    """Query ``name`` for ``rows`` rows: its ``{rows}`` as that many parameter tuples."""
    width = 11 if name == "insert_records" else 8
    row = "(" + ",".join("?" * width) + ")"
    return _Q[name].format(rows=",".join([row] * rows))


def _chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for at in range(0, len(items), size):
        yield items[at:at + size]


def _cancel_pending(op: Append) -> CancelRequestedError:
    """The outcome of an append written while a cancel is pending for its object."""
    return CancelRequestedError(f"object {op.object_id!r}: a cancel was requested")


@functools.cache
def _expected_columns() -> dict[str, tuple[str, ...]]:
    """Each table's columns, in order, as applying every migration gives them."""
    conn = sqlite3.connect(":memory:")
    try:
        for _version, _name, text in load_migrations("sqlite"):
            for statement in text.split(";"):
                if statement.strip():
                    conn.execute(statement)
        tables = [row[0] for row in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")]
        return {table: tuple(row[1] for row in conn.execute(f"PRAGMA table_info('{table}')"))
                for table in tables}
    finally:
        conn.close()


def _ids(conn: sqlite3.Connection, params: dict[str, Any]) -> builtins.list[str]:
    """The claim candidates' ids; an id that is not UTF-8 (damage) is left out."""
    try:
        return [row[0] for row in conn.execute(_Q["claim_candidates"], params)]
    except sqlite3.OperationalError as exc:
        if not _bad_text(exc):
            raise
    conn.text_factory = bytes
    try:
        raw = [row[0] for row in conn.execute(_Q["claim_candidates"], params)]
    finally:
        conn.text_factory = str
    ids = []
    for value in raw:
        try:
            ids.append(value.decode("utf-8") if isinstance(value, bytes) else value)
        except UnicodeDecodeError:
            log.error("an object id in %r is not UTF-8 (damaged store); it is left alone",
                      conn, extra={"action": "damaged_id"})
    return ids


class _Busy(Exception):  # noqa: N818 - internal control flow
    """The write lock is taken and the caller asked not to wait for it."""


class _RetryWithSavepoints(Exception):  # noqa: N818 - internal control flow
    """A record insert failed after its row moved; retry the batch op by op."""


class SQLiteStore:
    """A ``Store`` on one SQLite file.

    ``synchronous`` is ``"full"`` (every commit reaches the disk before it returns)
    or ``"normal"`` (WAL commits may be lost on power failure, never corrupted).
    """

    commit_mode = "inline"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: str = "full",
        busy_timeout: float = 30.0,
        url: str | None = None,
    ) -> None:
        self.path = str(path)
        self.url = url or f"sqlite:///{self.path}"
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

    # -- connections ---------------------------------------------------------

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
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self._synchronous}")
            conn.execute("PRAGMA foreign_keys=ON")
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
                    raise _translate(exc, self.path) from exc
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    @contextlib.contextmanager
    def _write(self, *, wait: bool = True) -> Iterator[sqlite3.Connection]:
        """A write transaction; with ``wait=False`` it raises ``_Busy`` instead of waiting
        for another thread of this process or another process to finish writing."""
        if not self._wlock.acquire(blocking=wait):
            raise _Busy
        try:
            conn = self._w if wait else self._w_now
            try:
                conn.execute("BEGIN IMMEDIATE")
            except _DRIVER_ERRORS as exc:
                if not wait and isinstance(exc, sqlite3.OperationalError) and any(
                        word in str(exc).lower() for word in ("locked", "busy")):
                    raise _Busy from exc
                raise _translate(exc, self.path) from exc
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException as exc:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                if isinstance(exc, _DRIVER_ERRORS):
                    raise _translate(exc, self.path) from exc
                raise
        finally:
            self._wlock.release()

    @contextlib.contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with self._rlock:
            try:
                yield self._r
            except _DRIVER_ERRORS as exc:
                raise _translate(exc, self.path) from exc

    def _migrate(self) -> None:
        migrations = load_migrations("sqlite")
        with self._read() as conn:
            current = conn.execute("PRAGMA user_version").fetchone()[0]
        if current >= migrations[-1][0]:
            if current == migrations[-1][0]:
                self._check_schema()
            return
        with self._write() as conn:
            current = conn.execute("PRAGMA user_version").fetchone()[0]
            for version, _name, text in migrations:
                if version <= current:
                    continue
                for statement in text.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(f"PRAGMA user_version={version}")

    def _check_schema(self) -> None:
        """Every table has the columns the migrations give it: a damaged schema (a byte
        changed in a column's name, say) is ``StoreCorruptError`` now, not a puzzling
        "no such column" later."""
        with self._read() as conn:
            for table, columns in _expected_columns().items():
                try:
                    found = tuple(row[1] for row in conn.execute(
                        f"PRAGMA table_info('{table}')"))
                except sqlite3.OperationalError as exc:
                    if not _bad_text(exc):
                        raise
                    raise StoreCorruptError(
                        f"SQLite store {self.path} is damaged: the schema of table {table!r} "
                        "holds text that is not UTF-8; nothing was resumed from it. Restore "
                        "the file from a backup, or check it with `sqlite3 FILE 'PRAGMA "
                        "integrity_check'`") from exc
                if found != columns:
                    missing = [c for c in columns if c not in found] or ["(order)"]
                    raise StoreCorruptError(
                        f"SQLite store {self.path} is damaged: table {table!r} lacks "
                        f"column(s) {', '.join(missing)} its schema must have; nothing was "
                        "resumed from it. Restore the file from a backup, or check it with "
                        "`sqlite3 FILE 'PRAGMA integrity_check'`")

    def close(self) -> None:
        """Close both connections."""
        with self._wlock, self._rlock:
            self._w.close()
            self._w_now.close()
            self._r.close()

    # -- nodes -----------------------------------------------------------------

    def register_node(self, node_id: str, public_key: bytes, now: float) -> None:
        """Record a node's public key; refuse a second, different key for the same id."""
        with self._read() as conn:
            row = conn.execute(_Q["node_key"], (node_id,)).fetchone()
        if row is None:
            with self._write() as conn:
                conn.execute(_Q["register_node"], (node_id, public_key, now))
                row = conn.execute(_Q["node_key"], (node_id,)).fetchone()
        if bytes(row[0]) != public_key:
            raise NodeIdentityError(
                f"node id {node_id!r} is registered in {self.url} with a different public key; "
                "give this node another id or restore its key directory"
            )

    def publish_trust(self, item_id: str, kind: str, body: bytes, now: float) -> None:
        """Keep a trust item (certificate or revocation) under ``item_id``, once."""
        with self._write() as conn:
            conn.execute(_Q["publish_trust"], (item_id, kind, body, now))

    def trust_items(self) -> builtins.list[tuple[str, bytes]]:
        """Every trust item as ``(kind, body)``, oldest first."""
        rows = self._rows(_Q["trust_items"], (), text=(0,))
        return [(row[0], bytes(row[1])) for row in rows]

    def public_keys(self) -> dict[str, bytes]:
        """All registered node keys (a node id that is not UTF-8 reads with U+FFFD)."""
        return {row[0]: bytes(row[1]) for row in self._rows(_Q["public_keys"], (), text=(0,))}

    def _rows(self, sql: str, params: Sequence[Any] | dict[str, Any], *,
              text: tuple[int, ...]) -> builtins.list[tuple[Any, ...]]:
        """All rows of a read; where a TEXT value is not UTF-8 (damage), the columns at
        ``text`` are read with the damage marked (U+FFFD) instead of failing the read."""
        try:
            with self._read() as conn:
                return conn.execute(sql, params).fetchall()
        except StoreError as exc:
            if not _bad_text(exc):
                raise
        _, rows = self._as_bytes(sql, params)
        return [tuple(_text(v) if at in text else v for at, v in enumerate(row)) for row in rows]

    # -- objects and records ---------------------------------------------------

    def create(self, new: NewObject, now: float) -> bool:
        """Insert the object row and its first record in one transaction."""
        with self._write() as conn:
            cur = conn.execute(_Q["insert_object"], create_params(new, now, json.dumps))
            if cur.rowcount == 0:
                return False
            conn.execute(_Q["insert_record"], record_params(new.first))
            return True

    def get(self, object_id: str) -> ObjectRow | None:
        """The object's row, or ``None``. Text that is not UTF-8 (damage) reads as U+FFFD."""
        try:
            with self._read() as conn:
                cur = conn.execute(_Q["get_object"], (object_id,))
                row = cur.fetchone()
                return None if row is None else _row(cur, row)
        except StoreError as exc:
            if not _bad_text(exc):
                raise
        columns, rows = self._as_bytes(_Q["get_object"], (object_id,))
        return _damaged_row(columns, rows[0]) if rows else None

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

    def list(
        self,
        *,
        status: str | None = None,
        phase: str | None = None,
        agent: str | None = None,
        parent: str | None = None,
        limit: int = 100,
    ) -> list[ObjectRow]:
        """Rows matching the filters, newest first."""
        clauses: list[str] = []
        params: list[Any] = []
        for column, value in (("status", status), ("phase", phase), ("agent", agent),
                              ("parent_id", parent)):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        sql = f"SELECT * FROM objects {where} ORDER BY created_at DESC, object_id LIMIT ?"  # noqa: S608 - fixed column names, values bound
        try:
            with self._read() as conn:
                cur = conn.execute(sql, (*params, limit))
                return [_row(cur, row) for row in cur.fetchall()]
        except StoreError as exc:
            if not _bad_text(exc):
                raise
        columns, rows = self._as_bytes(sql, (*params, limit))
        return [_damaged_row(columns, row) for row in rows]

    def records(self, object_id: str, after_seq: int = 0) -> builtins.list[Record]:
        """Records after ``after_seq``, decoded; ``RecordDecodeError`` on damage."""
        with gc_paused():  # a long history: many new containers
            try:
                with self._read() as conn:
                    rows = conn.execute(_Q["records_after"], (object_id, after_seq)).fetchall()
            except StoreError as exc:
                if not _bad_text(exc):
                    raise
                # Text that is not UTF-8: read it as bytes, and the decoder names the column.
                _, rows = self._as_bytes(_Q["records_after"], (object_id, after_seq))
            return [record_from_row(row) for row in rows]

    def chain(self, object_id: str, after_seq: int = 0, start_hash: str = GENESIS_HASH
              ) -> builtins.list[Record]:
        """Records after ``after_seq``, links and hashes checked from ``start_hash``."""
        with gc_paused():  # a long history: many new containers
            try:
                with self._read() as conn:
                    # Decoded as the rows come: each row's leftovers are freed at once.
                    cur = conn.execute(_Q["chain_after"], (object_id, after_seq))
                    try:
                        got = chain_from_rows(object_id, cur, start_hash=start_hash,
                                              start_seq=after_seq + 1)
                    finally:
                        cur.close()
            except (sqlite3.Error, StoreError):
                got = None  # e.g. a damaged column json_array() refuses: the full read says
            return checked_chain(object_id, got, after_seq, start_hash,
                                 lambda: self.records(object_id, after_seq))

    def seals(self, digests: Sequence[bytes]) -> dict[bytes, CommitSeal]:
        """The stored commit seals among ``digests``, by digest."""
        found: dict[bytes, CommitSeal] = {}
        with self._read() as conn:
            for digest in dict.fromkeys(digests):
                row = conn.execute(_Q["seal_by_digest"], (digest,)).fetchone()
                if row is not None:
                    found[bytes(row[0])] = seal_from_row(row)
        return found

    # -- leases ----------------------------------------------------------------

    def claim(self, owner: str, now: float, lease_until: float, limit: int,
              route: Route | None = None) -> builtins.list[Claim]:
        """Lease up to ``limit`` runnable objects ``route`` can serve, oldest first."""
        if limit <= 0:
            return []
        route = route or Route()
        params = {
            "now": now,
            "limit": limit,
            "serves": None if route.serves is None else json.dumps(list(route.serves)),
            "caps": json.dumps(list(route.capabilities)),
            "node": route.node_id,
        }
        with self._read() as conn:
            candidates = _ids(conn, params)
        if not candidates:
            return []
        claims = []
        with self._write() as conn:
            # Choose again under the write lock: another node may have claimed the rows
            # read above, and this claim should still get a full batch of the others.
            for object_id in _ids(conn, params):
                row = conn.execute(
                    _Q["claim_one"],
                    {"owner": owner, "lease_until": lease_until, "now": now,
                     "object_id": object_id},
                ).fetchone()
                if row is not None:
                    claims.append(claim_from_row(row))
        return claims

    def renew(self, object_id: str, epoch: int, lease_until: float) -> Claim | None:
        """Extend the lease if still held at ``epoch``."""
        with self._write() as conn:
            row = conn.execute(
                _Q["renew"], {"lease_until": lease_until, "object_id": object_id, "epoch": epoch}
            ).fetchone()
        return None if row is None else claim_from_row(row)

    def apply(self, ops: Sequence[Append], now: float, seals: Sequence[CommitSeal] = ()
              ) -> builtins.list[BaseException | None]:
        """Apply fenced appends and store ``seals`` in one transaction (group commit).

        An append refused by its fence writes nothing, so most appends need no
        savepoint (each costs tens of µs on the commit path); one that consumes
        events or signals another object gets one. If a record insert still fails
        after its row moved, the whole batch is rolled back and retried with a
        savepoint per append, so that only the offender is refused.
        """
        try:
            return self._apply_batch(ops, now, seals, savepoints=False)
        except _RetryWithSavepoints:
            return self._apply_batch(ops, now, seals, savepoints=True)

    async def apply_async(self, ops: Sequence[Append], now: float,
                          seals: Sequence[CommitSeal] = ()
                          ) -> builtins.list[BaseException | None] | None:
        """Always ``None``: commits go through ``apply_now`` or the write thread."""
        del ops, now, seals
        return None

    async def open_async(self) -> None:
        """Nothing to open: the event loop commits on the store's own connection."""

    async def close_async(self) -> None:
        """Nothing to release: the event loop commits on the store's own connection."""

    def apply_now(self, ops: Sequence[Append], now: float, seals: Sequence[CommitSeal] = ()
                  ) -> builtins.list[BaseException | None] | None:
        """``apply`` on the calling thread, or ``None`` (nothing written) if another
        thread or process holds the write lock: this never waits on the busy timeout.

        A commit to a local file is short (a few hundred µs with its fsync on a fast
        disk), so a worker's event loop does it itself rather than hand it to the write
        thread: the hop there and back, and the GIL the write thread must win from a
        busy loop between its statements, cost more than the commit.
        """
        try:
            try:
                return self._apply_batch(ops, now, seals, savepoints=False, wait=False)
            except _RetryWithSavepoints:
                return self._apply_batch(ops, now, seals, savepoints=True, wait=False)
        except _Busy:
            return None

    def _apply_batch(self, ops: Sequence[Append], now: float, seals: Sequence[CommitSeal], *,
                     savepoints: bool, wait: bool = True) -> builtins.list[BaseException | None]:
        results: list[BaseException | None] = []
        with self._write(wait=wait) as conn:
            if seals:
                conn.executemany(_Q["insert_seal"], [seal_params(seal) for seal in seals])
            grouped = None if savepoints else self._apply_steps(conn, ops, now)
            if grouped is not None:
                return grouped
            for op in ops:
                guarded = savepoints or bool(op.consume_event_ids) or op.signal is not None
                if guarded:
                    conn.execute("SAVEPOINT op")
                try:
                    cancel = self._apply_one(conn, op, now)
                except (LeaseLostError, CancelRequestedError, sqlite3.IntegrityError) as exc:
                    if not guarded:
                        if isinstance(exc, sqlite3.IntegrityError):
                            raise _RetryWithSavepoints from exc
                        results.append(exc)  # refused by the fence: nothing was written
                        continue
                    conn.execute("ROLLBACK TO op")
                    conn.execute("RELEASE op")
                    if isinstance(exc, sqlite3.IntegrityError):
                        exc = LeaseLostError(
                            f"object {op.object_id!r}: another node appended first ({exc})"
                        )
                    results.append(exc)
                    continue
                if guarded:
                    conn.execute("RELEASE op")
                results.append(_cancel_pending(op) if cancel else None)
        return results

    def _apply_steps(self, conn: sqlite3.Connection, ops: Sequence[Append], now: float
                     ) -> builtins.list[BaseException | None] | None:
        """The common group commit, if it applies: every append is a step append of a
        distinct object. Then two statements do it all: one moves every head whose row
        still holds its fence (``append_steps``), one inserts every record. An append
        whose row did not move (its fence or its row state differs, as for the first
        append after a claim) goes on alone. Returns each append's outcome, or ``None``
        when the batch is not of that kind (nothing was written).

        Each statement gives up the GIL while SQLite works and must win it back from the
        event loop (one release per row with ``executemany``), so one statement for all
        the heads and one for all the records cost far less than two per append.
        """
        if len(ops) < 2 or not all(map(_is_step_append, ops)):
            return None
        if len({op.object_id for op in ops}) != len(ops):
            return None
        # Rows changed, from the connection's running total: ``rowcount`` is -1 for a
        # statement that opens with ``WITH`` (the module does not take it for an update).
        before = conn.total_changes
        for chunk in _chunks(ops, _ROWS_PER_STATEMENT):
            params: list[Any] = []
            for op in chunk:
                last = op.records[-1]
                params += (op.object_id, last.seq, bytes.fromhex(last.hash), op.epoch,
                           op.records[0].seq - 1, op.status, op.phase, op.ready_at)
            params.append(now)
            conn.execute(_grouped("append_steps", len(chunk)), params)
        moved = conn.total_changes - before
        left = [] if moved == len(ops) else self._unmoved(conn, ops)
        alone = {id(op) for op in left}
        records = [record_params(rec) for op in ops if id(op) not in alone
                   for rec in op.records]
        try:
            for rows in _chunks(records, _ROWS_PER_STATEMENT):
                conn.execute(_grouped("insert_records", len(rows)),
                             [value for row in rows for value in row])
        except sqlite3.IntegrityError as exc:
            raise _RetryWithSavepoints from exc
        failures: dict[int, BaseException] = {}
        for op in left:  # not moved by append_steps: append_update decides, as for one op
            try:
                if self._apply_one(conn, op, now):
                    failures[id(op)] = _cancel_pending(op)
            except LeaseLostError as exc:
                failures[id(op)] = exc
            except sqlite3.IntegrityError as exc:
                raise _RetryWithSavepoints from exc
        return [failures.get(id(op)) for op in ops]

    @staticmethod
    def _unmoved(conn: sqlite3.Connection, ops: Sequence[Append]) -> builtins.list[Append]:
        """The appends whose rows ``append_steps`` did not move to their new heads."""
        heads: dict[str, tuple[int, bytes]] = {}
        for chunk in _chunks(ops, _ROWS_PER_STATEMENT):
            sql = _Q["heads_of"].format(marks=",".join("?" * len(chunk)))
            for object_id, seq, digest in conn.execute(sql, [op.object_id for op in chunk]):
                heads[object_id] = (seq, bytes(digest))
        return [op for op in ops
                if heads.get(op.object_id) != (op.records[-1].seq,
                                               bytes.fromhex(op.records[-1].hash))]

    def _apply_one(self, conn: sqlite3.Connection, op: Append, now: float) -> bool:
        """Apply one append; whether a cancel is pending for its object (``True`` only
        where ``notices_cancel``). Raises ``LeaseLostError`` (or ``CancelRequestedError``
        for a refused completion) when it is refused."""
        last = op.records[-1] if op.records else None
        params = append_params(op, now, json.dumps)
        cancel = False
        # ``append_step`` only moves a row with no cancel pending.
        if not (_is_step_append(op) and conn.execute(_Q["append_step"], params).rowcount == 1):
            taken = conn.execute(_Q["append_update"], params).fetchall()
            if len(taken) != 1:
                if op.unless_cancelled:
                    state = conn.execute(_Q["cancel_state"], (op.object_id,)).fetchone()
                    if state is not None and state[0] == op.epoch and state[1]:
                        raise CancelRequestedError(
                            f"object {op.object_id!r}: a cancel was requested; the "
                            "completion was not written")
                raise LeaseLostError(
                    f"object {op.object_id!r}: epoch {op.epoch} no longer holds the lease "
                    "(another node took it over); this node stops touching it"
                )
            cancel = bool(taken[0][0]) and notices_cancel(op)
        conn.executemany(_Q["insert_record"], [record_params(rec) for rec in op.records])
        for event_id in op.consume_event_ids:
            assert last is not None, "consuming an event needs the record that receives it"
            cur = conn.execute(_Q["consume_event"], (last.seq, event_id, op.object_id))
            if cur.rowcount != 1:
                raise LeaseLostError(
                    f"object {op.object_id!r}: event {event_id} was consumed by another node"
                )
        if op.signal is not None:
            sig = op.signal
            conn.execute(_Q["insert_event"],
                         (sig.object_id, sig.name, sig.payload, sig.dedupe_key, now, sig.seal))
            conn.execute(_Q["wake_for_event"],
                         {"now": now, "object_id": sig.object_id, "name": sig.name})
        if op.cancel_children:
            conn.execute(_Q["cancel_children"],
                         {"now": now, "object_id": op.object_id})
        return cancel

    # -- inbox and control -----------------------------------------------------

    def send(
        self, object_id: str, name: str, payload: bytes, dedupe_key: str | None, now: float,
        seal: bytes = b"",
    ) -> bool:
        """Queue an event; wake the object if it waits for that name or it is ``perdure:…``."""
        with self._write() as conn:
            row = conn.execute(_Q["object_status"], (object_id,)).fetchone()
            if row is None:
                raise ObjectNotFoundError(f"no object {object_id!r} in {self.url}")
            if row[0] in _TERMINAL:
                raise ObjectTerminatedError(
                    f"object {object_id!r} has {row[0]}; event {name!r} was not delivered"
                )
            cur = conn.execute(_Q["insert_event"],
                               (object_id, name, payload, dedupe_key, now, seal))
            if cur.rowcount == 0:
                return False
            conn.execute(_Q["wake_for_event"], {"now": now, "object_id": object_id, "name": name})
            return True

    def pending_events(self, object_id: str) -> builtins.list[Event]:
        """Unconsumed events in arrival order."""
        try:
            with self._read() as conn:
                rows = conn.execute(_Q["pending_events"], (object_id,)).fetchall()
        except StoreError as exc:
            if not _bad_text(exc):
                raise
            # A damaged name reads with U+FFFD: its seal no longer matches, so the node
            # refuses the event with a record instead of delivering it.
            _, rows = self._as_bytes(_Q["pending_events"], (object_id,))
        return [Event(r[0], _text(r[1]), _text(r[2]), bytes(r[3]), _text(r[4]), r[5],
                      bytes(r[6])) for r in rows]

    def control(
        self,
        object_id: str,
        now: float,
        *,
        paused: bool | None = None,
        cancel: bool = False,
        unpark: bool = False,
    ) -> ObjectRow:
        """Pause, resume, cancel or unpark an object."""
        with self._write() as conn:
            row = conn.execute(_Q["object_status"], (object_id,)).fetchone()
            if row is None:
                raise ObjectNotFoundError(f"no object {object_id!r} in {self.url}")
            if row[0] in _TERMINAL:
                raise ObjectTerminatedError(f"object {object_id!r} has already {row[0]}")
            if paused is not None:
                conn.execute(
                    _Q["set_paused"], {"paused": int(paused), "now": now, "object_id": object_id}
                )
            if cancel:
                conn.execute(_Q["request_cancel"], {"now": now, "object_id": object_id})
            if unpark:
                conn.execute(_Q["unpark"], {"now": now, "object_id": object_id})
        found = self.get(object_id)
        assert found is not None
        return found

    def next_ready_at(self) -> float | None:
        """Earliest ``ready_at`` of a runnable object."""
        with self._read() as conn:
            value = conn.execute(_Q["next_ready_at"]).fetchone()[0]
        return None if value is None else float(value)

    def leases_held(self, owner_prefix: str, now: float) -> builtins.list[tuple[str, str, int]]:
        """Live leases whose owner starts with ``owner_prefix``."""
        escaped = owner_prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        rows = self._rows(_Q["leases_held"], {"prefix": escaped + "%", "now": now},
                          text=(0, 1))
        return [(row[0], row[1], row[2]) for row in rows]

    def expire_lease(self, object_id: str, owner: str, epoch: int, now: float) -> bool:
        """End a lease at once when its holder is known to be dead."""
        with self._write() as conn:
            cur = conn.execute(
                _Q["expire_lease"],
                {"now": now, "object_id": object_id, "epoch": epoch, "owner": owner},
            )
            return cur.rowcount == 1

    def control_flags(self, object_ids: Sequence[str]) -> dict[str, tuple[int, bool, bool]]:
        """Epoch and control flags of the given objects, in one read."""
        if not object_ids:
            return {}
        marks = ",".join("?" * len(object_ids))
        sql = f"SELECT object_id, epoch, cancel_requested, paused FROM objects WHERE object_id IN ({marks})"  # noqa: E501, S608 - placeholders only
        with self._read() as conn:
            rows = conn.execute(sql, tuple(object_ids)).fetchall()
        return {row[0]: (int(row[1]), bool(row[2]), bool(row[3])) for row in rows}

    def subscribe(self, callback: Callable[[str], None]) -> Callable[[], None] | None:
        """SQLite cannot push across processes: ``None``, so nodes poll (cheaply, by index)."""
        del callback
        return None

    def heartbeat(self, node_id: str, serves: Sequence[str], capabilities: Sequence[str],
                  now: float) -> None:
        """Record that ``node_id`` is alive, what it serves and what it can do."""
        with self._write() as conn:
            conn.execute(_Q["heartbeat"], {"serves": json.dumps(sorted(serves)),
                                           "caps": json.dumps(sorted(capabilities)),
                                           "now": now, "node_id": node_id})

    def live_nodes(self, since: float) -> builtins.list[NodeInfo]:
        """Nodes seen since ``since``."""
        rows = self._rows(_Q["live_nodes"], {"since": since}, text=(0, 1, 2))
        found = []
        for r in rows:
            try:
                serves, caps = tuple(json.loads(r[1])), tuple(json.loads(r[2]))
            except ValueError:
                serves, caps = (), ()  # damaged: the node is shown serving nothing
            found.append(NodeInfo(r[0], serves, caps, float(r[3])))
        return found
