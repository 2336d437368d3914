"""The PostgreSQL store's ``Browse`` role: what the dashboard reads, as named queries.

Each statement is planned with its values, so the objects list is one query whose
filters left ``NULL`` drop out (``browse_objects`` in ``sql/postgres/queries.sql``).
Every ``psycopg`` error is translated by the connection it runs on (``_postgres_db``).
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

from perdure.core.records import Record
from perdure.stores._postgres_db import PostgresDatabase, Q, object_of
from perdure.stores._rows import browse_params, record_from_row
from perdure.stores.base import ObjectCount, ObjectFilter, ObjectRow, RecordBody

__all__ = ["PostgresBrowse"]


class PostgresBrowse(PostgresDatabase):
    """``Browse`` on one PostgreSQL database (see ``perdure.stores.base.Browse``)."""

    def _objects(self, sql: bytes, params: dict[str, Any]) -> builtins.list[ObjectRow]:
        with self._single() as conn:
            cur = conn.execute(sql, params)
            return [object_of(cur, row) for row in cur.fetchall()]

    def _all(self, sql: bytes, params: dict[str, Any]) -> builtins.list[tuple[Any, ...]]:
        with self._single() as conn:
            return conn.execute(sql, params).fetchall()

    def browse(self, where: ObjectFilter, *, after: tuple[float, str] | None = None,
               limit: int = 50, now: float) -> builtins.list[ObjectRow]:
        """Rows matching ``where``, newest first, a page after the key ``after``."""
        return self._objects(Q["browse_objects"], browse_params(where, after, limit, now))

    def records_of_kinds(self, object_id: str, kinds: Sequence[str], limit: int
                         ) -> builtins.list[Record]:
        """The object's records of ``kinds``, oldest first, at most ``limit``."""
        with self._single() as conn:
            rows = conn.execute(Q["records_of_kinds"],
                                {"object_id": object_id, "kinds": builtins.list(kinds),
                                 "limit": limit}, binary=True).fetchall()
        return [record_from_row(row) for row in rows]

    def status_counts(self) -> dict[str, int]:
        """How many objects hold each stored status."""
        return {row[0]: int(row[1]) for row in self._all(Q["status_counts"], {})}

    def object_counts(self) -> builtins.list[ObjectCount]:
        """Objects per agent and shown status, and those waiting for an approval."""
        return [ObjectCount(row[0], row[1], int(row[2]), int(row[3] or 0))
                for row in self._all(Q["object_counts"], {})]

    def awaiting_outside(self, limit: int) -> builtins.list[ObjectRow]:
        """Dormant objects waiting for an event from outside, latest updated first."""
        return self._objects(Q["awaiting_outside"], {"limit": limit})

    def lease_holders(self, now: float, limit: int) -> builtins.list[tuple[str, str]]:
        """``(object_id, lease_owner)`` of leases live at ``now``, by id."""
        rows = self._all(Q["lease_holders"], {"now": now, "limit": limit})
        return [(row[0], row[1]) for row in rows]

    def queue_key_holders(self, queue: str, now: float, limit: int
                          ) -> builtins.list[tuple[str | None, int]]:
        """The keys of ``queue`` holding slots at ``now``, most first."""
        rows = self._all(Q["queue_key_holders"], {"queue": queue, "now": now,
                                                  "limit": limit})
        return [(row[0], int(row[1])) for row in rows]

    def ended_since(self, since: float) -> builtins.list[tuple[str, float]]:
        """``(status, updated_at)`` of objects that ended at or after ``since``."""
        return [(row[0], float(row[1])) for row in self._all(Q["ended_since"],
                                                             {"since": since})]

    def updated_since(self, since: float, limit: int) -> builtins.list[str]:
        """Ids of objects updated at or after ``since``, latest first."""
        return [row[0] for row in self._all(Q["updated_since"],
                                            {"since": since, "limit": limit})]

    def bodies_since(self, object_ids: Sequence[str], kinds: Sequence[str], since_us: int
                     ) -> builtins.list[RecordBody]:
        """Records of ``object_ids`` and ``kinds`` since ``since_us``, bodies as bytes."""
        if not object_ids or not kinds:
            return []
        rows = self._all(Q["bodies_since"], {"ids": builtins.list(object_ids),
                                             "kinds": builtins.list(kinds),
                                             "since_us": since_us})
        return [RecordBody(row[0], int(row[1]), row[2], int(row[3]), bytes(row[4]))
                for row in rows]

    def sent_at(self, event_ids: Sequence[int]) -> dict[int, float]:
        """When each of ``event_ids`` was sent."""
        if not event_ids:
            return {}
        rows = self._all(Q["sent_at"], {"ids": [int(e) for e in event_ids]})
        return {int(row[0]): float(row[1]) for row in rows}
