"""Checkpoint slots: the latest superseding state of an object, outside its hash chain.

A resource's descriptor recaptured by ``run.checkpoint_resources()`` (or refreshed by a
restore) and a step's progress marker supersede the ones before: only the latest is
ever read again. Written as chain records they made every claim read and verify every
one of them (a 24-hour agent checkpointing each minute: 1,440 records). So they go to
one row per ``(object, slot)`` in the store's ``checkpoints`` table, upserted:
``resource:<name>`` and ``step:<pos>``. The chain keeps what must stay auditable: a
resource's declaration and its release, a step's start and outcome.

The guarantees a chain record has, kept:

- **fenced**: a row is written only while the object's row still has the writer's
  epoch and a lease owner (``LeaseLostError`` otherwise, as for an append);
- **signed**: by the writing node's key over the object id, the slot, the chain head
  it follows (``after_seq``, ``after_hash``: the last record durable when it was
  written) and the body bytes; at read, the signature is checked against the node's
  trust ring and the head must be a record of the verified chain. A row that fails is
  an integrity failure: the object parks with the reason, the row is never used;
- **sealed**: bodies go through ``Run._stored`` as every payload does.

A slot is deleted when what it follows ends: the step's outcome is recorded, the
resource is released, the object ends. Superseded values are not kept at all, so
their retention is bounded by design.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from perdure.core.bodies import Parked
from perdure.core.chain import Signer
from perdure.core.codec import decode, encode
from perdure.core.records import Record
from perdure.engine.signals import Park
from perdure.errors import IntegrityError, LeaseLostError
from perdure.stores.base import CheckpointRow, Store

if TYPE_CHECKING:
    from perdure.engine.journal import Journal
    from perdure.keys.verifier import Verifier

__all__ = ["SLOT_DOMAIN", "Slot", "Slots", "resource_slot", "slot_message", "step_slot"]

SLOT_DOMAIN = b"perdure checkpoint slot v1\n"


def resource_slot(name: str) -> str:
    """The slot of a resource's latest descriptor."""
    return f"resource:{name}"


def step_slot(pos: int | str) -> str:
    """The slot of the latest progress marker of the step at ``pos``."""
    return f"step:{pos}"


def slot_message(object_id: str, slot: str, after_seq: int, after_hash: str,
                 body: bytes) -> bytes:
    """The bytes a slot row's signature covers."""
    head = encode([object_id, slot, after_seq, after_hash])
    return SLOT_DOMAIN + len(head).to_bytes(4, "big") + head + body


@dataclass(frozen=True, slots=True)
class Slot:
    """A slot row that verified: its value (as stored: sealed parts still sealed) and the
    chain position it follows."""

    slot: str
    after_seq: int
    value: Any
    signer: str
    written_at: float


class Slots:
    """A node's way to an object's checkpoint slots (see the module)."""

    def __init__(self, store: Store, verifier: Verifier, signer: Signer,
                 write_pool: concurrent.futures.Executor,
                 read_pool: concurrent.futures.Executor, clock: Callable[[], float]) -> None:
        self.store = store
        self.verifier = verifier
        self.signer = signer
        self._write_pool = write_pool
        self._read_pool = read_pool
        self._clock = clock
        #: Slot rows read with a claim's memory (``engine.memory``), by object: ``load``
        #: takes them instead of reading again. Only this node writes an object's slots
        #: while it holds the lease, so they stay current for the claim.
        self.primed: dict[str, list[CheckpointRow]] = {}

    async def _io(self, pool: concurrent.futures.Executor, fn: Callable[..., Any],
                  *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)

    async def put(self, journal: Journal, slot: str, value: Any) -> None:
        """Write ``value`` (already as stored: sealed) to ``slot``, after the journal's
        durable head, fenced on its epoch; ``LeaseLostError`` if the lease moved on."""
        body = encode(value, what=f"checkpoint slot {slot!r}")
        journal.slot_rows = True  # (before the write: a write that fails may still land)
        seq, digest = journal.durable_head
        message = slot_message(journal.object_id, slot, seq, digest, body)
        row = CheckpointRow(journal.object_id, slot, journal.epoch, seq, digest, body,
                            self.signer.node_id, self.signer.sign(message), self._clock())
        if not await self._io(self._write_pool, self.store.put_checkpoint, row):
            raise LeaseLostError(f"object {journal.object_id!r}: epoch {journal.epoch} no "
                                 f"longer holds the lease (checkpoint slot {slot!r} refused)")

    async def drop(self, journal: Journal, slots: Sequence[str]) -> None:
        """Delete ``slots`` of the journal's object, fenced on its epoch."""
        if not await self._io(self._write_pool, self.store.delete_checkpoints,
                              journal.object_id, list(slots), journal.epoch):
            raise LeaseLostError(f"object {journal.object_id!r}: epoch {journal.epoch} no "
                                 f"longer holds the lease (checkpoint slots not deleted)")

    async def drop_all(self, object_id: str) -> None:
        """Delete every slot of an object that ended (its memory says so: unfenced)."""
        await self._io(self._write_pool, self.store.delete_checkpoints, object_id, None,
                       None)

    async def load(self, object_id: str, records: Sequence[Record]) -> dict[str, Slot]:
        """Every slot of ``object_id``, each verified against ``records`` (its verified
        chain); ``Park`` (an integrity failure) for a row that does not verify."""
        rows = self.primed.pop(object_id, None)
        if rows is None:
            rows = await self._io(self._read_pool, self.store.checkpoints, object_id)
        if not rows:
            return {}
        await self._io(self._read_pool, self.verifier.refresh_if_stale)
        return {row.slot: check_row(self.verifier, object_id, row, records) for row in rows}


def row_problem(verifier: Verifier, object_id: str, row: CheckpointRow,
                records: Sequence[Record]) -> str | None:
    """Why ``row`` does not vouch for itself against ``records``, or ``None``."""
    if row.object_id != object_id:
        return f"slot {row.slot!r} belongs to object {row.object_id!r}"
    message = slot_message(row.object_id, row.slot, row.after_seq, row.after_hash, row.body)
    problem = verifier.signature_problem(row.signer, int(row.written_at * 1_000_000),
                                         row.signature, message)
    if problem is not None:
        return (f"checkpoint slot {row.slot!r}: {problem} (the row was altered or "
                "forged, or its writer is not certified under that name)")
    seq = row.after_seq
    index = seq - records[0].seq if records else -1
    if not (0 <= index < len(records)) or records[index].seq != seq or (
            records[index].hash != row.after_hash):
        return (f"checkpoint slot {row.slot!r} follows record #{seq}, which is not in the "
                f"verified memory")
    return None


def check_row(verifier: Verifier, object_id: str, row: CheckpointRow,
              records: Sequence[Record]) -> Slot:
    """``row`` as a ``Slot``; ``Park`` if it does not verify or its body is not JSON."""
    problem = row_problem(verifier, object_id, row, records)
    value: Any = None
    if problem is None:
        try:
            value = decode(row.body)
        except ValueError as exc:
            problem = f"checkpoint slot {row.slot!r}: its body is not valid JSON ({exc})"
    if problem is not None:
        why = f"integrity failure: {problem}; the object is parked, the slot is not used"
        raise Park(IntegrityError(object_id, row.after_seq, problem),
                   Parked(why, "integrity", 0).draft())
    return Slot(row.slot, row.after_seq, value, row.signer, row.written_at)
