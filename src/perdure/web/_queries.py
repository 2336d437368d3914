"""The dashboard's reads of a store: a filtered, paged listing of objects, what each node
runs, and the last hour's figures, all through the store's public ``Browse`` role (so any
store serves: SQLite, PostgreSQL, or one in memory). The inbox asks the App
(``App.questions``), as ``perdure questions`` does.

Paging is by key (``created_at``, ``object_id``), never by offset, so that page 1,000 of
100,000 objects costs what page 1 does. The web's own part is the form: parsing the
query string into ``Filters``, the cursor's encoding, and folding the raw figures.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import time
from collections.abc import Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from perdure.core.lifecycle import Status
from perdure.core.records import Record
from perdure.errors import ConfigurationError
from perdure.stores.base import ObjectFilter, ObjectRow, Store

_WAIT_RECORDS = 100_000  # dormancies and refusals read per waiting object, at most

__all__ = ["Filters", "Page", "Queries", "decode_cursor", "encode_cursor"]

# The record kinds the last hour's figures read.
_HOUR_KINDS = ("model_call", "dormant", "woke", "event_received")
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

    def where(self) -> ObjectFilter:
        """What the store's ``browse`` narrows the objects to."""
        label = None
        if self.label is not None:
            key, _, value = self.label.partition("=")
            label = (key.strip(), value.strip())
        return ObjectFilter(status=self.status, phase=self.phase, agent=self.agent,
                            version=self.version, label=label, parent=self.parent,
                            node=self.node, since=self.since, until=self.until,
                            prefix=self.q)

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


class Queries:
    """The dashboard's reads on ``store``, through its ``Browse`` role."""

    def __init__(self, store: Store) -> None:
        self.store = store

    # -- the objects list ------------------------------------------------------------

    def page(self, filters: Filters, *, cursor: str | None = None, limit: int = 50,
             now: float | None = None) -> Page:
        """Objects matching ``filters``, newest first, ``limit`` at a time after
        ``cursor``."""
        now = time.time() if now is None else now
        after = decode_cursor(cursor) if cursor else None
        rows = self.store.browse(filters.where(), after=after, limit=limit + 1, now=now)
        more = len(rows) > limit
        rows = rows[:limit]
        return Page(rows, encode_cursor(rows[-1]) if more and rows else None)

    def records_of(self, object_id: str, kinds: Sequence[str], limit: int = 200
                   ) -> list[Record]:
        """The object's records of ``kinds``, oldest first, at most ``limit`` (its intent
        and refinements, when its memory is too long to read whole for a page)."""
        return self.store.records_of_kinds(object_id, [str(k) for k in kinds], limit)

    def refused_while_waiting(self, object_ids: Sequence[str]) -> dict[str, list[Record]]:
        """Per object of ``object_ids``, the events refused since it last went dormant
        (``event_refused`` records after its newest ``dormant`` one), oldest first: what
        was sent to its current wait and did not count."""
        found: dict[str, list[Record]] = {}
        for object_id in object_ids:
            since: list[Record] = []
            for rec in self.store.records_of_kinds(object_id, ["dormant", "event_refused"],
                                                   _WAIT_RECORDS):
                since = [] if rec.kind == "dormant" else [*since, rec]
            if since:
                found[object_id] = since
        return found

    def counts(self) -> dict[str, int]:
        """How many objects the store holds per stored status."""
        return self.store.status_counts()

    # -- the nodes ----------------------------------------------------------------------

    def running_on(self, now: float) -> dict[str, list[str]]:
        """Object ids by the node holding their lease now."""
        running: dict[str, list[str]] = {}
        for oid, owner in self.store.lease_holders(now, 10_000):
            running.setdefault(owner.rpartition("/")[0] or owner, []).append(oid)
        return running

    # -- the last hour ---------------------------------------------------------------------

    def hour(self, now: float | None = None, *, sample: int = 500) -> dict[str, Any]:
        """Per minute over the last hour: objects completed, failed or cancelled, model
        spend, and wake latency (seconds between a due timer or a sent event and the
        record of the object taking it up), from the ``sample`` objects updated most
        recently."""
        now = time.time() if now is None else now
        since = now - 3600
        minute = [0.0] * 60

        def slot(ts: float) -> int:
            return min(59, max(0, int((ts - since) // 60)))

        done, failed = list(minute), list(minute)
        for status, at in self.store.ended_since(since):
            (done if status == "completed" else failed)[slot(at)] += 1
        spend, latency, count = list(minute), list(minute), [0] * 60
        ids = self.store.updated_since(since, sample)
        events: dict[int, float] = {}
        for chunk in _chunks(ids, 100):
            rows = self.store.bodies_since(chunk, _HOUR_KINDS, int(since * 1_000_000))
            wake_at: dict[str, float] = {}
            pending: list[tuple[int, float]] = []
            for row in rows:
                oid, kind, ts = row.object_id, row.kind, row.ts_us / 1_000_000
                try:
                    data = json.loads(row.body)
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
                events.update(self.store.sent_at([eid for eid, _ in pending]))
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
