"""PostgreSQL store: many nodes on many machines sharing one database, no coordinator.

Uses psycopg 3 with a connection pool (install with ``pip install perdure[postgres]``).
Runnable objects are claimed with ``FOR UPDATE SKIP LOCKED`` so nodes never wait on
each other; lease expiry is decided by the database clock; every write is fenced by
the epoch exactly as on SQLite. New objects and events are announced with
``NOTIFY perdure_wake`` so idle nodes wake at once; due timers are found through the
``ready_at`` index. Every ``psycopg`` error is translated here.
"""

from __future__ import annotations

import asyncio
import binascii
import builtins
import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson

from perdure._gc import gc_paused
from perdure.core.chain import CommitSeal, chain_from_rows
from perdure.core.records import GENESIS_HASH, Record
from perdure.errors import (
    CancelRequestedError,
    ConfigurationError,
    LeaseLostError,
    NodeIdentityError,
    ObjectNotFoundError,
    ObjectTerminatedError,
    RecordDecodeError,
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
)
from perdure.stores._sql import load_migrations, load_queries
from perdure.stores.base import Append, Claim, Event, NewObject, NodeInfo, ObjectRow, Route

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg_pool import ConnectionPool, PoolTimeout
except ImportError as exc:  # pragma: no cover - exercised by the install-hint test
    raise ConfigurationError(
        "the PostgreSQL store needs psycopg 3 and psycopg-pool: "
        "pip install 'perdure[postgres]'"
    ) from exc

__all__ = ["PostgresStore"]

log = logging.getLogger("perdure.store")

_Q = {name: sql.encode() for name, sql in load_queries("postgres").items()}
_TERMINAL = ("completed", "failed", "cancelled")
_MIGRATION_LOCK = 0x70657264  # "perd": advisory lock serialising schema changes
CHANNEL = "perdure_wake"
# Rows per chunk when a claim streams an object's chain (libpq 17's chunked rows mode):
# the next chunk travels while the node decodes this one, and the client never holds
# one big result of a long history.
_CHAIN_CHUNK = 1000 if psycopg.pq.version() >= 170000 else 0
# The columns of ``record_params``, in order: the keys of a record in ``append``'s JSON.
_RECORD_COLUMNS = ("object_id", "seq", "trace_id", "ts_us", "node_id", "policy_ref", "kind",
                   "body", "prev_hash", "hash", "signature")


def _where(conninfo: str) -> str:
    try:
        params = psycopg.conninfo.conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        return "PostgreSQL"
    host = params.get("host", "localhost")
    port = params.get("port", "5432")
    db = params.get("dbname", "")
    return f"PostgreSQL at {host}:{port}/{db}"


def _without_password(url: str) -> str:
    """``url`` with any password replaced by ``***``, for banners and error messages."""
    if "://" not in url:  # a keyword conninfo string: host=... password=...
        try:
            params = psycopg.conninfo.conninfo_to_dict(url)
        except psycopg.ProgrammingError:
            return "PostgreSQL"
        if "password" in params:
            params["password"] = "***"  # noqa: S105 - a mask, not a password
        return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in params.items()})
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    user = parts.netloc.rpartition("@")[0].partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def _translate(exc: BaseException, where: str) -> StoreError:
    """Turn a driver error into a perdure error that says what to do."""
    if isinstance(exc, PoolTimeout):
        return StoreError(
            f"{where} is unreachable (no connection within the pool timeout: {exc}); "
            "check that the server runs and accepts connections; workers retry by themselves"
        )
    if isinstance(exc, pg_errors.DiskFull):
        return StoreError(f"{where}: the disk is full ({exc}); nothing was written")
    if isinstance(exc, psycopg.OperationalError):
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return StoreError(
            f"{where} is unavailable ({first}); check the server and the URL; "
            "workers retry by themselves"
        )
    return StoreError(f"{where}: {type(exc).__name__}: {exc}")


def _row(cur: psycopg.Cursor[Any], row: tuple[Any, ...]) -> ObjectRow:
    assert cur.description is not None
    return object_row({col.name: value for col, value in zip(cur.description, row, strict=True)},
                      tuple)


class _Refused(Exception):  # noqa: N818 - internal control flow
    """Rolls back an asynchronous transaction whose append the store refuses."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class _RetryWithSavepoints(Exception):  # noqa: N818 - internal control flow
    """A batch hit an error that aborted its transaction; retry it op by op."""


def _careful(op: Append) -> bool:
    """Whether ``op`` needs a savepoint of its own: it consumes events or signals."""
    return bool(op.consume_event_ids) or op.signal is not None


def _append_query(ops: Sequence[tuple[int, Append]]) -> bytes:
    """``append``, or ``append_ending`` when an object of the batch ends and asks its
    children to cancel."""
    return _Q["append_ending"] if any(op.cancel_children for _, op in ops) else _Q["append"]


def _json(value: Any) -> Any:
    """A query parameter as a JSON value: bytes as base64 text, the rest as it is."""
    return binascii.b2a_base64(value, newline=False).decode() if isinstance(value, bytes) else value


def _seals_param(seals: Sequence[CommitSeal]) -> str:
    """Commit seals as the JSON the ``append`` and ``insert_seals`` statements read."""
    return _dumps([{"digest": _json(s.digest), "node_id": s.node_id,
                        "hashes": _json(s.hashes), "signature": _json(s.signature)}
                       for s in seals])


def _append_params(ops: Sequence[tuple[int, Append]], now: float,
                   seals: Sequence[CommitSeal] = ()) -> dict[str, Any]:
    """The ``append`` parameters of ``(index, append)`` pairs for distinct objects.

    Each append is ``append_params`` as a JSON object (without ``now``, which is
    shared), each record ``record_params``; both carry the append's index.
    """
    appends: builtins.list[dict[str, Any]] = []
    records: builtins.list[dict[str, Any]] = []
    for index, op in ops:
        params = append_params(op, now, builtins.list)
        del params["now"]
        appends.append({"i": index} | {key: _json(value) for key, value in params.items()})
        for rec in op.records:
            values = map(_json, record_params(rec))
            records.append({"i": index} | dict(zip(_RECORD_COLUMNS, values, strict=True)))
    return {"ops": _dumps(appends), "records": _dumps(records), "now": now,
            "seals": _seals_param(seals),
            "ending": [op.object_id for _, op in ops if op.cancel_children]}


def _split_names(names: str) -> list[str] | None:
    """The four header strings ``chain_after`` joins with U+001F; ``None`` when one of
    them holds that character itself (the full read then takes the record)."""
    parts = names.split("\x1f")
    return parts if len(parts) == 4 else None


def _dumps(value: Any) -> str:
    """JSON text for a ``::jsonb`` parameter (orjson: the group commit's hot path)."""
    return orjson.dumps(value).decode()


def _distinct_runs(ops: Sequence[Append]) -> builtins.list[builtins.list[tuple[int, Append]]]:
    """``ops`` (indexed) cut into consecutive runs that touch each object at most once.

    One statement updates each row once, so a second append to the same object (which
    chains onto the first) goes into the next statement, after it.
    """
    runs: builtins.list[builtins.list[tuple[int, Append]]] = [[]]
    seen: set[str] = set()
    for index, op in enumerate(ops):
        if op.object_id in seen:
            runs.append([])
            seen.clear()
        seen.add(op.object_id)
        runs[-1].append((index, op))
    return runs


def _waits(ops: Sequence[Append]) -> builtins.list[str]:
    """The objects ``ops`` let go of while they wait for an event (see ``rewake``)."""
    return [op.object_id for op in ops if op.release and op.waiting_event is not None]


def _outcome(op: Append, cancel: bool) -> BaseException | None:
    """The outcome of an append the store took: ``CancelRequestedError`` when a cancel is
    pending and the node would keep running the object, else ``None``."""
    if cancel and notices_cancel(op):
        return CancelRequestedError(f"object {op.object_id!r}: a cancel was requested")
    return None


def _fenced_out(op: Append) -> LeaseLostError:
    """The refusal of an append whose fence (epoch and head) no longer holds."""
    return LeaseLostError(
        f"object {op.object_id!r}: epoch {op.epoch} no longer holds the lease or the "
        "chain moved on (another node took it over); this node stops touching it"
    )


class PostgresStore:
    """A ``Store`` on one PostgreSQL database shared by any number of nodes.

    ``pool_size`` bounds this process's connections; ``connect_timeout`` is how long
    a call waits for a connection before it fails with ``StoreError``.
    """

    commit_mode = "async"

    def __init__(
        self,
        conninfo: str,
        *,
        pool_size: int = 8,
        connect_timeout: float = 5.0,
        idle_tx_timeout: float = 30.0,
        url: str | None = None,
    ) -> None:
        self.conninfo = conninfo
        self.url = _without_password(url or conninfo)  # shown in banners and errors
        self._where = _where(conninfo)
        self._connect_timeout = connect_timeout
        self._idle_tx_ms = int(idle_tx_timeout * 1000)
        # apply_async: one asynchronous connection per event loop that commits through it
        self._aconns: dict[asyncio.AbstractEventLoop, psycopg.AsyncConnection[Any]] = {}
        try:  # one direct attempt first: a wrong URL fails at once with the server's reason
            with psycopg.connect(conninfo, connect_timeout=max(1, int(connect_timeout))):
                pass
        except psycopg.Error as exc:
            raise _translate(exc, self._where) from exc
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

    # -- connections ---------------------------------------------------------

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        """Per connection: a node frozen mid-transaction (SIGSTOP, VM pause) must not hold
        row locks forever; the server ends such a session after ``idle_tx_timeout``."""
        if self._idle_tx_ms > 0:
            conn.execute(
                b"SELECT set_config('idle_in_transaction_session_timeout', %s, false)",
                (str(self._idle_tx_ms),),
            )
            conn.commit()

    def _why_unreachable(self, exc: BaseException) -> StoreError:
        """The server's own reason (no such database, refused, bad password) if it gives one."""
        try:
            with psycopg.connect(self.conninfo, connect_timeout=max(1, int(self._connect_timeout))):
                pass
        except psycopg.Error as direct:
            return _translate(direct, self._where)
        return _translate(exc, self._where)

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
        except (LeaseLostError, NodeIdentityError, ObjectNotFoundError,
                ObjectTerminatedError, RecordDecodeError):
            raise
        except (psycopg.Error, PoolTimeout) as exc:
            if isinstance(exc, psycopg.OperationalError | PoolTimeout):
                # The server may have restarted: drop every broken idle connection now
                # rather than failing once per pooled connection.
                with contextlib.suppress(Exception):
                    self._pool.check()
            raise _translate(exc, self._where) from exc

    def _migrate(self) -> None:
        migrations = load_migrations("postgres")
        with self._tx() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            conn.execute(
                "CREATE TABLE IF NOT EXISTS perdure_migrations ("
                "version INTEGER PRIMARY KEY, name TEXT NOT NULL, "
                "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
            )
            done = {row[0] for row in conn.execute("SELECT version FROM perdure_migrations")}
            for version, name, text in migrations:
                if version in done:
                    continue
                conn.execute(text.encode())
                conn.execute(
                    "INSERT INTO perdure_migrations (version, name) VALUES (%s, %s)",
                    (version, name),
                )

    def close(self) -> None:
        """Close the pool, and any loop's asynchronous connection left open."""
        for conn in builtins.list(self._aconns.values()):
            with contextlib.suppress(Exception):
                conn.pgconn.finish()
        self._aconns.clear()
        self._pool.close()

    # -- nodes -----------------------------------------------------------------

    def register_node(self, node_id: str, public_key: bytes, now: float) -> None:
        """Record a node's public key; refuse a second, different key for the same id."""
        with self._tx() as conn:
            conn.execute(_Q["register_node"], (node_id, public_key, now))
            row = conn.execute(_Q["node_key"], (node_id,)).fetchone()
        assert row is not None
        if bytes(row[0]) != public_key:
            raise NodeIdentityError(
                f"node id {node_id!r} is registered in {self._where} with a different public "
                "key; give this node another id or restore its key directory"
            )

    def publish_trust(self, item_id: str, kind: str, body: bytes, now: float) -> None:
        """Keep a trust item (certificate or revocation) under ``item_id``, once."""
        with self._tx() as conn:
            conn.execute(_Q["publish_trust"], (item_id, kind, body, now))

    def trust_items(self) -> builtins.list[tuple[str, bytes]]:
        """Every trust item as ``(kind, body)``, oldest first."""
        with self._single() as conn:
            return [(row[0], bytes(row[1])) for row in conn.execute(_Q["trust_items"])]

    def public_keys(self) -> dict[str, bytes]:
        """All registered node keys."""
        with self._single() as conn:
            return {row[0]: bytes(row[1]) for row in conn.execute(_Q["public_keys"])}

    # -- objects and records ---------------------------------------------------

    def create(self, new: NewObject, now: float) -> bool:
        """Insert the object row and its first record in one transaction."""
        with self._tx() as conn:
            cur = conn.execute(_Q["insert_object"], create_params(new, now, builtins.list))
            if cur.rowcount == 0:
                return False
            conn.execute(_Q["insert_record"], record_params(new.first))
            conn.execute(_Q["notify"], (new.object_id,))
            return True

    def get(self, object_id: str) -> ObjectRow | None:
        """The object's row, or ``None``."""
        with self._single() as conn:
            cur = conn.execute(_Q["get_object"], (object_id,))
            row = cur.fetchone()
            return None if row is None else _row(cur, row)

    def list(
        self,
        *,
        status: str | None = None,
        phase: str | None = None,
        agent: str | None = None,
        parent: str | None = None,
        limit: int = 100,
    ) -> builtins.list[ObjectRow]:
        """Rows matching the filters, newest first."""
        clauses: builtins.list[str] = []
        params: builtins.list[Any] = []
        for column, value in (("status", status), ("phase", phase), ("agent", agent),
                              ("parent_id", parent)):
            if value is not None:
                clauses.append(f"{column} = %s")
                params.append(value)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        sql = f"SELECT * FROM objects {where} ORDER BY created_at DESC, object_id LIMIT %s"  # noqa: S608 - fixed column names, values bound
        with self._single() as conn:
            cur = conn.execute(sql.encode(), (*params, limit))
            return [_row(cur, row) for row in cur.fetchall()]

    def records(self, object_id: str, after_seq: int = 0) -> builtins.list[Record]:
        """Records after ``after_seq``, decoded; ``RecordDecodeError`` on damage."""
        with gc_paused():  # a long history: many new containers
            with self._single() as conn:
                rows = conn.execute(_Q["records_after"], (object_id, after_seq),
                                    binary=True).fetchall()
            return [record_from_row(row) for row in rows]

    def chain(self, object_id: str, after_seq: int = 0, start_hash: str = GENESIS_HASH
              ) -> builtins.list[Record]:
        """Records after ``after_seq``, links and hashes checked from ``start_hash``."""
        with gc_paused():  # a long history: many new containers
            with self._single() as conn, conn.cursor(binary=True) as cur:
                # Decoded as the rows come: each row's leftovers are freed at once.
                params = (object_id, after_seq)
                rows = (cur.stream(_Q["chain_after"], params, size=_CHAIN_CHUNK)
                        if _CHAIN_CHUNK else cur.execute(_Q["chain_after"], params))
                try:
                    got = chain_from_rows(object_id, rows, start_hash=start_hash,
                                          start_seq=after_seq + 1, split=_split_names)
                finally:
                    if isinstance(rows, Generator):
                        rows.close()  # given up early: the rest of the stream is cancelled
            return checked_chain(object_id, got, after_seq, start_hash,
                                 lambda: self.records(object_id, after_seq))

    def seals(self, digests: Sequence[bytes]) -> dict[bytes, CommitSeal]:
        """The stored commit seals among ``digests``, by digest."""
        if not digests:
            return {}
        with self._single() as conn:
            rows = conn.execute(_Q["seals_by_digest"], (builtins.list(digests),)).fetchall()
        return {bytes(row[0]): seal_from_row(row) for row in rows}

    # -- leases ----------------------------------------------------------------

    def claim(self, owner: str, now: float, lease_until: float, limit: int,
              route: Route | None = None) -> builtins.list[Claim]:
        """Lease up to ``limit`` runnable objects ``route`` can serve, skipping locked rows."""
        if limit <= 0:
            return []
        route = route or Route()
        with self._single() as conn:
            rows = conn.execute(
                _Q["claim"],
                {"now": now, "limit": limit, "owner": owner, "lease": lease_until - now,
                 "serves": None if route.serves is None else builtins.list(route.serves),
                 "caps": builtins.list(route.capabilities), "node": route.node_id},
            ).fetchall()
        return [claim_from_row(row) for row in rows]

    def renew(self, object_id: str, epoch: int, lease_until: float) -> Claim | None:
        """Extend the lease (by the database clock) if still held at ``epoch``."""
        with self._single() as conn:
            row = conn.execute(
                _Q["renew"],
                {"lease": max(0.0, lease_until - time.time()), "object_id": object_id,
                 "epoch": epoch},
            ).fetchone()
        return None if row is None else claim_from_row(row)

    def apply(self, ops: Sequence[Append], now: float, seals: Sequence[CommitSeal] = ()
              ) -> builtins.list[BaseException | None]:
        """Apply fenced appends and store ``seals`` in one transaction (group commit).

        Appends that neither consume events nor signal go in one ``append`` statement
        (row updates, records and wake-ups together), run on its own as a transaction:
        the whole group commit is one round trip. An append refused by its fence
        writes nothing, so it needs no savepoint. When some appends consume events or
        signal, the batch runs in an explicit transaction and each of those gets a
        savepoint of its own. If an insert still fails (which aborts the transaction),
        the batch is retried with a savepoint per append so that only the offender is
        refused.
        """
        if not ops:
            return []
        try:
            return self._apply_batch(ops, now, seals, savepoints=False)
        except _RetryWithSavepoints:
            return self._apply_batch(ops, now, seals, savepoints=True)

    def apply_now(self, ops: Sequence[Append], now: float, seals: Sequence[CommitSeal] = ()
                  ) -> builtins.list[BaseException | None] | None:
        """Always ``None``: a commit here is a network round trip, which the event loop
        must not block on (``apply_async`` awaits it instead)."""
        del ops, now, seals
        return None

    async def apply_async(self, ops: Sequence[Append], now: float,
                          seals: Sequence[CommitSeal] = ()
                          ) -> builtins.list[BaseException | None] | None:
        """A batch of plain appends to distinct objects (the common group commit) as one
        ``append`` statement on the running loop's own asynchronous connection: the loop
        runs other steps while the server works, with no hop to the write thread and
        back and no GIL for the write thread to win from a busy loop. A lone append that
        consumes events (an agent receiving what it waited for) goes the same way, in a
        transaction of its own. ``None`` (nothing written) for any other batch, and for
        one that hit a conflict: ``apply`` on the write thread redoes it with its
        savepoints and refuses only the offender.
        """
        if not ops:
            return None
        consuming = len(ops) == 1 and ops[0].signal is None and bool(ops[0].consume_event_ids)
        if not consuming and any(map(_careful, ops)):
            return None
        runs = _distinct_runs(ops)
        if len(runs) != 1:
            return None
        loop = asyncio.get_running_loop()
        try:
            conn = await self._async_conn(loop)
            if consuming:
                return [await self._consume_async(conn, ops[0], now, seals)]
            params = _append_params(runs[0], now, seals)
            query = _append_query(runs[0])
            if waits := _waits(ops):
                # One implicit transaction (a pipeline up to its sync): the release and the
                # look for an event sent while it waited for the row are seen together.
                async with conn.pipeline():
                    cur = await conn.execute(query, params, prepare=True)
                    await conn.execute(_Q["rewake"], {"ids": waits, "now": now},
                                       prepare=True)
            else:
                cur = await conn.execute(query, params, prepare=True)
            done = {row[0]: row[2] for row in await cur.fetchall()}
        except pg_errors.UniqueViolation:
            return None
        except psycopg.Error as exc:
            if isinstance(exc, psycopg.OperationalError):
                broken = self._aconns.pop(loop, None)
                if broken is not None:
                    with contextlib.suppress(Exception):
                        await broken.close()
            raise _translate(exc, self._where) from exc
        return [_outcome(op, done[index]) if index in done else _fenced_out(op)
                for index, op in enumerate(ops)]

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
                    await conn.execute(
                        b"SELECT set_config('idle_in_transaction_session_timeout', %s, false)",
                        (str(self._idle_tx_ms),))
                except BaseException:
                    await conn.close()  # not kept: it would be left open
                    raise
            old = self._aconns.get(loop)
            if old is not None and not old.closed:  # opened meanwhile by another task
                await conn.close()
                return old
            self._aconns[loop] = conn
        return conn

    async def open_async(self) -> None:
        """Open the running loop's asynchronous connection now and prepare its commit
        statements (running them on nothing): a worker does this as it starts, so that
        its first commit, often the one that resumes an object, waits neither for a
        connection nor for a new server process to plan its first statements."""
        try:
            conn = await self._async_conn(asyncio.get_running_loop())
            await conn.execute(_Q["append"], _append_params([], 0.0), prepare=True)
            await conn.execute(_Q["consume_event"], (0, -1, ""), prepare=True)
        except psycopg.Error as exc:
            raise _translate(exc, self._where) from exc

    async def _consume_async(self, conn: psycopg.AsyncConnection[Any], op: Append,
                             now: float, seals: Sequence[CommitSeal]) -> BaseException | None:
        """One append that consumes events (an agent receiving what it waited for), in a
        transaction of its own. The transaction's start, the append and every
        consumption go to the server together (pipeline mode: one round trip), then the
        commit; a refusal of either rolls both back."""
        assert op.records, "consuming an event needs the record that receives it"
        seq = op.records[-1].seq
        try:
            async with conn.pipeline() as pipeline, conn.transaction():
                appended = await conn.execute(
                    _append_query([(0, op)]), _append_params([(0, op)], now, seals),
                    prepare=True)
                consumed = [conn.cursor() for _ in op.consume_event_ids]
                for cur, event_id in zip(consumed, op.consume_event_ids, strict=True):
                    await cur.execute(_Q["consume_event"], (seq, event_id, op.object_id),
                                      prepare=True)
                if op.release and op.waiting_event is not None:
                    await conn.execute(_Q["rewake"], {"ids": [op.object_id], "now": now},
                                       prepare=True)
                await pipeline.sync()
                taken = await appended.fetchall()
                if not taken:
                    raise _Refused(_fenced_out(op))
                if any(cur.rowcount != 1 for cur in consumed):
                    raise _Refused(LeaseLostError(
                        f"object {op.object_id!r}: an event it consumes was consumed by "
                        "another node"))
        except _Refused as refused:
            return refused.error
        return _outcome(op, bool(taken[0][2]))

    async def close_async(self) -> None:
        """Close the running loop's asynchronous connection (a worker does as it stops)."""
        conn = self._aconns.pop(asyncio.get_running_loop(), None)
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    def _apply_batch(self, ops: Sequence[Append], now: float, seals: Sequence[CommitSeal], *,
                     savepoints: bool) -> builtins.list[BaseException | None]:
        if not savepoints and not any(map(_careful, ops)):
            # No BEGIN/COMMIT round trips: one statement is its own transaction, and
            # several in one pipeline run as one implicit transaction up to its sync.
            with self._tx(transaction=False) as conn:
                return self._apply_plain(conn, ops, now, seals)
        results: builtins.list[BaseException | None] = []
        with self._tx() as conn:
            if seals:
                conn.execute(_Q["insert_seals"], {"seals": _seals_param(seals)})
            for alone, run in itertools.groupby(ops, lambda op: savepoints or _careful(op)):
                if alone:
                    results.extend(self._apply_alone(conn, op, now) for op in run)
                else:  # a run of plain appends, still in op order
                    results.extend(self._apply_plain(conn, builtins.list(run), now))
        return results

    def _apply_plain(self, conn: psycopg.Connection[Any], ops: Sequence[Append], now: float,
                     seals: Sequence[CommitSeal] = ()) -> builtins.list[BaseException | None]:
        """Appends without events or signals: one ``append`` statement for all of them.

        When an object appends twice (parallel branches), the statements (one per run
        of distinct objects, in order) go together in pipeline mode: still one round
        trip; the first statement also stores ``seals``. A failed statement aborts the
        transaction; the batch is then retried
        with a savepoint per append. The statement is prepared on its first use on a
        connection rather than its sixth: planning it costs half as much again as
        running it, and the pool hands the write thread each of its connections in turn.
        """
        runs = _distinct_runs(ops)
        waits = _waits(ops)
        try:
            if len(runs) == 1 and not waits:
                cursors = [conn.execute(_append_query(runs[0]),
                                        _append_params(runs[0], now, seals), prepare=True)]
            else:
                # One implicit transaction up to the pipeline's sync; ``rewake`` last, so
                # that it sees an event sent while a release waited for its row.
                with conn.pipeline():
                    cursors = [conn.cursor().execute(
                        _append_query(run), _append_params(run, now, seals if n == 0 else ()),
                        prepare=True) for n, run in enumerate(runs)]
                    if waits:
                        conn.execute(_Q["rewake"], {"ids": waits, "now": now}, prepare=True)
        except pg_errors.UniqueViolation as exc:
            raise _RetryWithSavepoints from exc
        done = {row[0]: row[2] for cur in cursors for row in cur.fetchall()}
        return [_outcome(op, done[index]) if index in done else _fenced_out(op)
                for index, op in enumerate(ops)]

    def _apply_alone(self, conn: psycopg.Connection[Any], op: Append, now: float
                     ) -> BaseException | None:
        """One append in a savepoint of its own: a refusal undoes only this append.

        After the append, the events it consumes (each exactly once) and the signal it
        sends to another object, whom it wakes.
        """
        try:
            with conn.transaction():
                cur = conn.execute(_append_query([(0, op)]), _append_params([(0, op)], now),
                                   prepare=True)
                taken = cur.fetchone()
                if taken is None:
                    if op.unless_cancelled:
                        state = conn.execute(_Q["cancel_state"], (op.object_id,)).fetchone()
                        if state is not None and state[0] == op.epoch and state[1]:
                            return CancelRequestedError(
                                f"object {op.object_id!r}: a cancel was requested; the "
                                "completion was not written")
                    return _fenced_out(op)
                for event_id in op.consume_event_ids:
                    assert op.records, "consuming an event needs the record that receives it"
                    cur = conn.execute(_Q["consume_event"],
                                       (op.records[-1].seq, event_id, op.object_id))
                    if cur.rowcount != 1:
                        raise LeaseLostError(  # rolls the savepoint back
                            f"object {op.object_id!r}: event {event_id} was consumed by "
                            "another node"
                        )
                if op.signal is not None:
                    sig = op.signal
                    conn.execute(_Q["insert_event"],
                                 (sig.object_id, sig.name, sig.payload, sig.dedupe_key, now,
                                  sig.seal))
                    conn.execute(_Q["wake_for_event"],
                                 {"now": now, "object_id": sig.object_id, "name": sig.name})
                    conn.execute(_Q["notify"], (sig.object_id,))
        except pg_errors.UniqueViolation:
            return LeaseLostError(f"object {op.object_id!r}: another node appended first")
        except LeaseLostError as exc:
            return exc
        if op.release and op.waiting_event is not None:
            conn.execute(_Q["rewake"], {"ids": [op.object_id], "now": now}, prepare=True)
        return _outcome(op, bool(taken[2]))

    # -- inbox and control -----------------------------------------------------

    def send(
        self, object_id: str, name: str, payload: bytes, dedupe_key: str | None, now: float,
        seal: bytes = b"",
    ) -> bool:
        """Queue an event, wake the object if it waits for that name, and notify nodes."""
        with self._tx() as conn:
            row = conn.execute(_Q["object_status"], (object_id,)).fetchone()
            if row is None:
                raise ObjectNotFoundError(f"no object {object_id!r} in {self._where}")
            if row[0] in _TERMINAL:
                raise ObjectTerminatedError(
                    f"object {object_id!r} has {row[0]}; event {name!r} was not delivered"
                )
            cur = conn.execute(_Q["insert_event"],
                               (object_id, name, payload, dedupe_key, now, seal))
            if cur.rowcount == 0:
                return False
            conn.execute(_Q["wake_for_event"], {"now": now, "object_id": object_id,
                                                "name": name})
            conn.execute(_Q["notify"], (object_id,))
            return True

    def pending_events(self, object_id: str) -> builtins.list[Event]:
        """Unconsumed events in arrival order."""
        with self._single() as conn:
            rows = conn.execute(_Q["pending_events"], (object_id,)).fetchall()
        return [Event(int(r[0]), r[1], r[2], bytes(r[3]), r[4], float(r[5]), bytes(r[6]))
                for r in rows]

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
        with self._tx() as conn:
            row = conn.execute(_Q["object_status"], (object_id,)).fetchone()
            if row is None:
                raise ObjectNotFoundError(f"no object {object_id!r} in {self._where}")
            if row[0] in _TERMINAL:
                raise ObjectTerminatedError(f"object {object_id!r} has already {row[0]}")
            if paused is not None:
                conn.execute(_Q["set_paused"], {"paused": paused, "now": now,
                                                "object_id": object_id})
            if cancel:
                conn.execute(_Q["request_cancel"], {"now": now, "object_id": object_id})
            if unpark:
                conn.execute(_Q["unpark"], {"now": now, "object_id": object_id})
            if cancel or unpark or paused is False:
                conn.execute(_Q["notify"], (object_id,))
        found = self.get(object_id)
        assert found is not None
        return found

    def next_ready_at(self) -> float | None:
        """Earliest ``ready_at`` of a runnable object."""
        with self._single() as conn:
            row = conn.execute(_Q["next_ready_at"]).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    def leases_held(self, owner_prefix: str, now: float) -> builtins.list[tuple[str, str, int]]:
        """Live leases (by the database clock) whose owner starts with ``owner_prefix``."""
        escaped = owner_prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        with self._single() as conn:
            rows = conn.execute(_Q["leases_held"], {"prefix": escaped + "%"}).fetchall()
        return [(row[0], row[1], int(row[2])) for row in rows]

    def expire_lease(self, object_id: str, owner: str, epoch: int, now: float) -> bool:
        """End a lease at once when its holder is known to be dead."""
        with self._single() as conn:
            cur = conn.execute(_Q["expire_lease"], {"now": now, "object_id": object_id,
                                                    "epoch": epoch, "owner": owner})
            return cur.rowcount == 1

    def control_flags(self, object_ids: Sequence[str]) -> dict[str, tuple[int, bool, bool]]:
        """Epoch and control flags of the given objects, in one read."""
        if not object_ids:
            return {}
        with self._single() as conn:
            rows = conn.execute(_Q["control_flags"], (builtins.list(object_ids),)).fetchall()
        return {row[0]: (int(row[1]), bool(row[2]), bool(row[3])) for row in rows}

    # -- wake-ups ----------------------------------------------------------------

    def subscribe(self, callback: Callable[[str], None]) -> Callable[[], None]:
        """Call ``callback(object_id)`` on each wake-up notification; returns ``stop``.

        A background thread holds one connection with ``LISTEN perdure_wake`` and
        reconnects by itself when the server goes away (logging once per outage).
        """
        stopped = threading.Event()

        def listen() -> None:
            down = False
            while not stopped.is_set():
                try:
                    with psycopg.connect(self.conninfo, autocommit=True,
                                         connect_timeout=max(1, int(self._connect_timeout))
                                         ) as conn:
                        conn.execute(f"LISTEN {CHANNEL}")
                        if down:
                            log.warning("wake-up channel reconnected",
                                        extra={"action": "listen_up"})
                            down = False
                        callback("")  # catch up on anything missed while disconnected
                        while not stopped.is_set():
                            for note in conn.notifies(timeout=0.5, stop_after=64):
                                callback(note.payload)
                except psycopg.Error as exc:
                    if not down:
                        log.error("wake-up channel lost (%s); polling until it is back",
                                  str(exc).strip().splitlines()[0] if str(exc).strip() else exc,
                                  extra={"action": "listen_down"})
                        down = True
                    stopped.wait(1.0)

        thread = threading.Thread(target=listen, name="perdure-listen", daemon=True)
        thread.start()

        def stop() -> None:
            stopped.set()
            thread.join(timeout=5)

        return stop

    def heartbeat(self, node_id: str, serves: Sequence[str], capabilities: Sequence[str],
                  now: float) -> None:
        """Record that ``node_id`` is alive, what it serves and what it can do."""
        with self._single() as conn:
            conn.execute(_Q["heartbeat"], {"serves": sorted(serves), "caps": sorted(capabilities),
                                           "now": now, "node_id": node_id})

    def live_nodes(self, since: float) -> builtins.list[NodeInfo]:
        """Nodes seen since ``since``."""
        with self._single() as conn:
            rows = conn.execute(_Q["live_nodes"], {"since": since}).fetchall()
        return [NodeInfo(r[0], tuple(r[1]), tuple(r[2]), float(r[3])) for r in rows]
