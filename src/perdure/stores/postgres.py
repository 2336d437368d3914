"""PostgreSQL store: many nodes on many machines sharing one database, no coordinator.

Uses psycopg 3 with a connection pool (install with ``pip install perdure[postgres]``).
Runnable objects are claimed with ``FOR UPDATE SKIP LOCKED`` so nodes never wait on
each other; lease expiry is decided by the database clock; every write is fenced by
the epoch exactly as on SQLite. New objects and events are announced with
``NOTIFY perdure_wake`` so idle nodes wake at once, and objects that end or are
parked with ``NOTIFY perdure_ended`` (after their commit, outside it) so that callers
waiting for a result learn it at once; due timers are found through the ``ready_at``
index. One listening connection per store object serves every subscriber of the
process. The group commit's statements are ``_postgres_commit``'s; the
connections, migrations and the translation of every ``psycopg`` error are
``_postgres_db``'s; the dashboard's reads (``Browse``) are ``_postgres_browse``'s.
"""

from __future__ import annotations

import asyncio
import builtins
import concurrent.futures
import itertools
import logging
import threading
import time
from collections.abc import Callable, Generator, Sequence
from typing import Any

from perdure.core import flow
from perdure.core.chain import CommitSeal, chain_from_rows
from perdure.core.gc import gc_paused
from perdure.core.lifecycle import TERMINAL_STATUSES
from perdure.core.quotas import ModelQuota, QuotaState
from perdure.core.records import GENESIS_HASH, Record
from perdure.errors import (
    ConfigurationError,
    ObjectNotFoundError,
    ObjectTerminatedError,
)

try:
    import psycopg
    from psycopg import errors as pg_errors
except ImportError as exc:  # pragma: no cover - exercised by the install-hint test
    raise ConfigurationError(
        "the PostgreSQL store needs psycopg 3 and psycopg-pool: "
        "pip install 'perdure[postgres]'"
    ) from exc

from perdure.stores._postgres_browse import PostgresBrowse
from perdure.stores._postgres_commit import (
    RetryWithSavepoints,
    append_query,
    apply_alone,
    apply_plain,
    batch_params,
    careful,
    consume_async,
    distinct_runs,
    fenced_out,
    outcome,
    releases_waiting,
    seals_param,
)
from perdure.stores._postgres_db import Q as _Q
from perdure.stores._postgres_db import object_of, translate
from perdure.stores._push import ENDED, WAKE, Hub, pushes
from perdure.stores._queues import (
    candidates,
    load_of,
    queue_params,
    queue_row,
    scan_size,
    stats_row,
)
from perdure.stores._quotas import declare_in, quota_of, reserve_in, stats_in, throttled_in
from perdure.stores._rows import (
    alert_of,
    checked_chain,
    checkpoint_row,
    claim_from_row,
    create_params,
    data_key_row,
    list_query,
    record_from_row,
    record_params,
    seal_from_row,
)
from perdure.stores._urls import redact_url
from perdure.stores.base import (
    AlertRow,
    Append,
    CheckpointRow,
    Claim,
    DataKeyRow,
    Event,
    NewObject,
    NodeInfo,
    ObjectRow,
    QueueStats,
    QuotaGrant,
    QuotaStats,
    Route,
    Writer,
)
from perdure.stores.writers import AsyncWriter

__all__ = ["PostgresStore"]

QUEUES_LOOK = 1.0
"""Seconds between a store's looks for a first queue while it has none (see
``PostgresStore._queues_in_use``)."""

log = logging.getLogger("perdure.store")

_TERMINAL = TERMINAL_STATUSES  # str values compare equal to their Status
# Rows per chunk when a claim streams an object's chain (libpq 17's chunked rows mode):
# the next chunk travels while the node decodes this one, and the client never holds
# one big result of a long history.
_CHAIN_CHUNK = 1000 if psycopg.pq.version() >= 170000 else 0
# The channels the listening connection hears, and the kind of notification each carries.
_CHANNELS = {"perdure_wake": WAKE, "perdure_ended": ENDED}


def _split_names(names: str) -> list[str] | None:
    """The four header strings ``chain_after`` joins with U+001F; ``None`` when one of
    them holds that character itself (the full read then takes the record)."""
    parts = names.split("\x1f")
    return parts if len(parts) == 4 else None


class PostgresStore(PostgresBrowse):
    """A ``Store`` on one PostgreSQL database shared by any number of nodes.

    ``pool_size`` bounds this process's connections; ``connect_timeout`` is how long
    a call waits for a connection before it fails with ``StoreError``.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        pool_size: int = 8,
        connect_timeout: float = 5.0,
        idle_tx_timeout: float = 30.0,
        url: str | None = None,
    ) -> None:
        self.url = redact_url(url or conninfo)  # shown in banners and errors
        super().__init__(conninfo, pool_size=pool_size, connect_timeout=connect_timeout,
                         idle_tx_timeout=idle_tx_timeout)
        self._hub = Hub(self._listen_for)
        self._listening: threading.Thread | None = None
        self._stop_listening = threading.Event()
        self._hub_lock = threading.Lock()
        # Whether the store has queues; until it has, a claim is one round trip (see
        # ``_queues_in_use``).
        self._queues = False
        self._queues_looked = float("-inf")

    # -- nodes -----------------------------------------------------------------

    def publish_trust(self, item_id: str, kind: str, body: bytes, now: float) -> None:
        """Keep a trust item (certificate or revocation) under ``item_id``, once."""
        with self._tx() as conn:
            conn.execute(_Q["publish_trust"], (item_id, kind, body, now))

    def trust_items(self) -> builtins.list[tuple[str, bytes]]:
        """Every trust item as ``(kind, body)``, oldest first."""
        with self._single() as conn:
            return [(row[0], bytes(row[1])) for row in conn.execute(_Q["trust_items"])]

    # -- data keys ----------------------------------------------------------------

    def data_key(self, object_id: str) -> DataKeyRow | None:
        """The object's wrapped data key, if it has one."""
        with self._single() as conn:
            row = conn.execute(_Q["data_key"], (object_id,)).fetchone()
        return None if row is None else data_key_row(row)

    def put_data_key(self, row: DataKeyRow, now: float) -> DataKeyRow:
        """Keep ``row`` unless the object has a data key already; the row kept."""
        with self._tx() as conn:
            conn.execute(_Q["put_data_key"], (row.object_id, row.key_id, row.wrapped,
                                              row.seal_all, now))
            got = conn.execute(_Q["data_key"], (row.object_id,)).fetchone()
        assert got is not None  # inserted, or there already
        return data_key_row(got)

    def data_keys_not_under(self, key_id: str, after: str, limit: int
                            ) -> builtins.list[DataKeyRow]:
        """Up to ``limit`` data keys wrapped under another key than ``key_id``."""
        with self._single() as conn:
            rows = conn.execute(_Q["data_keys_not_under"], (key_id, after, limit)).fetchall()
        return [data_key_row(row) for row in rows]

    def rewrap_data_key(self, old: DataKeyRow, key_id: str, wrapped: bytes,
                        now: float) -> bool:
        """Replace ``old`` by ``wrapped`` under ``key_id`` if the row is still ``old``."""
        with self._tx() as conn:
            cur = conn.execute(_Q["rewrap_data_key"], (key_id, wrapped, now, old.object_id,
                                                      old.key_id, old.wrapped))
            return cur.rowcount == 1

    def data_key_counts(self) -> dict[str, int]:
        """How many data keys each key-encryption key id wraps."""
        with self._single() as conn:
            return {row[0]: int(row[1]) for row in conn.execute(_Q["data_key_counts"])}

    # -- checkpoint slots ---------------------------------------------------------

    def put_checkpoint(self, row: CheckpointRow) -> bool:
        """Upsert ``row`` if the object's lease is still at ``row.epoch``."""
        with self._tx() as conn:
            cur = conn.execute(_Q["put_checkpoint"], {
                "object_id": row.object_id, "slot": row.slot, "epoch": row.epoch,
                "after_seq": row.after_seq, "after_hash": row.after_hash, "body": row.body,
                "signer": row.signer, "signature": row.signature,
                "written_at": row.written_at})
            return cur.rowcount == 1

    def checkpoints(self, object_id: str) -> builtins.list[CheckpointRow]:
        """Every slot row of ``object_id``, by slot."""
        with self._single() as conn:
            rows = conn.execute(_Q["checkpoints"], (object_id,)).fetchall()
        return [checkpoint_row(row) for row in rows]

    def delete_checkpoints(self, object_id: str, slots: Sequence[str] | None,
                           epoch: int | None) -> bool:
        """Delete ``slots`` (``None``: all) of ``object_id``, fenced on ``epoch``."""
        with self._tx() as conn:
            if epoch is not None and conn.execute(_Q["checkpoint_fence"],
                                                  (object_id, epoch)).fetchone() is None:
                return False
            if slots is None:
                conn.execute(_Q["delete_checkpoints"], (object_id,))
            else:
                for slot in slots:
                    conn.execute(_Q["delete_checkpoint"], (object_id, slot))
        return True

    # -- objects and records ---------------------------------------------------

    def create(self, new: NewObject, now: float) -> bool:
        """Insert the object row and its first record in one transaction."""
        query = "insert_object" if new.queue is None else "insert_queued_object"
        with self._tx() as conn:
            cur = conn.execute(_Q[query], create_params(new, now, builtins.list))
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
            return None if row is None else object_of(cur, row)

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
        with self._single() as conn:
            cur = conn.execute(
                _Q[list_query(status=status, agent=agent, parent=parent)],
                {"status": status, "phase": phase, "agent": agent, "parent": parent,
                 "limit": limit})
            return [object_of(cur, row) for row in cur.fetchall()]

    def records(self, object_id: str, after_seq: int = 0) -> builtins.list[Record]:
        """Records after ``after_seq``, decoded; ``RecordDecodeError`` on damage."""
        with gc_paused():  # a long history: many new containers
            with self._single() as conn:
                rows = conn.execute(_Q["records_after"], (object_id, after_seq),
                                    binary=True).fetchall()
            return [record_from_row(row) for row in rows]

    def record(self, object_id: str, seq: int) -> Record | None:
        """The object's record ``seq``, decoded, or ``None``; ``RecordDecodeError`` on
        damage."""
        with self._single() as conn:
            rows = conn.execute(_Q["record_at"], (object_id, seq), binary=True).fetchall()
        return record_from_row(rows[0]) if rows else None

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
        params = {"now": now, "limit": limit, "owner": owner, "lease": lease_until - now,
                  "serves": None if route.serves is None else builtins.list(route.serves),
                  "caps": builtins.list(route.capabilities), "node": route.node_id}
        queued: builtins.list[str] = []
        if self._queues_in_use():
            with self._single() as conn:
                queued = [row[0] for row in conn.execute(_Q["queues_ready"], params)]
        claims: builtins.list[Claim] = []
        for name in queued:  # each in a transaction of its own, holding the queue's row
            if len(claims) >= limit:
                break
            claims += self._claim_queue(name, params, limit - len(claims))
        if len(claims) < limit:
            params["limit"] = limit - len(claims)
            with self._single() as conn:
                rows = conn.execute(_Q["claim"], params).fetchall()
            claims += [claim_from_row(row) for row in rows]
        return claims

    def _queues_in_use(self) -> bool:
        """Whether any queue is declared in the store. Until one is, claims skip the
        look for queued work (a round trip to the server), and ask again at most every
        ``QUEUES_LOOK`` seconds: a queue declared through this store counts at once, one
        declared by another process within that time."""
        if self._queues:
            return True
        now = time.monotonic()
        if now - self._queues_looked >= QUEUES_LOOK:
            self._queues_looked = now
            with self._single() as conn:
                row = conn.execute(_Q["queues_any"]).fetchone()
            self._queues = bool(row and row[0])
        return self._queues

    def _claim_queue(self, name: str, params: dict[str, Any], limit: int
                     ) -> builtins.list[Claim]:
        """Claim what queue ``name`` has room for, holding its row (``queue_lock``) while
        its slots are counted and taken: claims of one queue take turns over every node."""
        with self._tx() as conn:
            row = conn.execute(_Q["queue_lock"], (name,)).fetchone()
            if row is None:
                return []
            queue = queue_row(row)
            held = conn.execute(_Q["queue_held"], {"queue": name, "owner": params["owner"]})
            started = 0
            if queue.rate_period is not None:
                got = conn.execute(_Q["queue_started"], {"queue": name,
                                                         "period": queue.rate_period})
                started = int(got.fetchone()[0])  # type: ignore[index]
            load = load_of(held.fetchall(), started)
            room = flow.room(queue, load, limit)
            found = conn.execute(_Q["queue_candidates"], {
                **params, "queue": name, "room": room.slots > 0, "fresh": room.fresh,
                "full": builtins.list(room.full_keys), "scan": scan_size(limit)}).fetchall()
            chosen = flow.admit(queue, load, candidates(found), limit)
            if not chosen:
                return []
            rows = conn.execute(_Q["claim_queued"], {**params, "ids": chosen}).fetchall()
        return [claim_from_row(row) for row in rows]

    # -- queues ----------------------------------------------------------------

    def declare_queue(self, queue: flow.Queue, now: float) -> flow.Queue | None:
        """Keep ``queue``'s limits; those it replaced, if they differed."""
        self._queues = True
        with self._tx() as conn:
            row = conn.execute(_Q["queue_lock"], (queue.name,)).fetchone()
            conn.execute(_Q["declare_queue"], queue_params(queue, now))
        before = None if row is None else queue_row(row)
        return None if before is None or before.same_limits(queue) else before

    def queues(self) -> builtins.list[flow.Queue]:
        """Every declared queue, by name."""
        with self._single() as conn:
            return [queue_row(row) for row in conn.execute(_Q["queues"])]

    def queue_stats(self, now: float) -> builtins.list[QueueStats]:
        """Every declared queue and what it holds (leases by the database clock)."""
        with self._single() as conn:
            return [stats_row(row) for row in conn.execute(_Q["queue_stats"], {"now": now})]

    def queue_holder(self, queue: str, dedupe_key: str) -> str | None:
        """The live object of ``queue`` holding ``dedupe_key``, if any."""
        with self._single() as conn:
            row = conn.execute(_Q["queue_holder"], (queue, dedupe_key)).fetchone()
        return None if row is None else str(row[0])

    def debounce_start(self, object_id: str, dedupe_key: str, name: str, payload: bytes,
                       seal: bytes, ready_at: float, now: float) -> bool:
        """Queue ``name`` for an object not claimed yet and put its first claim off."""
        with self._tx() as conn:
            row = conn.execute(_Q["debounce_row"], (object_id,)).fetchone()
            if row is None or row[0] in _TERMINAL or row[1] != dedupe_key:
                return False
            if row[2] is not None:  # it started: the key goes free
                conn.execute(_Q["debounce_release"], (object_id, dedupe_key))
                return False
            conn.execute(_Q["insert_event"], (object_id, name, payload, None, now, seal))
            conn.execute(_Q["debounce_push"], {"ready_at": ready_at, "now": now,
                                               "object_id": object_id})
            return True

    # -- alerts ---------------------------------------------------------------------

    def fire_alert(self, rule: str, subject: str, summary: str, node_id: str,
                   now: float) -> bool:
        """Fire ``(rule, subject)`` unless firing; whether this call did."""
        with self._tx() as conn:
            return conn.execute(_Q["alert_fire"], {
                "rule": rule, "subject": subject, "summary": summary, "node_id": node_id,
                "now": now}).fetchone() is not None

    def resolve_alert(self, rule: str, subject: str, now: float) -> AlertRow | None:
        """Resolve ``(rule, subject)`` if firing; the row this call resolved."""
        with self._tx() as conn:
            row = conn.execute(_Q["alert_resolve"], {
                "rule": rule, "subject": subject, "now": now}).fetchone()
        return None if row is None else alert_of(row)

    def alerts(self, *, state: str | None = None, rule_prefix: str = "",
               limit: int = 100) -> builtins.list[AlertRow]:
        """Alerts, latest changed first."""
        with self._single() as conn:
            return [alert_of(row) for row in conn.execute(_Q["alerts"], {
                "state": state, "prefix": rule_prefix, "limit": limit})]

    # -- model quotas ---------------------------------------------------------------

    def declare_model_quota(self, quota: ModelQuota, now: float) -> ModelQuota | None:
        """Keep ``quota``'s limits; those it replaced, if they differed."""
        with self._tx() as conn:
            return declare_in(conn, _Q, "model_quota_lock", quota, now)

    def model_quotas(self) -> builtins.list[ModelQuota]:
        """Every declared quota, by provider and model."""
        with self._single() as conn:
            return [quota_of(row)[0] for row in conn.execute(_Q["model_quotas"])]

    def reserve_quota(self, provider: str, model: str, tokens: int, object_id: str,
                      holder: str, now: float) -> QuotaGrant:
        """Reserve holding the quota's row: reservations from every node take turns."""
        with self._tx() as conn:
            return reserve_in(conn, _Q, "model_quota_lock", provider, model, tokens,
                              object_id, holder, now)

    def settle_quota(self, ticket: int, tokens: int, now: float) -> None:
        """Settle reservation ``ticket`` to ``tokens``."""
        with self._tx() as conn:
            conn.execute(_Q["quota_settle"], {"ticket": ticket, "tokens": tokens, "now": now})

    def quota_throttled(self, provider: str, model: str, retry_after: float | None,
                        now: float) -> QuotaState | None:
        """Adapt the quota after a 429."""
        with self._tx() as conn:
            return throttled_in(conn, _Q, "model_quota_lock", provider, model, retry_after,
                                now)

    def quota_stats(self, now: float) -> builtins.list[QuotaStats]:
        """Every declared quota and its window at ``now``."""
        with self._single() as conn:
            return stats_in(conn, _Q, now)

    def renew(self, object_id: str, epoch: int, lease_until: float) -> Claim | None:
        """Extend the lease (by the database clock) if still held at ``epoch``."""
        with self._single() as conn:
            row = conn.execute(
                _Q["renew"],
                {"lease": max(0.0, lease_until - time.time()), "object_id": object_id,
                 "epoch": epoch},
            ).fetchone()
        return None if row is None else claim_from_row(row)

    # -- commits ---------------------------------------------------------------

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
            outcomes = self._apply_batch(ops, now, seals, savepoints=False)
        except RetryWithSavepoints:
            outcomes = self._apply_batch(ops, now, seals, savepoints=True)
        if ended := self._ended(ops, outcomes):
            try:
                with self._single() as conn:
                    conn.execute(_Q["notify_ended"], (ended,))
            except psycopg.Error:  # the commit stands; callers find the end by polling
                log.debug("end not notified", exc_info=True, extra={"action": "wake_not_sent"})
        return outcomes

    def _ended(self, ops: Sequence[Append], outcomes: Sequence[BaseException | None]
               ) -> builtins.list[str]:
        """The objects a commit ended or parked (told to this process's subscribers at
        once), for ``NOTIFY perdure_ended``."""
        for op in ops:
            if op.status in _TERMINAL or op.parked:
                break
        else:
            return []  # the step path: nothing ended
        ended = pushes(ops, outcomes, (ENDED,)).get(ENDED, [])
        if ended:
            self._hub.deliver(ENDED, ended)
        return ended

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
        if not consuming and any(map(careful, ops)):
            return None
        runs = distinct_runs(ops)
        if len(runs) != 1:
            return None
        loop = asyncio.get_running_loop()
        try:
            conn = await self._async_conn(loop)
            if consuming:
                outcomes = [await consume_async(conn, ops[0], now, seals)]
                await self._tell_ended_async(conn, ops, outcomes)
                return outcomes
            params = batch_params(runs[0], now, seals)
            query = append_query(runs[0])
            if waits := releases_waiting(ops):
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
                await self._drop_async_conn(loop)
            raise translate(exc, self._where) from exc
        outcomes = [outcome(op, done[index]) if index in done else fenced_out(op)
                    for index, op in enumerate(ops)]
        await self._tell_ended_async(conn, ops, outcomes)
        return outcomes

    async def _tell_ended_async(self, conn: psycopg.AsyncConnection[Any], ops: Sequence[Append],
                                outcomes: Sequence[BaseException | None]) -> None:
        """``NOTIFY perdure_ended`` for the objects a commit made on the loop ended."""
        if ended := self._ended(ops, outcomes):
            try:
                await conn.execute(_Q["notify_ended"], (ended,))
            except psycopg.Error:  # the commit stands; callers find the end by polling
                log.debug("end not notified", exc_info=True, extra={"action": "wake_not_sent"})

    def writer(self, executor: concurrent.futures.Executor) -> Writer:
        """Commits awaited on the event loop (``apply_async``), and on the write thread
        (``apply``) for the batches it leaves (see ``AsyncWriter``)."""
        return AsyncWriter(self.apply_async, self.apply, executor)

    async def open_async(self) -> None:
        """Open the running loop's asynchronous connection now and prepare its commit
        statements (running them on nothing): a worker does this as it starts, so that
        its first commit, often the one that resumes an object, waits neither for a
        connection nor for a new server process to plan its first statements."""
        try:
            conn = await self._async_conn(asyncio.get_running_loop())
            await conn.execute(_Q["append"], batch_params([], 0.0), prepare=True)
            await conn.execute(_Q["consume_event"], (0, -1, ""), prepare=True)
        except psycopg.Error as exc:
            raise translate(exc, self._where) from exc

    async def close_async(self) -> None:
        """Close the running loop's asynchronous connection (a worker does as it stops)."""
        await self._drop_async_conn(asyncio.get_running_loop())

    def check_damage(self) -> None:
        """Nothing to check beforehand: the server checks its own pages (data checksums)
        and a query on a damaged one fails with the server's error."""

    def _apply_batch(self, ops: Sequence[Append], now: float, seals: Sequence[CommitSeal], *,
                     savepoints: bool) -> builtins.list[BaseException | None]:
        if not savepoints and not any(map(careful, ops)):
            # No BEGIN/COMMIT round trips: one statement is its own transaction, and
            # several in one pipeline run as one implicit transaction up to its sync.
            with self._tx(transaction=False) as conn:
                return apply_plain(conn, ops, now, seals)
        results: builtins.list[BaseException | None] = []
        with self._tx() as conn:
            if seals:
                conn.execute(_Q["insert_seals"], {"seals": seals_param(seals)})
            for alone, run in itertools.groupby(ops, lambda op: savepoints or careful(op)):
                if alone:
                    results.extend(apply_alone(conn, op, now) for op in run)
                else:  # a run of plain appends, still in op order
                    results.extend(apply_plain(conn, builtins.list(run), now))
        return results

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

        The store's listening thread holds one connection with ``LISTEN`` on its channels
        (opened with the first subscriber, kept until ``close``) and reconnects by itself
        when the server goes away (logging once per outage); each (re)connection tells
        every subscriber to look again (``""``).
        """
        return self._hub.add((WAKE,), callback)

    def subscribe_results(self, callback: Callable[[str], None], *,
                          object_id: str | None = None, changes: bool = False
                          ) -> Callable[[], None] | None:
        """Call ``callback(object_id)`` when an object (``object_id`` only, if given) ended
        or was parked (``NOTIFY perdure_ended``); returns ``stop``. Changes are not pushed
        (a notification per commit would queue every commit on the server's notification
        lock): ``None`` with ``changes``, and followers poll."""
        if changes:
            return None
        return self._hub.add((ENDED,), callback, object_id)

    def _listen_for(self, kinds: frozenset[str]) -> None:
        """Start the listening thread with the first subscriber."""
        with self._hub_lock:
            if not kinds or self._listening is not None:
                return
            thread = threading.Thread(target=self._listen, name="perdure-listen",
                                      daemon=True)
            self._listening = thread
            thread.start()

    def _listen(self) -> None:
        stopped = self._stop_listening
        hub = self._hub
        down = False
        while not stopped.is_set():
            try:
                with psycopg.connect(self.conninfo, autocommit=True,
                                     connect_timeout=max(1, int(self._connect_timeout))
                                     ) as conn:
                    conn.execute(_Q["listen"])
                    conn.execute(_Q["listen_ended"])
                    if down:
                        log.warning("wake-up channel reconnected",
                                    extra={"action": "listen_up"})
                        down = False
                    hub.everyone()  # catch up on anything missed while not listening
                    while not stopped.is_set():
                        for note in conn.notifies(timeout=0.5):
                            hub.deliver(_CHANNELS.get(note.channel, WAKE), (note.payload,))
            except psycopg.Error as exc:
                if not down:
                    log.error("wake-up channel lost (%s); polling until it is back",
                              str(exc).strip().splitlines()[0] if str(exc).strip() else exc,
                              extra={"action": "listen_down"})
                    down = True
                stopped.wait(1.0)

    def close(self) -> None:
        """Stop the listening thread, then close every connection."""
        self._stop_listening.set()
        self._hub.clear()
        thread = self._listening
        if thread is not None:
            thread.join(timeout=5)
        super().close()

    def heartbeat(self, node_id: str, public_key: bytes, serves: Sequence[str],
                  capabilities: Sequence[str], now: float, live_until: float) -> None:
        """Record that ``node_id`` is alive until ``live_until``, what it serves and can do."""
        with self._single() as conn:
            conn.execute(_Q["heartbeat"], {"serves": sorted(serves), "caps": sorted(capabilities),
                                           "now": now, "live_until": live_until,
                                           "public_key": public_key,
                                           "node_id": node_id})

    def node_gone(self, node_id: str, now: float) -> None:
        """Record that ``node_id`` stopped: it no longer counts as live."""
        with self._single() as conn:
            conn.execute(_Q["node_gone"], {"now": now, "node_id": node_id})

    def live_nodes(self, now: float) -> builtins.list[NodeInfo]:
        """Nodes live at ``now``."""
        with self._single() as conn:
            rows = conn.execute(_Q["live_nodes"], {"now": now}).fetchall()
        return [NodeInfo(r[0], tuple(r[1]), tuple(r[2]), float(r[3]), float(r[4]))
                for r in rows]
