# ruff: noqa: S608 - statements are built from fixed text and placeholders only; every
# value travels as a bound parameter.
"""The dashboard's reads that the ``Store`` protocol has no call for: a filtered, paged
listing of objects, what each node runs, and the last hour's figures.

Read-only SQL on the SQLite or PostgreSQL store, through the store's own connections.
Paging is by key (``created_at``, ``object_id``), never by offset, so that page 1,000 of
100,000 objects costs what page 1 does (the ``objects_created`` index serves it).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

from perdure.core.lifecycle import Status
from perdure.core.records import Record
from perdure.errors import ConfigurationError
from perdure.stores.base import ObjectRow, Store

__all__ = ["Filters", "Page", "Queries", "decode_cursor", "encode_cursor"]

_FILTERS = ("status", "phase", "agent", "version", "label", "parent", "node", "since",
            "until", "q")


@dataclass(frozen=True, slots=True)
class Filters:
    """What the objects list is narrowed to; ``None`` matches everything.

    ``label`` is ``key=value``; ``since``/``until`` bound the creation time (epoch
    seconds, or an ISO date and time); ``q`` is an object id or the start of one.
    """

    status: str | None = None
    phase: str | None = None
    agent: str | None = None
    version: str | None = None
    label: str | None = None
    parent: str | None = None
    node: str | None = None
    since: float | None = None
    until: float | None = None
    q: str | None = None

    @classmethod
    def from_query(cls, params: dict[str, str]) -> Filters:
        """From a request's query parameters; ``ConfigurationError`` for bad values."""
        def text(name: str) -> str | None:
            value = params.get(name, "").strip()
            if len(value) > 1000 or "\x00" in value:
                raise ConfigurationError(f"filter {name} is too long or holds a NUL")
            return value or None

        def number(name: str) -> float | None:
            value = text(name)
            if value is None:
                return None
            try:
                got = float(value)
            except ValueError:
                try:  # a date and time, local unless it says its offset
                    got = dt.datetime.fromisoformat(value).timestamp()
                except (ValueError, OverflowError, OSError):
                    raise ConfigurationError(
                        f"filter {name} must be a time (2026-11-24 09:30, or seconds since "
                        f"the epoch), not {value!r}") from None
            if got != got or abs(got) > 1e12:
                raise ConfigurationError(f"filter {name} is out of range")
            return got

        status = text("status")
        if status is not None and status not in set(Status):
            raise ConfigurationError(f"unknown status {status!r}; one of "
                                     f"{', '.join(s.value for s in Status)}")
        label = text("label")
        if label is not None and "=" not in label:
            raise ConfigurationError("filter label must look like key=value")
        return cls(status=status, phase=text("phase"), agent=text("agent"),
                   version=text("version"), label=label, parent=text("parent"),
                   node=text("node"), since=number("since"), until=number("until"),
                   q=text("q"))

    def query(self) -> dict[str, str]:
        """The filters as query parameters (to link the next page)."""
        out = {}
        for name in _FILTERS:
            value = getattr(self, name)
            if value is not None:
                out[name] = f"{value:g}" if isinstance(value, float) else str(value)
        return out


@dataclass(frozen=True, slots=True)
class Page:
    """One page of the objects list, and the cursor of the next (``None``: last page)."""

    rows: list[ObjectRow]
    next_cursor: str | None


def encode_cursor(row: ObjectRow) -> str:
    """The cursor after ``row``."""
    raw = json.dumps([row.created_at, row.object_id]).encode()
    return base64.urlsafe_b64encode(raw).decode()


def decode_cursor(cursor: str) -> tuple[float, str]:
    """``(created_at, object_id)`` of a cursor; ``ConfigurationError`` if it is not one."""
    try:
        created, oid = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        if not isinstance(oid, str) or isinstance(created, bool):
            raise ValueError(cursor)
        return float(created), oid
    except (ValueError, TypeError, binascii.Error, UnicodeError):
        raise ConfigurationError("the page cursor is damaged; start again from the first "
                                 "page") from None


def _like(prefix: str) -> str:
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


class Queries:
    """The dashboard's SQL on ``store`` (a SQLite or PostgreSQL store)."""

    def __init__(self, store: Store) -> None:
        from perdure.stores.sqlite import SQLiteStore

        self.store = store
        self.sqlite = isinstance(store, SQLiteStore)
        if not self.sqlite:
            from perdure.stores.postgres import PostgresStore

            if not isinstance(store, PostgresStore):
                raise ConfigurationError(
                    f"the dashboard reads SQLite or PostgreSQL stores, not "
                    f"{type(store).__name__}")

    # -- plumbing --------------------------------------------------------------------

    def _p(self, name: str) -> str:
        return f":{name}" if self.sqlite else f"%({name})s"

    @contextmanager
    def _cursor(self) -> Iterator[Any]:
        if self.sqlite:
            with self.store._read() as conn:  # type: ignore[attr-defined]
                yield conn
        else:
            with self.store._single() as conn:  # type: ignore[attr-defined]
                yield conn

    def _rows(self, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        with self._cursor() as conn:
            return list(conn.execute(sql, params).fetchall())

    def _objects(self, sql: str, params: dict[str, Any]) -> list[ObjectRow]:
        convert: Callable[[Any, tuple[Any, ...]], ObjectRow]
        if self.sqlite:
            from perdure.stores._sqlite_file import object_of as convert
        else:
            from perdure.stores.postgres import _object_of as convert
        with self._cursor() as conn:
            cur = conn.execute(sql, params)
            return [convert(cur, row) for row in cur.fetchall()]

    # -- the objects list ------------------------------------------------------------

    def page(self, filters: Filters, *, cursor: str | None = None, limit: int = 50,
             now: float | None = None) -> Page:
        """Objects matching ``filters``, newest first, ``limit`` at a time after
        ``cursor``."""
        now = time.time() if now is None else now
        p = self._p
        where: list[str] = []
        params: dict[str, Any] = {"limit": limit + 1, "now": now}
        status = filters.status
        if status == Status.PARKED:
            where.append("parked = TRUE")
        elif status == Status.PAUSED:
            where.append("paused = TRUE AND parked = FALSE")
        elif status == Status.RUNNING:
            where.append(f"lease_owner IS NOT NULL AND lease_expires > {p('now')}")
        elif status is not None:
            params["status"] = status
            where.append(f"status = {p('status')}")
            if status not in (Status.COMPLETED, Status.FAILED, Status.CANCELLED):
                where.append("parked = FALSE AND paused = FALSE")
        for column, name in (("phase", "phase"), ("agent", "agent"),
                             ("agent_version", "version"), ("parent_id", "parent")):
            value = getattr(filters, name)
            if value is not None:
                params[name] = value
                where.append(f"{column} = {p(name)}")
        if filters.node is not None:
            params["node"] = _like(filters.node + "/")
            where.append(f"lease_owner LIKE {p('node')} ESCAPE '\\' "
                         f"AND lease_expires > {p('now')}")
        if filters.since is not None:
            params["since"] = filters.since
            where.append(f"created_at >= {p('since')}")
        if filters.until is not None:
            params["until"] = filters.until
            where.append(f"created_at <= {p('until')}")
        if filters.q is not None:
            params["q"] = _like(filters.q)
            where.append(f"object_id LIKE {p('q')} ESCAPE '\\'")
            if self.sqlite:  # a range on the primary key as well: SQLite's LIKE uses none
                params["q_lo"], params["q_hi"] = filters.q, filters.q + "\U0010ffff"
                where.append("object_id >= :q_lo AND object_id < :q_hi")
        if filters.label is not None:
            key, _, value = filters.label.partition("=")
            params["lk"], params["lv"] = key.strip(), value.strip()
            if self.sqlite:
                found = ("json_extract(CAST(r.body AS TEXT), '$.context.labels.' || "
                         "json_quote(:lk)) = :lv")
            else:
                found = ("convert_from(r.body, 'UTF8')::jsonb -> 'context' -> 'labels' "
                         "->> %(lk)s = %(lv)s")
            where.append("EXISTS (SELECT 1 FROM records r WHERE r.object_id = "
                         "objects.object_id AND r.seq = 1 AND r.kind = 'instantiated' AND "
                         f"{found})")
        if cursor:
            params["c_at"], params["c_id"] = decode_cursor(cursor)
            where.append(f"(created_at < {p('c_at')} OR (created_at = {p('c_at')} "
                         f"AND object_id > {p('c_id')}))")
        sql = ("SELECT * FROM objects" + (" WHERE " + " AND ".join(where) if where else "")
               + f" ORDER BY created_at DESC, object_id LIMIT {p('limit')}")
        rows = self._objects(sql, params)
        more = len(rows) > limit
        rows = rows[:limit]
        return Page(rows, encode_cursor(rows[-1]) if more and rows else None)

    def records_of(self, object_id: str, kinds: Sequence[str], limit: int = 200
                   ) -> list[Record]:
        """The object's records of ``kinds``, oldest first, at most ``limit`` (its intent
        and refinements, when its memory is too long to read whole for a page)."""
        from perdure.stores._rows import record_from_row

        p = self._p
        marks = ",".join(p(f"k{n}") for n in range(len(kinds)))
        params: dict[str, Any] = {f"k{n}": k for n, k in enumerate(kinds)}
        params.update(oid=object_id, limit=limit)
        sql = ("SELECT object_id, seq, trace_id, ts_us, node_id, policy_ref, kind, body, "
               f"prev_hash, hash, signature FROM records WHERE object_id = {p('oid')} AND "
               f"kind IN ({marks}) ORDER BY seq LIMIT {p('limit')}")
        rows = self._rows(sql, params)
        return [record_from_row(tuple(bytes(v) if isinstance(v, memoryview) else v
                                      for v in row)) for row in rows]

    def refused_while_waiting(self, object_ids: Sequence[str]) -> dict[str, list[Record]]:
        """Per object of ``object_ids``, the events refused since it last went dormant
        (``event_refused`` records after its newest ``dormant`` one), oldest first: what
        was sent to its current wait and did not count."""
        from perdure.stores._rows import record_from_row

        if not object_ids:
            return {}
        p = self._p
        marks = ",".join(p(f"o{n}") for n in range(len(object_ids)))
        params: dict[str, Any] = {f"o{n}": oid for n, oid in enumerate(object_ids)}
        params.update(refused="event_refused", dormant="dormant")
        sql = ("SELECT r.object_id, r.seq, r.trace_id, r.ts_us, r.node_id, r.policy_ref, "
               "r.kind, r.body, r.prev_hash, r.hash, r.signature FROM records r "
               f"WHERE r.object_id IN ({marks}) AND r.kind = {p('refused')} AND r.seq > "
               "(SELECT COALESCE(MAX(d.seq), 0) FROM records d WHERE d.object_id = "
               f"r.object_id AND d.kind = {p('dormant')}) ORDER BY r.object_id, r.seq")
        found: dict[str, list[Record]] = {}
        for row in self._rows(sql, params):
            rec = record_from_row(tuple(bytes(v) if isinstance(v, memoryview) else v
                                        for v in row))
            found.setdefault(rec.object_id, []).append(rec)
        return found

    def counts(self) -> dict[str, int]:
        """How many objects the store holds per stored status."""
        return {str(s): int(n) for s, n in
                self._rows("SELECT status, COUNT(*) FROM objects GROUP BY status", {})}

    # -- the nodes ----------------------------------------------------------

    def running_on(self, now: float) -> dict[str, list[str]]:
        """Object ids by the node holding their lease now."""
        sql = (f"SELECT lease_owner, object_id FROM objects WHERE lease_owner IS NOT NULL "
               f"AND lease_expires > {self._p('now')} ORDER BY object_id LIMIT 10000")
        running: dict[str, list[str]] = {}
        for owner, oid in self._rows(sql, {"now": now}):
            running.setdefault(str(owner).rpartition("/")[0] or str(owner), []).append(oid)
        return running

    # -- the last hour ---------------------------------------------------------------------

    def hour(self, now: float | None = None, *, sample: int = 500) -> dict[str, Any]:
        """Per minute over the last hour: objects completed, failed or cancelled, model
        spend, and wake latency (seconds between a due timer or a sent event and the
        record of the object taking it up), from the ``sample`` objects updated most
        recently."""
        now = time.time() if now is None else now
        since = now - 3600
        p = self._p
        minute = [0.0] * 60

        def slot(ts: float) -> int:
            return min(59, max(0, int((ts - since) // 60)))

        done, failed = list(minute), list(minute)
        ended = self._rows(
            f"SELECT status, updated_at FROM objects WHERE updated_at >= {p('since')} "
            "AND status IN ('completed', 'failed', 'cancelled')", {"since": since})
        for status, at in ended:
            (done if status == "completed" else failed)[slot(float(at))] += 1
        recent = self._rows(
            f"SELECT object_id FROM objects WHERE updated_at >= {p('since')} "
            f"ORDER BY updated_at DESC LIMIT {p('sample')}", {"since": since, "sample": sample})
        spend, latency, count = list(minute), list(minute), [0] * 60
        ids = [r[0] for r in recent]
        events: dict[int, float] = {}
        for chunk in _chunks(ids, 100):
            marks = ",".join(p(f"i{n}") for n in range(len(chunk)))
            params: dict[str, Any] = {f"i{n}": oid for n, oid in enumerate(chunk)}
            params["since"] = int(since * 1_000_000)
            rows = self._rows(
                "SELECT object_id, seq, kind, ts_us, body FROM records WHERE object_id IN "
                f"({marks}) AND ts_us >= {p('since')} AND kind IN ('model_call', 'dormant', "
                "'woke', 'event_received') ORDER BY object_id, seq", params)
            wake_at: dict[str, float] = {}
            pending: list[tuple[int, float]] = []
            for oid, _seq, kind, ts_us, body in rows:
                ts = int(ts_us) / 1_000_000
                try:
                    data = json.loads(bytes(body))
                except (ValueError, TypeError):
                    continue
                if not isinstance(data, dict):
                    continue
                if kind == "model_call":
                    with suppress(TypeError, ValueError):
                        spend[slot(ts)] += float(data.get("cost") or 0)
                elif kind == "dormant" and isinstance(data.get("wake_at"), int | float):
                    wake_at[oid] = float(data["wake_at"])
                elif kind == "woke" and oid in wake_at:
                    lag = max(0.0, ts - wake_at.pop(oid))
                    latency[slot(ts)] += lag
                    count[slot(ts)] += 1
                elif kind == "event_received" and isinstance(data.get("event_id"), int):
                    pending.append((int(data["event_id"]), ts))
            if pending:
                emarks = ",".join(p(f"e{n}") for n in range(len(pending)))
                sent = dict(self._rows(
                    f"SELECT event_id, sent_at FROM inbox WHERE event_id IN ({emarks})",
                    {f"e{n}": eid for n, (eid, _) in enumerate(pending)}))
                events.update({eid: float(at) for eid, at in sent.items()})
                for eid, ts in pending:
                    if eid in events:
                        latency[slot(ts)] += max(0.0, ts - events[eid])
                        count[slot(ts)] += 1
        mean = [latency[i] / count[i] if count[i] else 0.0 for i in range(60)]
        return {"since": since, "completed": done, "failed": failed, "spend": spend,
                "wake_latency": mean, "sampled_objects": len(ids)}


def _chunks(items: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]
