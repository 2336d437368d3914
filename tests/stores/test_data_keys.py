"""The ``DataKeyRows`` role, on every backend: wrapped data keys kept once, listed by the
key that wraps them, replaced only by compare-and-set, counted."""

from __future__ import annotations

from perdure.stores import Store
from perdure.stores.base import DataKeyRow

NOW = 1_700_000_000.0


def test_the_first_data_key_of_an_object_stays(store: Store) -> None:
    """A second put for the same object (another node at the same moment) gets the
    first row back; the row reads back byte for byte, flag included."""
    assert store.data_key("o1") is None
    first = DataKeyRow("o1", "k" * 16, b"\x00wrapped\xff" * 6, seal_all=True)
    assert store.put_data_key(first, NOW) == first
    assert store.put_data_key(DataKeyRow("o1", "x" * 16, b"other"), NOW) == first
    assert store.data_key("o1") == first


def test_rewrap_is_compare_and_set(store: Store) -> None:
    """A rewrap of a row that changed since it was read does nothing."""
    row = store.put_data_key(DataKeyRow("o2", "old-key-id-0000", b"wrapped-1"), NOW)
    assert store.rewrap_data_key(row, "new-key-id-0000", b"wrapped-2", NOW + 1)
    assert store.data_key("o2") == DataKeyRow("o2", "new-key-id-0000", b"wrapped-2")
    assert not store.rewrap_data_key(row, "third-key-id-00", b"wrapped-3", NOW + 2)
    assert store.data_key("o2") == DataKeyRow("o2", "new-key-id-0000", b"wrapped-2")


def test_rows_not_under_a_key_page_in_id_order(store: Store) -> None:
    for index in range(7):
        key = "current-key-000" if index % 3 == 0 else "older-key-00000"
        store.put_data_key(DataKeyRow(f"obj-{index}", key, bytes([index]) * 40), NOW)
    seen: list[str] = []
    after = ""
    while rows := store.data_keys_not_under("current-key-000", after, 2):
        assert len(rows) <= 2
        seen.extend(r.object_id for r in rows)
        after = rows[-1].object_id
    assert seen == ["obj-1", "obj-2", "obj-4", "obj-5"]
    assert store.data_key_counts() == {"current-key-000": 3, "older-key-00000": 4}
