"""The checked records of objects this node ran, kept so a claim reads only the tail.

``HeldRecords`` is a least-recently-used map from object id to its checked chain,
bounded by the total number of records (``WorkerSettings.held_records``). The node
loop's memory read (``engine/memory.py``) asks it first.
"""

from __future__ import annotations

from collections import OrderedDict

from perdure.core.records import Record

__all__ = ["HeldRecords"]


class HeldRecords:
    """The checked records of objects this node ran, least recently used dropped first.

    A record never changes once written, so an object claimed again needs only the
    records after the last one held: the store is asked for that tail, and its links
    are checked from the held head. Anything unexpected (a tail that does not link on,
    a store head behind the held one) drops the entry and the full chain is read.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._items: OrderedDict[str, list[Record]] = OrderedDict()
        self._size = 0

    def get(self, object_id: str) -> list[Record] | None:
        """The held records of ``object_id`` (oldest first), or ``None``."""
        records = self._items.get(object_id)
        if records is not None:
            self._items.move_to_end(object_id)
        return records

    def put(self, object_id: str, records: list[Record]) -> None:
        """Hold ``records`` (checked, never changed afterwards) for ``object_id``."""
        self.drop(object_id)
        if not records or len(records) > self.limit:
            return
        self._items[object_id] = records
        self._size += len(records)
        while self._size > self.limit:
            _, old = self._items.popitem(last=False)
            self._size -= len(old)

    def drop(self, object_id: str) -> None:
        """Forget ``object_id``."""
        old = self._items.pop(object_id, None)
        if old is not None:
            self._size -= len(old)

    def __len__(self) -> int:
        return self._size

