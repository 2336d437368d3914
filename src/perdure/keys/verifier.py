"""What a node believes of the store: records and events vouched for by trusted keys.

A ``Verifier`` joins the node's ``KeyRing`` (its own roots, from its configuration)
with what the store offers (certificates and revocations), caching both. A record,
event or checkpoint names its writer; it counts when signed by a key a trusted root
certified under that very name (``KeyRing.signer``): who a key speaks for comes from
its certificate, never from the store's rows. The store is read again when a writer's
name has no certified key yet, and at least every ``max_age_seconds`` otherwise, so
that a revocation published in the store reaches every node within that time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence

from perdure.core.chain import record_problem, sealed_by
from perdure.core.records import Record
from perdure.core.trust import KeyRing, check_event_seal
from perdure.errors import IntegrityError
from perdure.stores.base import Event, Store

__all__ = ["EventCheck", "Verifier"]

EventCheck = tuple[str | None, str | None]  # (event digest hex, why it is refused)


class Verifier:
    """A node's trust in records and events, backed by its ``KeyRing`` and the store."""

    def __init__(self, store: Store, ring: KeyRing, *, max_age_seconds: float = 30.0) -> None:
        self.store = store
        self.ring = ring
        self.max_age_seconds = max_age_seconds
        self._refreshed_at = -1e9
        self._signed: dict[str, bytes] = {}  # per writer, the key that signed last
        self._lock = threading.Lock()
        self._loaded = False

    # -- what the store offers --------------------------------------------------------

    def refresh(self) -> None:
        """Read the trust items (certificates, revocations) from the store again."""
        items = self.store.trust_items()
        with self._lock:
            self.ring.offer(items)
            self._loaded = True
            self._refreshed_at = time.monotonic()

    def _known(self, node_ids: Iterable[str]) -> None:
        """Make sure ``node_ids`` are looked up: the store is read again when one of them
        has no certified key yet, so a node certified a moment ago is never taken for a
        stranger, and at least every ``max_age_seconds``."""
        stale = time.monotonic() - self._refreshed_at >= self.max_age_seconds
        if not stale:
            stale = any(not self.ring.keys_named(node_id) for node_id in node_ids)
        if stale or not self._loaded:
            self.refresh()

    def refresh_if_stale(self) -> None:
        """Read the store again if the last read is older than ``max_age_seconds``."""
        if time.monotonic() - self._refreshed_at >= self.max_age_seconds:
            self.refresh()

    def names(self) -> dict[str, list[bytes]]:
        """Every name a trusted root certified, and its keys (read on first use)."""
        if not self._loaded:
            self.refresh()
        return self.ring.names()

    # -- records ----------------------------------------------------------------------

    def record_problem(self, rec: Record) -> str | None:
        """Why ``rec``'s signature or commit seal does not vouch for it under a trusted
        key, or ``None``. Reads the seal (and, for a new node, its key) from the store."""
        self._known([rec.node_id])
        digest = sealed_by(rec)
        seals = self.store.seals([digest]) if digest is not None else {}
        return record_problem(rec, {}, seals, self.ring, self._signed)

    def check_head(self, object_id: str, records: Sequence[Record]) -> None:
        """Vouch for a chain whose links and hashes were checked: its newest record must
        be signed by a trusted key (its hash chains every record before it).
        ``IntegrityError`` naming the record and the key otherwise."""
        last = records[-1]
        problem = self.record_problem(last)
        if problem is not None:
            raise IntegrityError(object_id, last.seq, problem)

    def signature_problem(self, node_id: str, ts_us: int, signature: bytes,
                          message: bytes) -> str | None:
        """Why ``signature`` over ``message`` does not vouch for a row ``node_id`` wrote
        at ``ts_us`` (a checkpoint slot), or ``None``: it must be made by a key a trusted
        root certified as ``node_id``."""
        self._known([node_id])
        _, why = self.ring.signer(node_id, signature, message, ts_us,
                                  first=self._signed.get(node_id))
        return None if why is None else f"signed by node {node_id!r}: {why}"

    # -- events -----------------------------------------------------------------------

    def warm(self, events: Sequence[Event]) -> None:
        """Look up the senders of ``events`` now (reading the store if needed), so that
        ``check_event`` does no I/O."""
        senders = []
        for event in events:
            sender = _sender(event.seal)
            if sender is not None:
                senders.append(sender)
        if senders:
            self._known(senders)

    def event_key(self, event: Event) -> bytes | None:
        """The certified key that sealed ``event`` (``None`` if none does). No I/O."""
        _, key, problem = check_event_seal(
            event.seal, event.object_id, event.name, event.payload, event.dedupe_key,
            self.ring)
        return key if problem is None else None

    def check_event(self, event: Event) -> EventCheck:
        """``(digest hex, None)`` for an event sealed by a key a trusted root certified
        as its sender; ``(digest hex or None, why)`` for one to refuse. No I/O (see
        ``warm``)."""
        digest, _, problem = check_event_seal(
            event.seal, event.object_id, event.name, event.payload, event.dedupe_key,
            self.ring)
        return (digest.hex() if digest is not None else None), problem


def _sender(seal: bytes) -> str | None:
    from perdure.core.trust import EventSeal

    try:
        return EventSeal.from_bytes(seal).sender
    except ValueError:
        return None
