"""Readers open what they may: records read back through the public API, opened.

``Handle.stream`` (emitted data), queries (``MemoryView``: step results, emitted
values, received events, the result) and anything else that hands recorded values to
the App's caller read records as the store holds them, with sealed values in place.
``RecordOpener`` opens those with the App's ``DataKeys``: each sealed value names the
object whose data key sealed it (``of``), so a fork's copied values open under the
original's key, a child's result folded into its parent's memory under the child's.
``Secret`` objects come back where secrets were, and the whole value of an agent that
encrypts all.

What the caller cannot open stays as memory holds it (``{"perdure:sealed": ...}``):
an App without data keys, or without the key-encryption key a data key is wrapped
under, still reads everything else. A sealed value that does not open under its key
(a changed byte) is an integrity failure and raises ``SealBrokenError``, never
garbage. An App whose ``open_sealed`` is false (the CLI's) opens nothing: the CLI
prints ``<sealed>``.

The records keep their bytes, hashes and signatures as stored: only ``body`` is the
opened copy.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from perdure.core.records import Record
from perdure.core.sealing import marked
from perdure.errors import DataKeyError
from perdure.keys.sealer import KeyCache, Sealer

if TYPE_CHECKING:
    from perdure.keys.data_keys import DataKeys
    from perdure.stores.base import Store

__all__ = ["RecordOpener"]


class RecordOpener:
    """Opens the sealed values of records read from ``store`` with ``keys`` (``None``:
    opens nothing) for a caller (see the module)."""

    def __init__(self, store: Store, keys: DataKeys | None) -> None:
        self._store = store
        self._keys = keys
        self._cache = KeyCache(256)
        self._sealers: dict[str, Sealer] = {}

    def record(self, rec: Record) -> Record:
        """``rec`` with the sealed values in its body opened, where this App may."""
        if self._keys is None or not marked(rec.body_bytes):
            return rec
        sealer = self._sealers.get(rec.object_id)
        if sealer is None:
            sealer = Sealer(self._store, self._keys, rec.object_id, cache=self._cache)
            self._sealers[rec.object_id] = sealer
        try:
            return rec._replace(body=sealer.open(rec.body))
        except DataKeyError:
            return rec

    def records(self, records: Iterable[Record]) -> list[Record]:
        """Each of ``records`` opened (see ``record``)."""
        return [self.record(rec) for rec in records]
