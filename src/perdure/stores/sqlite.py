"""SQLite store: one file shared by any number of worker processes (WAL mode).

Writes take ``BEGIN IMMEDIATE`` so that concurrent processes queue on SQLite's
lock instead of failing. Many appends are applied in one transaction (group
commit, ``_sqlite_commit``); a refused append (lost lease) does not undo the
others. The file itself (connections, migrations, damaged text) is ``_sqlite_file``'s;
every ``sqlite3`` error is translated there. The dashboard's reads (``Browse``) are
``_sqlite_browse``'s.

Wake-ups, ends and changes are pushed to the other processes on the same file through
a folder of Unix datagram sockets beside it (``_sqlite_wake``), and to this process's
own subscribers at once, after each commit that has something to tell.
"""

from __future__ import annotations

import builtins
import concurrent.futures
import functools
import json
import logging
import os
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

from perdure.core import flow
from perdure.core.chain import CommitSeal, chain_from_rows
from perdure.core.gc import gc_paused
from perdure.core.lifecycle import TERMINAL_STATUSES
from perdure.core.quotas import ModelQuota, QuotaState
from perdure.core.records import GENESIS_HASH, Record
from perdure.errors import (
    ObjectNotFoundError,
    ObjectTerminatedError,
    StoreError,
)
from perdure.stores._push import CHANGED, ENDED, WAKE, Hub, pushes
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
from perdure.stores._sqlite_browse import SQLiteBrowse
from perdure.stores._sqlite_commit import RetryWithSavepoints, apply_batch
from perdure.stores._sqlite_file import (
    Busy,
    bad_text,
    damaged_row,
    object_of,
    text,
)
from perdure.stores._sqlite_file import Q as _Q
from perdure.stores._sqlite_wake import WakeFolder
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
from perdure.stores.writers import InlineWriter

__all__ = ["SQLiteStore"]

log = logging.getLogger("perdure.store")

_TERMINAL = TERMINAL_STATUSES  # str values compare equal to their Status


@functools.cache
def _control_flags(count: int) -> str:
    """``control_flags`` for ``count`` object ids: its ``{marks}`` as that many ``?``."""
    return _Q["control_flags"].format(marks=",".join("?" * count))


def _ids(conn: sqlite3.Connection, params: dict[str, Any]) -> builtins.list[str]:
    """The claim candidates' ids; an id that is not UTF-8 (damage) is left out."""
    try:
        return [row[0] for row in conn.execute(_Q["claim_candidates"], params)]
    except sqlite3.OperationalError as exc:
        if not bad_text(exc):
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


class SQLiteStore(SQLiteBrowse):
    """A ``Store`` on one SQLite file.

    ``synchronous`` is ``"full"`` (every commit reaches the disk before it returns)
    or ``"normal"`` (WAL commits may be lost on power failure, never corrupted).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: str = "full",
        busy_timeout: float = 30.0,
        url: str | None = None,
    ) -> None:
        self.url = url or f"sqlite:///{path}"
        super().__init__(path, synchronous=synchronous, busy_timeout=busy_timeout)
        self._hub = Hub(self._listen_for)
        # No folder for a database in memory: only this process can see it anyway.
        in_memory = self.path in ("", ":memory:") or self.path.startswith("file:")
        self._wakes = None if in_memory else WakeFolder(self.path, self._hub)

    # -- pushed notifications ----------------------------------------------------

    def _listen_for(self, kinds: frozenset[str]) -> None:
        if self._wakes is not None:
            self._wakes.listen(kinds)

    def _subscribed(self, kinds: tuple[str, ...], callback: Callable[[str], None],
                    object_id: str | None = None) -> Callable[[], None] | None:
        stop = self._hub.add(kinds, callback, object_id)
        if self._wakes is not None and not self._wakes.listening:
            stop()  # the folder cannot be used here (logged once): the caller polls
            return None
        return stop

    def _tell(self, found: dict[str, list[str]]) -> None:
        """Push ``found`` (kind: object ids) to this process's subscribers and the others'."""
        self._hub.deliver_all(found)
        if self._wakes is not None:
            targets, _ = self._wakes.targets()
            if targets:
                self._wakes.send(found, targets)

    def _tell_commit(self, ops: Sequence[Append],
                     outcomes: Sequence[BaseException | None]) -> None:
        """Push what a group commit tells, to whoever wants it (nothing is built when
        nobody listens: the common case on the step path costs one ``stat``)."""
        wanted = self._hub.kinds()
        targets: dict[str, tuple[str, ...]] = {}
        if self._wakes is not None:
            targets, others = self._wakes.targets()
            wanted = wanted | others
        if not wanted:
            return
        found = pushes(ops, outcomes, wanted)
        if found:
            self._hub.deliver_all(found)
            if targets:
                assert self._wakes is not None
                self._wakes.send(found, targets)

    def subscribe(self, callback: Callable[[str], None]) -> Callable[[], None] | None:
        """Call ``callback(object_id)`` when an object may have become runnable or its due
        time changed, from this process's commits and, through the folder of sockets
        beside the file, from every other process's; ``None`` where the folder cannot be
        used (logged once), and nodes poll."""
        return self._subscribed((WAKE,), callback)

    def subscribe_results(self, callback: Callable[[str], None], *,
                          object_id: str | None = None, changes: bool = False
                          ) -> Callable[[], None] | None:
        """Call ``callback(object_id)`` when an object (``object_id`` only, if given) ended
        or was parked, and with ``changes`` whenever records were committed to it; pushed
        as ``subscribe`` pushes (``None`` where it cannot)."""
        return self._subscribed((ENDED, CHANGED) if changes else (ENDED,), callback,
                                object_id)

    def close(self) -> None:
        """Stop listening, remove this process's socket, and close every connection."""
        self._hub.clear()
        if self._wakes is not None:
            self._wakes.close()
        super().close()

    # -- nodes -----------------------------------------------------------------

    def publish_trust(self, item_id: str, kind: str, body: bytes, now: float) -> None:
        """Keep a trust item (certificate or revocation) under ``item_id``, once."""
        with self._write() as conn:
            conn.execute(_Q["publish_trust"], (item_id, kind, body, now))

    def trust_items(self) -> builtins.list[tuple[str, bytes]]:
        """Every trust item as ``(kind, body)``, oldest first."""
        rows = self._rows(_Q["trust_items"], (), text_at=(0,))
        return [(row[0], bytes(row[1])) for row in rows]

    # -- data keys ----------------------------------------------------------------

    def data_key(self, object_id: str) -> DataKeyRow | None:
        """The object's wrapped data key, if it has one."""
        rows = self._rows(_Q["data_key"], (object_id,), text_at=(0, 1))
        return data_key_row(rows[0]) if rows else None

    def put_data_key(self, row: DataKeyRow, now: float) -> DataKeyRow:
        """Keep ``row`` unless the object has a data key already; the row kept."""
        with self._write() as conn:
            conn.execute(_Q["put_data_key"], (row.object_id, row.key_id, row.wrapped,
                                              int(row.seal_all), now))
            got = conn.execute(_Q["data_key"], (row.object_id,)).fetchone()
        return data_key_row(got)

    def data_keys_not_under(self, key_id: str, after: str, limit: int
                            ) -> builtins.list[DataKeyRow]:
        """Up to ``limit`` data keys wrapped under another key than ``key_id``."""
        rows = self._rows(_Q["data_keys_not_under"], (key_id, after, limit), text_at=(0, 1))
        return [data_key_row(row) for row in rows]

    def rewrap_data_key(self, old: DataKeyRow, key_id: str, wrapped: bytes,
                        now: float) -> bool:
        """Replace ``old`` by ``wrapped`` under ``key_id`` if the row is still ``old``."""
        with self._write() as conn:
            cur = conn.execute(_Q["rewrap_data_key"], (key_id, wrapped, now, old.object_id,
                                                      old.key_id, old.wrapped))
            return cur.rowcount == 1

    def data_key_counts(self) -> dict[str, int]:
        """How many data keys each key-encryption key id wraps."""
        return {row[0]: int(row[1]) for row in self._rows(_Q["data_key_counts"], (),
                                                           text_at=(0,))}

    # -- checkpoint slots ---------------------------------------------------------

    def put_checkpoint(self, row: CheckpointRow) -> bool:
        """Upsert ``row`` if the object's lease is still at ``row.epoch``."""
        with self._write() as conn:
            cur = conn.execute(_Q["put_checkpoint"], (
                row.object_id, row.slot, row.epoch, row.after_seq, row.after_hash, row.body,
                row.signer, row.signature, row.written_at))
            return cur.rowcount == 1

    def checkpoints(self, object_id: str) -> builtins.list[CheckpointRow]:
        """Every slot row of ``object_id``, by slot."""
        rows = self._rows(_Q["checkpoints"], (object_id,), text_at=(0, 1, 4, 6))
        return [checkpoint_row(row) for row in rows]

    def delete_checkpoints(self, object_id: str, slots: Sequence[str] | None,
                           epoch: int | None) -> bool:
        """Delete ``slots`` (``None``: all) of ``object_id``, fenced on ``epoch``."""
        with self._write() as conn:
            if epoch is not None and conn.execute(_Q["checkpoint_fence"],
                                                  (object_id, epoch)).fetchone() is None:
                return False
            if slots is None:
                conn.execute(_Q["delete_checkpoints"], (object_id,))
            else:
                conn.executemany(_Q["delete_checkpoint"], [(object_id, s) for s in slots])
        return True

    # -- objects and records ---------------------------------------------------

    def create(self, new: NewObject, now: float) -> bool:
        """Insert the object row and its first record in one transaction."""
        with self._write() as conn:
            query = "insert_object" if new.queue is None else "insert_queued_object"
            cur = conn.execute(_Q[query], create_params(new, now, json.dumps))
            if cur.rowcount == 0:
                return False
            conn.execute(_Q["insert_record"], record_params(new.first))
        self._tell({WAKE: [new.object_id]})
        return True

    def get(self, object_id: str) -> ObjectRow | None:
        """The object's row, or ``None``. Text that is not UTF-8 (damage) reads as U+FFFD."""
        try:
            with self._read() as conn:
                cur = conn.execute(_Q["get_object"], (object_id,))
                row = cur.fetchone()
                return None if row is None else object_of(cur, row)
        except StoreError as exc:
            if not bad_text(exc):
                raise
        columns, rows = self._as_bytes(_Q["get_object"], (object_id,))
        return damaged_row(columns, rows[0]) if rows else None

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
        sql = _Q[list_query(status=status, agent=agent, parent=parent)]
        params = {"status": status, "phase": phase, "agent": agent, "parent": parent,
                  "limit": limit}
        try:
            with self._read() as conn:
                cur = conn.execute(sql, params)
                return [object_of(cur, row) for row in cur.fetchall()]
        except StoreError as exc:
            if not bad_text(exc):
                raise
        columns, rows = self._as_bytes(sql, params)
        return [damaged_row(columns, row) for row in rows]

    def records(self, object_id: str, after_seq: int = 0) -> builtins.list[Record]:
        """Records after ``after_seq``, decoded; ``RecordDecodeError`` on damage."""
        with gc_paused():  # a long history: many new containers
            try:
                with self._read() as conn:
                    rows = conn.execute(_Q["records_after"], (object_id, after_seq)).fetchall()
            except StoreError as exc:
                if not bad_text(exc):
                    raise
                # Text that is not UTF-8: read it as bytes, and the decoder names the column.
                _, rows = self._as_bytes(_Q["records_after"], (object_id, after_seq))
            return [record_from_row(row) for row in rows]

    def record(self, object_id: str, seq: int) -> Record | None:
        """The object's record ``seq``, decoded, or ``None``; ``RecordDecodeError`` on
        damage."""
        try:
            with self._read() as conn:
                rows = conn.execute(_Q["record_at"], (object_id, seq)).fetchall()
        except StoreError as exc:
            if not bad_text(exc):
                raise
            _, rows = self._as_bytes(_Q["record_at"], (object_id, seq))
        return record_from_row(rows[0]) if rows else None

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
            found = _ids(conn, params)
            queued = [row[0] for row in conn.execute(_Q["queues_ready"], {"now": now})]
        if not found and not queued:
            return []
        claims: builtins.list[Claim] = []
        with self._write() as conn:
            # Queues first, each counted under the write lock: claims from every process
            # take turns, so together they never exceed a queue's limits.
            for name in queued:
                if len(claims) >= limit:
                    break
                claims += self._claim_queue(conn, name, owner, now, lease_until,
                                            limit - len(claims), params)
            rest = params["limit"] = limit - len(claims)
            # Choose again under the write lock: another node may have claimed the rows
            # read above, and this claim should still get a full batch of the others.
            for object_id in _ids(conn, params) if found and rest > 0 else ():
                row = conn.execute(
                    _Q["claim_one"],
                    {"owner": owner, "lease_until": lease_until, "now": now,
                     "object_id": object_id},
                ).fetchone()
                if row is not None:
                    claims.append(claim_from_row(row))
        return claims

    @staticmethod
    def _claim_queue(conn: sqlite3.Connection, name: str, owner: str, now: float,
                     lease_until: float, limit: int, params: dict[str, Any]
                     ) -> builtins.list[Claim]:
        """Claim what queue ``name`` has room for (the caller holds the write lock)."""
        row = conn.execute(_Q["queue_row"], (name,)).fetchone()
        if row is None:
            return []
        queue = queue_row(row)
        held = conn.execute(_Q["queue_held"], {"queue": name, "owner": owner, "now": now})
        load = held.fetchall()
        started = 0
        if queue.rate_period is not None:
            started = int(conn.execute(_Q["queue_started"], {
                "queue": name, "since": now - queue.rate_period}).fetchone()[0])
        got = load_of(load, started)
        room = flow.room(queue, got, limit)
        found = conn.execute(_Q["queue_candidates"], {
            **params, "queue": name, "room": room.slots > 0, "fresh": room.fresh,
            "full": json.dumps(builtins.list(room.full_keys)),
            "scan": scan_size(limit)}).fetchall()
        claims = []
        for object_id in flow.admit(queue, got, candidates(found), limit):
            claimed = conn.execute(_Q["claim_queued_one"], {
                "owner": owner, "lease_until": lease_until, "now": now,
                "object_id": object_id}).fetchone()
            if claimed is not None:
                claims.append(claim_from_row(claimed))
        return claims

    # -- queues ----------------------------------------------------------------

    def declare_queue(self, queue: flow.Queue, now: float) -> flow.Queue | None:
        """Keep ``queue``'s limits; those it replaced, if they differed."""
        with self._write() as conn:
            row = conn.execute(_Q["queue_row"], (queue.name,)).fetchone()
            conn.execute(_Q["declare_queue"], queue_params(queue, now))
        before = None if row is None else queue_row(row)
        return None if before is None or before.same_limits(queue) else before

    def queues(self) -> builtins.list[flow.Queue]:
        """Every declared queue, by name."""
        with self._read() as conn:
            return [queue_row(row) for row in conn.execute(_Q["queues"])]

    def queue_stats(self, now: float) -> builtins.list[QueueStats]:
        """Every declared queue and what it holds at ``now``."""
        with self._read() as conn:
            return [stats_row(row) for row in conn.execute(_Q["queue_stats"], {"now": now})]

    def queue_holder(self, queue: str, dedupe_key: str) -> str | None:
        """The live object of ``queue`` holding ``dedupe_key``, if any."""
        with self._read() as conn:
            row = conn.execute(_Q["queue_holder"], (queue, dedupe_key)).fetchone()
        return None if row is None else str(row[0])

    def debounce_start(self, object_id: str, dedupe_key: str, name: str, payload: bytes,
                       seal: bytes, ready_at: float, now: float) -> bool:
        """Queue ``name`` for an object not claimed yet and put its first claim off."""
        with self._write() as conn:
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
        with self._write() as conn:
            return conn.execute(_Q["alert_fire"], {
                "rule": rule, "subject": subject, "summary": summary, "node_id": node_id,
                "now": now}).fetchone() is not None

    def resolve_alert(self, rule: str, subject: str, now: float) -> AlertRow | None:
        """Resolve ``(rule, subject)`` if firing; the row this call resolved."""
        with self._write() as conn:
            row = conn.execute(_Q["alert_resolve"], {
                "rule": rule, "subject": subject, "now": now}).fetchone()
        return None if row is None else alert_of(row)

    def alerts(self, *, state: str | None = None, rule_prefix: str = "",
               limit: int = 100) -> builtins.list[AlertRow]:
        """Alerts, latest changed first."""
        with self._read() as conn:
            return [alert_of(row) for row in conn.execute(_Q["alerts"], {
                "state": state, "prefix": rule_prefix, "limit": limit})]

    # -- model quotas ---------------------------------------------------------------

    def declare_model_quota(self, quota: ModelQuota, now: float) -> ModelQuota | None:
        """Keep ``quota``'s limits; those it replaced, if they differed."""
        with self._write() as conn:
            return declare_in(conn, _Q, "model_quota_row", quota, now)

    def model_quotas(self) -> builtins.list[ModelQuota]:
        """Every declared quota, by provider and model."""
        with self._read() as conn:
            return [quota_of(row)[0] for row in conn.execute(_Q["model_quotas"])]

    def reserve_quota(self, provider: str, model: str, tokens: int, object_id: str,
                      holder: str, now: float) -> QuotaGrant:
        """Reserve under the write lock: reservations from every process take turns."""
        with self._write() as conn:
            return reserve_in(conn, _Q, "model_quota_row", provider, model, tokens,
                              object_id, holder, now)

    def settle_quota(self, ticket: int, tokens: int, now: float) -> None:
        """Settle reservation ``ticket`` to ``tokens``."""
        with self._write() as conn:
            conn.execute(_Q["quota_settle"], {"ticket": ticket, "tokens": tokens, "now": now})

    def quota_throttled(self, provider: str, model: str, retry_after: float | None,
                        now: float) -> QuotaState | None:
        """Adapt the quota after a 429."""
        with self._write() as conn:
            return throttled_in(conn, _Q, "model_quota_row", provider, model, retry_after,
                                now)

    def quota_stats(self, now: float) -> builtins.list[QuotaStats]:
        """Every declared quota and its window at ``now``."""
        with self._read() as conn:
            return stats_in(conn, _Q, now)

    def renew(self, object_id: str, epoch: int, lease_until: float) -> Claim | None:
        """Extend the lease if still held at ``epoch``."""
        with self._write() as conn:
            row = conn.execute(
                _Q["renew"], {"lease_until": lease_until, "object_id": object_id, "epoch": epoch}
            ).fetchone()
        return None if row is None else claim_from_row(row)

    # -- commits ---------------------------------------------------------------

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
            outcomes = self._apply_batch(ops, now, seals, savepoints=False)
        except RetryWithSavepoints:
            outcomes = self._apply_batch(ops, now, seals, savepoints=True)
        self._tell_commit(ops, outcomes)
        return outcomes

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
                outcomes = self._apply_batch(ops, now, seals, savepoints=False, wait=False)
            except RetryWithSavepoints:
                outcomes = self._apply_batch(ops, now, seals, savepoints=True, wait=False)
        except Busy:
            return None
        self._tell_commit(ops, outcomes)
        return outcomes

    def _apply_batch(self, ops: Sequence[Append], now: float, seals: Sequence[CommitSeal], *,
                     savepoints: bool, wait: bool = True) -> builtins.list[BaseException | None]:
        with self._write(wait=wait) as conn:
            return apply_batch(conn, ops, now, seals, savepoints=savepoints)

    def writer(self, executor: concurrent.futures.Executor) -> Writer:
        """Commits on the event loop itself (``apply_now``), or on the write thread while
        another thread or process holds the write lock (see ``InlineWriter``)."""
        return InlineWriter(self.apply_now, self.apply, executor)

    async def open_async(self) -> None:
        """Nothing to open: the event loop commits on the store's own connection."""

    async def close_async(self) -> None:
        """Nothing to release: the event loop commits on the store's own connection."""

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
        self._tell({WAKE: [object_id]})
        return True

    def pending_events(self, object_id: str) -> builtins.list[Event]:
        """Unconsumed events in arrival order."""
        try:
            with self._read() as conn:
                rows = conn.execute(_Q["pending_events"], (object_id,)).fetchall()
        except StoreError as exc:
            if not bad_text(exc):
                raise
            # A damaged name reads with U+FFFD: its seal no longer matches, so the node
            # refuses the event with a record instead of delivering it.
            _, rows = self._as_bytes(_Q["pending_events"], (object_id,))
        return [Event(r[0], text(r[1]), text(r[2]), bytes(r[3]), text(r[4]), r[5],
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
        if cancel or unpark or paused is False:
            self._tell({WAKE: [object_id]})
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
                          text_at=(0, 1))
        return [(row[0], row[1], row[2]) for row in rows]

    def expire_lease(self, object_id: str, owner: str, epoch: int, now: float) -> bool:
        """End a lease at once when its holder is known to be dead."""
        with self._write() as conn:
            cur = conn.execute(
                _Q["expire_lease"],
                {"now": now, "object_id": object_id, "epoch": epoch, "owner": owner},
            )
            expired = cur.rowcount == 1
        if expired:
            self._tell({WAKE: [object_id]})
        return expired

    def control_flags(self, object_ids: Sequence[str]) -> dict[str, tuple[int, bool, bool]]:
        """Epoch and control flags of the given objects, in one read."""
        if not object_ids:
            return {}
        sql = _control_flags(len(object_ids))
        with self._read() as conn:
            rows = conn.execute(sql, tuple(object_ids)).fetchall()
        return {row[0]: (int(row[1]), bool(row[2]), bool(row[3])) for row in rows}

    def heartbeat(self, node_id: str, public_key: bytes, serves: Sequence[str],
                  capabilities: Sequence[str], now: float, live_until: float) -> None:
        """Record that ``node_id`` is alive until ``live_until``, what it serves and can do."""
        with self._write() as conn:
            conn.execute(_Q["heartbeat"], {"serves": json.dumps(sorted(serves)),
                                           "caps": json.dumps(sorted(capabilities)),
                                           "now": now, "live_until": live_until,
                                           "public_key": public_key,
                                           "node_id": node_id})

    def node_gone(self, node_id: str, now: float) -> None:
        """Record that ``node_id`` stopped: it no longer counts as live."""
        with self._write() as conn:
            conn.execute(_Q["node_gone"], {"now": now, "node_id": node_id})

    def live_nodes(self, now: float) -> builtins.list[NodeInfo]:
        """Nodes live at ``now``."""
        rows = self._rows(_Q["live_nodes"], {"now": now}, text_at=(0, 1, 2))
        found = []
        for r in rows:
            try:
                serves, caps = tuple(json.loads(r[1])), tuple(json.loads(r[2]))
            except ValueError:
                serves, caps = (), ()  # damaged: the node is shown serving nothing
            found.append(NodeInfo(r[0], serves, caps, float(r[3]), float(r[4])))
        return found
