"""The ``Checkpoints`` role, on every backend: one row per (object, slot), upserted,
written and deleted only under the epoch that holds the lease, bytes kept exactly."""

from __future__ import annotations

from perdure.stores import Store
from perdure.stores.base import CheckpointRow
from tests.stores.builders import NOW, Chain, make_signer


def _claimed(store: Store, object_id: str, owner: str = "w1") -> int:
    chain = Chain(object_id, make_signer())
    assert store.create(chain.new_object(ready_at=NOW), NOW) is True
    claims = [c for c in store.claim(owner, NOW, NOW + 30.0, 100) if c.object_id == object_id]
    assert claims
    return claims[0].epoch


def _row(object_id: str, slot: str, epoch: int, body: bytes, seq: int = 1) -> CheckpointRow:
    return CheckpointRow(object_id, slot, epoch, seq, "ab" * 32, body, "node-a",
                         b"\x01" * 64, NOW + seq)


def test_a_slot_is_upserted_and_reads_back_byte_for_byte(store: Store) -> None:
    epoch = _claimed(store, "cp-1")
    assert store.checkpoints("cp-1") == []
    first = _row("cp-1", "resource:log", epoch, b'{"pos":1}\x00\xff')
    assert store.put_checkpoint(first)
    assert store.checkpoints("cp-1") == [first]
    later = _row("cp-1", "resource:log", epoch, b'{"pos":2}', seq=5)
    other = _row("cp-1", "step:3", epoch, b'{"cursor":7}', seq=4)
    assert store.put_checkpoint(later) and store.put_checkpoint(other)
    assert store.checkpoints("cp-1") == [later, other], "the latest only, by slot"


def test_a_fenced_out_epoch_writes_and_deletes_nothing(store: Store) -> None:
    epoch = _claimed(store, "cp-2")
    kept = _row("cp-2", "step:0", epoch, b"1")
    assert store.put_checkpoint(kept)
    assert not store.put_checkpoint(_row("cp-2", "step:0", epoch - 1, b"2"))
    assert not store.put_checkpoint(_row("cp-2", "step:0", epoch + 1, b"3"))
    assert not store.put_checkpoint(_row("nobody", "step:0", 1, b"4"))
    assert not store.delete_checkpoints("cp-2", ["step:0"], epoch + 1)
    assert store.checkpoints("cp-2") == [kept]
    assert store.checkpoints("nobody") == []


def test_slots_are_deleted_one_by_one_or_all(store: Store) -> None:
    epoch = _claimed(store, "cp-3")
    for slot in ("resource:a", "resource:b", "step:1"):
        assert store.put_checkpoint(_row("cp-3", slot, epoch, slot.encode()))
    epoch_other = _claimed(store, "cp-4", owner="w2")
    assert store.put_checkpoint(_row("cp-4", "step:1", epoch_other, b"x"))
    assert store.delete_checkpoints("cp-3", ["resource:a", "missing"], epoch)
    assert [r.slot for r in store.checkpoints("cp-3")] == ["resource:b", "step:1"]
    assert store.delete_checkpoints("cp-3", None, None)
    assert store.checkpoints("cp-3") == []
    assert [r.slot for r in store.checkpoints("cp-4")] == ["step:1"], "other objects kept"
