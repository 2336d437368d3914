"""Heads a node has seen, kept outside the store, so a store moved backwards is caught.

Each node remembers, per object it ran, the highest ``(seq, hash)`` it wrote or checked,
keyed by the object's id and the hash of its first record (a store made anew with an
object of the same id is another object). Whoever controls the store can delete a tail
of records and set the row's head back: links and signatures still check, since every
prefix of a signed chain is signed too. A node that saw a later head refuses such a
store, naming the record it saw.

The heads live in memory while the node works and in a small SQLite file in the node's
key folder (``heads.db``), written in the background and when the node stops; at most
``limit`` objects are kept, the least recently seen dropped first.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

from perdure.core.records import Record

__all__ = ["HeadAnchors", "rollback_problem"]

log = logging.getLogger("perdure.worker")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS heads (
    object_id TEXT NOT NULL,
    genesis   TEXT NOT NULL,
    seq       INTEGER NOT NULL,
    hash      TEXT NOT NULL,
    seen_at   REAL NOT NULL,
    PRIMARY KEY (object_id, genesis)
);
CREATE TABLE IF NOT EXISTS forgotten (
    object_id TEXT PRIMARY KEY,  -- '*' for every object
    at        REAL NOT NULL
)
"""

_UPSERT = """
INSERT INTO heads (object_id, genesis, seq, hash, seen_at) VALUES (?, ?, ?, ?, ?)
ON CONFLICT (object_id, genesis) DO UPDATE
SET seq = excluded.seq, hash = excluded.hash, seen_at = excluded.seen_at
WHERE excluded.seq > heads.seq
"""

Head = tuple[str, int, str]  # (genesis hash, seq, hash)


def rollback_problem(head: Head | None, records: Sequence[Record], *, seen: bool = True
                     ) -> tuple[int, str] | None:
    """``(seq, reason)`` when ``records`` (a checked chain) does not reach or does not
    contain the ``head`` a node saw (``seen``) or an exported heads file holds, else
    ``None``."""
    if head is None or not records or records[0].hash != head[0]:
        return None
    _, seq, digest = head
    who = "this node saw" if seen else "the exported heads hold"
    if seen:
        hint = (" (if it was restored from a backup on purpose, run `perdure forget-heads "
                f"{records[0].object_id}` where this node runs, then resume it)")
    else:
        hint = " (or the heads file is from another store)"
    if len(records) < seq:
        return seq, (f"the store holds records up to #{len(records)}, but {who} "
                     f"#{seq} (hash {digest[:16]}…): the store was rolled back{hint}")
    if records[seq - 1].hash != digest:
        return seq, (f"record #{seq} differs from the one {who} (hash {digest[:16]}…): "
                     f"the history was rewritten{hint}")
    return None


class HeadAnchors:
    """The highest head this node wrote or checked, per object (bounded)."""

    def __init__(self, path: Path | None, *, limit: int = 100_000) -> None:
        self.path = path
        self.limit = limit
        self._mem: OrderedDict[str, Head] = OrderedDict()
        self._noted_at: dict[str, float] = {}  # when each head in memory was noted
        self._dirty: dict[str, Head] = {}
        self._lock = threading.Lock()  # the in-memory heads (held only briefly)
        self._db_lock = threading.Lock()  # the file
        self._db: sqlite3.Connection | None = None
        self._failed = False
        self._flushed_at = time.monotonic()

    def _conn(self) -> sqlite3.Connection | None:
        if self._db is not None or self._failed or self.path is None:
            return self._db
        try:
            conn = sqlite3.connect(self.path, timeout=5.0, isolation_level=None,
                                   check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.executescript(_SCHEMA)
            with contextlib.suppress(OSError):
                self.path.chmod(0o600)
        except (sqlite3.Error, OSError) as exc:
            self._failed = True
            log.warning("cannot keep seen heads in %s (%s): a rollback of the store is "
                        "caught only while this process runs", self.path, exc,
                        extra={"action": "heads_unavailable"})
            return None
        self._db = conn
        return conn

    def open(self) -> None:
        """Open the file now (a worker does as it starts, not at its first claim)."""
        with self._db_lock:
            self._conn()

    def get(self, object_id: str, genesis: str) -> Head | None:
        """The head seen for ``object_id`` (whose first record has hash ``genesis``)."""
        with self._lock:
            head = self._mem.get(object_id)
            if head is not None and head[0] == genesis:
                self._mem.move_to_end(object_id)
                return head
        with self._db_lock:
            conn = self._conn()
            if conn is None:
                return None
            try:
                row = conn.execute("SELECT seq, hash, seen_at FROM heads WHERE object_id = ? "
                                   "AND genesis = ?", (object_id, genesis)).fetchone()
            except sqlite3.Error:
                return None
        if row is None:
            return None
        found = (genesis, int(row[0]), str(row[1]))
        self.note(object_id, *found, dirty=False, at=float(row[2]))
        return found

    def note(self, object_id: str, genesis: str, seq: int, digest: str, *,
             dirty: bool = True, at: float | None = None) -> None:
        """This node wrote or checked ``object_id`` up to record ``seq`` with ``digest``
        (``at``: when, if not now)."""
        head = (genesis, seq, digest)
        with self._lock:
            mem = self._mem
            old = mem.get(object_id)
            if old is not None and old[0] == genesis and old[1] >= seq:
                return
            mem[object_id] = head
            self._noted_at[object_id] = time.time() if at is None else at
            if dirty:
                self._dirty[object_id] = head
            if len(mem) > self.limit:
                dropped, _ = mem.popitem(last=False)
                self._noted_at.pop(dropped, None)

    def check(self, object_id: str, records: Sequence[Record]) -> tuple[int, str] | None:
        """``(seq, reason)`` if ``records`` moved backwards from what this node saw.

        A head an operator told the node to forget since (``forget``, from any process
        of this node: ``perdure forget-heads``) no longer counts.
        """
        return self.seen(object_id, records)[0]

    def seen(self, object_id: str, records: Sequence[Record]
             ) -> tuple[tuple[int, str] | None, Head | None]:
        """``check`` and the head this node saw (if any), with one look-up."""
        if not records:
            return None, None
        head = self.get(object_id, records[0].hash)
        problem = rollback_problem(head, records)
        if problem is not None and self._forgotten_since_noted(object_id):
            with self._lock:
                self._mem.pop(object_id, None)
                self._dirty.pop(object_id, None)
                self._noted_at.pop(object_id, None)
            head = self.get(object_id, records[0].hash)
            problem = rollback_problem(head, records)
        return problem, head

    def _forgotten_since_noted(self, object_id: str) -> bool:
        noted = self._noted_at.get(object_id, 0.0)
        with self._db_lock:
            conn = self._conn()
            if conn is None:
                return False
            try:
                row = conn.execute("SELECT max(at) FROM forgotten WHERE object_id IN (?, '*')",
                                   (object_id,)).fetchone()
            except sqlite3.Error:
                return False
        return row is not None and row[0] is not None and float(row[0]) >= noted

    def flush(self) -> None:
        """Write the heads noted since the last flush to ``heads.db``."""
        with self._lock:
            dirty, self._dirty = self._dirty, {}
            noted = {oid: self._noted_at.get(oid, 0.0) for oid in dirty}
        with self._db_lock:
            conn = self._conn()
            if conn is None or not dirty:
                return
            try:
                conn.execute("BEGIN")
                # A head noted before an operator said to forget it (`perdure forget-heads`
                # from another process) is not written back.
                forgotten = dict(conn.execute("SELECT object_id, at FROM forgotten"))
                every = forgotten.get("*", -1.0)
                keep = {oid: head for oid, head in dirty.items()
                        if noted[oid] > max(every, forgotten.get(oid, -1.0))}
                conn.executemany(_UPSERT, [(oid, g, s, h, noted[oid])
                                           for oid, (g, s, h) in keep.items()])
                conn.execute("COMMIT")
                if time.monotonic() - self._flushed_at > 60:
                    self._flushed_at = time.monotonic()
                    conn.execute("DELETE FROM heads WHERE rowid NOT IN (SELECT rowid FROM "
                                 "heads ORDER BY seen_at DESC LIMIT ?)", (self.limit,))
            except sqlite3.Error as exc:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                log.warning("cannot write seen heads to %s: %s", self.path, exc,
                            extra={"action": "heads_unavailable"})

    def forget(self, object_ids: Sequence[str] | None = None) -> int:
        """Forget the heads of ``object_ids`` (all when ``None``): after a store was
        restored from a backup on purpose. Returns how many were forgotten."""
        with self._lock:
            if object_ids is None:
                count = len(self._mem)
                self._mem.clear()
                self._dirty.clear()
                self._noted_at.clear()
            else:
                count = 0
                for oid in object_ids:
                    count += self._mem.pop(oid, None) is not None
                    self._dirty.pop(oid, None)
                    self._noted_at.pop(oid, None)
        with self._db_lock:
            conn = self._conn()
            if conn is None:
                return count
            now = time.time()
            try:
                # The marker tells running workers of this node, which hold heads in
                # memory, to drop theirs too.
                if object_ids is None:
                    conn.execute("INSERT OR REPLACE INTO forgotten VALUES ('*', ?)", (now,))
                    return max(count, conn.execute("DELETE FROM heads").rowcount)
                stored = 0
                for oid in object_ids:
                    conn.execute("INSERT OR REPLACE INTO forgotten VALUES (?, ?)", (oid, now))
                    stored += conn.execute("DELETE FROM heads WHERE object_id = ?",
                                           (oid,)).rowcount
                return max(count, stored)
            except sqlite3.Error:
                return count

    def close(self) -> None:
        """Flush and close the file."""
        self.flush()
        with self._db_lock:
            if self._db is not None:
                self._db.close()
                self._db = None
