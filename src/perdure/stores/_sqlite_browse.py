"""The SQLite store's ``Browse`` role: what the dashboard reads, as named queries.

SQLite plans a statement before it sees its values, so the objects list is one query
in five forms (``browse_*`` in ``sql/sqlite/queries.sql``): the one led by the
``objects_created`` index, and four led by a filter another index serves. Text a
damaged file holds that is not UTF-8 is read with the damage marked, as ``list`` does.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Sequence
from typing import Any

from perdure.core.lifecycle import Status
from perdure.core.records import Record
from perdure.errors import StoreError
from perdure.stores._rows import browse_params, record_from_row
from perdure.stores._sqlite_file import Q, SQLiteFile, bad_text, damaged_row, object_of
from perdure.stores.base import ObjectCount, ObjectFilter, ObjectRow, RecordBody

__all__ = ["SQLiteBrowse", "browse_query"]

_DERIVED = frozenset((Status.PARKED, Status.PAUSED, Status.RUNNING))


def browse_query(where: ObjectFilter) -> str:
    """The name of the ``browse_*`` query for ``where``: the one led by the filter an
    index serves best (an id prefix, a parent, a stored status, an agent), else the one
    led by the ``objects_created`` index."""
    if where.prefix is not None:
        return "browse_by_prefix"
    if where.parent is not None:
        return "browse_children"
    if where.status is not None and where.status not in _DERIVED:
        return "browse_by_status"
    if where.agent is not None:
        return "browse_by_agent"
    return "browse_objects"


class SQLiteBrowse(SQLiteFile):
    """``Browse`` on one SQLite file (see ``perdure.stores.base.Browse``)."""

    def _objects(self, sql: str, params: dict[str, Any]) -> builtins.list[ObjectRow]:
        try:
            with self._read() as conn:
                cur = conn.execute(sql, params)
                return [object_of(cur, row) for row in cur.fetchall()]
        except StoreError as exc:
            if not bad_text(exc):
                raise
        columns, rows = self._as_bytes(sql, params)
        return [damaged_row(columns, row) for row in rows]

    def browse(self, where: ObjectFilter, *, after: tuple[float, str] | None = None,
               limit: int = 50, now: float) -> builtins.list[ObjectRow]:
        """Rows matching ``where``, newest first, a page after the key ``after``."""
        return self._objects(Q[browse_query(where)], browse_params(where, after, limit, now))

    def records_of_kinds(self, object_id: str, kinds: Sequence[str], limit: int
                         ) -> builtins.list[Record]:
        """The object's records of ``kinds``, oldest first, at most ``limit``."""
        params = {"object_id": object_id, "kinds": json.dumps(list(kinds)), "limit": limit}
        try:
            with self._read() as conn:
                rows = conn.execute(Q["records_of_kinds"], params).fetchall()
        except StoreError as exc:
            if not bad_text(exc):
                raise
            _, rows = self._as_bytes(Q["records_of_kinds"], params)
        return [record_from_row(row) for row in rows]

    def status_counts(self) -> dict[str, int]:
        """How many objects hold each stored status."""
        return {row[0]: int(row[1])
                for row in self._rows(Q["status_counts"], (), text_at=(0,))}

    def object_counts(self) -> builtins.list[ObjectCount]:
        """Objects per agent and shown status, and those waiting for an approval."""
        return [ObjectCount(row[0], row[1], int(row[2]), int(row[3] or 0))
                for row in self._rows(Q["object_counts"], (), text_at=(0, 1))]

    def awaiting_outside(self, limit: int) -> builtins.list[ObjectRow]:
        """Dormant objects waiting for an event from outside, latest updated first."""
        return self._objects(Q["awaiting_outside"], {"limit": limit})

    def lease_holders(self, now: float, limit: int) -> builtins.list[tuple[str, str]]:
        """``(object_id, lease_owner)`` of leases live at ``now``, by id."""
        rows = self._rows(Q["lease_holders"], {"now": now, "limit": limit}, text_at=(0, 1))
        return [(row[0], row[1]) for row in rows]

    def queue_key_holders(self, queue: str, now: float, limit: int
                          ) -> builtins.list[tuple[str | None, int]]:
        """The keys of ``queue`` holding slots at ``now``, most first."""
        rows = self._rows(Q["queue_key_holders"], {"queue": queue, "now": now,
                                                   "limit": limit}, text_at=(0,))
        return [(row[0], int(row[1])) for row in rows]

    def ended_since(self, since: float) -> builtins.list[tuple[str, float]]:
        """``(status, updated_at)`` of objects that ended at or after ``since``."""
        rows = self._rows(Q["ended_since"], {"since": since}, text_at=(0,))
        return [(row[0], float(row[1])) for row in rows]

    def updated_since(self, since: float, limit: int) -> builtins.list[str]:
        """Ids of objects updated at or after ``since``, latest first."""
        rows = self._rows(Q["updated_since"], {"since": since, "limit": limit},
                          text_at=(0,))
        return [row[0] for row in rows]

    def bodies_since(self, object_ids: Sequence[str], kinds: Sequence[str], since_us: int
                     ) -> builtins.list[RecordBody]:
        """Records of ``object_ids`` and ``kinds`` since ``since_us``, bodies as bytes."""
        if not object_ids or not kinds:
            return []
        rows = self._rows(Q["bodies_since"], {"ids": json.dumps(list(object_ids)),
                                              "kinds": json.dumps(list(kinds)),
                                              "since_us": since_us}, text_at=(0, 2))
        return [RecordBody(row[0], int(row[1]), row[2], int(row[3]), _bytes(row[4]))
                for row in rows]

    def sent_at(self, event_ids: Sequence[int]) -> dict[int, float]:
        """When each of ``event_ids`` was sent."""
        if not event_ids:
            return {}
        rows = self._rows(Q["sent_at"], {"ids": json.dumps([int(e) for e in event_ids])},
                          text_at=())
        return {int(row[0]): float(row[1]) for row in rows}


def _bytes(value: Any) -> bytes:
    """A BLOB column's bytes (text a hand edit left there: its UTF-8 bytes)."""
    return value.encode("utf-8", "surrogatepass") if isinstance(value, str) else bytes(value)
