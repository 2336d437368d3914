"""Building signed memory chains and store rows for the store contract suite.

Stores handle opaque rows and records, so the suite builds its records the way a
node does — sealed with ``perdure.core.chain.seal`` and signed with a real
Ed25519 key — without any engine or agent involved.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from perdure.core.chain import Signer, seal
from perdure.core.records import GENESIS_HASH, Kind, Record, RecordDraft
from perdure.stores.base import Append, NewObject

__all__ = ["NOW", "Chain", "make_signer", "sql_only"]

NOW = 1_000_000.0
"""A fixed logical time: stores take ``now`` as an argument, so most tests need no clock."""


def sql_only(place: str, why: str) -> None:
    """Skip the test on the in-memory store (``place`` is the ``place`` fixture's URL),
    saying why it needs a SQL backend."""
    if place.startswith("memory:"):
        pytest.skip(f"SQL backends only: {why}")


def make_signer(node_id: str = "node-a") -> Signer:
    """A node identity with a freshly generated Ed25519 key."""
    return Signer(node_id, Ed25519PrivateKey.generate())


@dataclass
class Chain:
    """One object's memory as a node would build it: sealed, linked and signed records."""

    object_id: str
    signer: Signer
    agent: str = "agent"
    records: list[Record] = field(default_factory=list)
    first_body: dict[str, object] | None = None  # the instantiated record's body

    def __post_init__(self) -> None:
        if not self.records:
            self.records.append(self._seal(1, GENESIS_HASH, Kind.INSTANTIATED,
                                           self.first_body or {"n": 0}))

    def _seal(self, seq: int, prev: str, kind: Kind, body: dict[str, object]) -> Record:
        return seal(
            RecordDraft(kind, body),
            object_id=self.object_id,
            seq=seq,
            prev_hash=prev,
            trace_id=f"trace-{self.object_id}",
            ts_us=int(NOW * 1_000_000) + seq,
            policy_ref="policy-test",
            signer=self.signer,
        )

    @property
    def head(self) -> Record:
        """The last record of the chain."""
        return self.records[-1]

    def new_object(self, ready_at: float = NOW, parent_id: str | None = None) -> NewObject:
        """What ``Store.create`` takes for this chain's first record."""
        return NewObject(
            object_id=self.object_id,
            agent=self.agent,
            agent_version="1",
            first=self.records[0],
            ready_at=ready_at,
            parent_id=parent_id,
        )

    def peek(self, count: int = 1, kind: Kind = Kind.PROGRESS) -> list[Record]:
        """Seal ``count`` records after the head without adding them to the chain."""
        out: list[Record] = []
        prev, seq = self.head.hash, self.head.seq
        for _ in range(count):
            seq += 1
            rec = self._seal(seq, prev, kind, {"n": seq})
            out.append(rec)
            prev = rec.hash
        return out

    def extend(self, count: int = 1, kind: Kind = Kind.PROGRESS) -> list[Record]:
        """Seal ``count`` records after the head and add them to the chain."""
        out = self.peek(count, kind)
        self.records.extend(out)
        return out

    def append(
        self,
        epoch: int,
        records: list[Record],
        *,
        status: str = "running",
        phase: str = "execution",
        ready_at: float | None = NOW,
        **options: object,
    ) -> Append:
        """A fenced append of ``records`` for this object at ``epoch``."""
        return Append(
            object_id=self.object_id,
            epoch=epoch,
            records=records,
            status=status,
            phase=phase,
            ready_at=ready_at,
            **options,  # type: ignore[arg-type]
        )
