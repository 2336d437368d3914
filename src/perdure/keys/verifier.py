"""What a node believes of the store: records and events vouched for by trusted keys.

A ``Verifier`` joins the node's ``KeyRing`` (its own roots, from its configuration)
with what the store offers (node ids and public keys, certificates, revocations),
caching both. The store is read again when a record or event names a node it does not
know (or trust) yet, and at least every ``max_age_seconds`` otherwise, so that a
revocation published in the store reaches every node within that time; nothing the
store says is taken without a trusted root's signature over it.
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
        self._keys: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._loaded = False

    # -- what the store offers --------------------------------------------------------

    def refresh(self) -> None:
        """Read node keys and trust items from the store again."""
        keys = self.store.public_keys()
        items = self.store.trust_items()
        with self._lock:
            self.ring.offer(items)
            self._keys = keys
            self._loaded = True
            self._refreshed_at = time.monotonic()

    def _known(self, node_ids: Iterable[str]) -> None:
        """Make sure ``node_ids`` are looked up: the store is read again when one of them
        is new or not (yet) certified, so a node that registered a moment ago is never
        taken for a stranger, and at least every ``max_age_seconds``."""
        stale = time.monotonic() - self._refreshed_at >= self.max_age_seconds
        for node_id in node_ids:
            key = self._keys.get(node_id)
            if key is None or self.ring.problem(key) is not None:
                stale = True
                break
        if stale or not self._loaded:
            self.refresh()

    def refresh_if_stale(self) -> None:
        """Read the store again if the last read is older than ``max_age_seconds``."""
        if time.monotonic() - self._refreshed_at >= self.max_age_seconds:
            self.refresh()

    def keys(self) -> dict[str, bytes]:
        """Every node id the store registers and its key (read on first use)."""
        if not self._loaded:
            self.refresh()
        return dict(self._keys)

    # -- records ----------------------------------------------------------------------

    def record_problem(self, rec: Record) -> str | None:
        """Why ``rec``'s signature or commit seal does not vouch for it under a trusted
        key, or ``None``. Reads the seal (and, for a new node, its key) from the store."""
        self._known([rec.node_id])
        digest = sealed_by(rec)
        seals = self.store.seals([digest]) if digest is not None else {}
        return record_problem(rec, self._keys, seals, self.ring)

    def check_head(self, object_id: str, records: Sequence[Record]) -> None:
        """Vouch for a chain whose links and hashes were checked: its newest record must
        be signed by a trusted key (its hash chains every record before it).
        ``IntegrityError`` naming the record and the key otherwise."""
        last = records[-1]
        problem = self.record_problem(last)
        if problem is not None:
            raise IntegrityError(object_id, last.seq, problem)

    def slot_signer_problem(self, node_id: str, ts_us: int) -> str | None:
        """Why ``node_id``'s key does not vouch for a checkpoint slot row written at
        ``ts_us``, or ``None`` (the signature itself is checked by the caller)."""
        self._known([node_id])
        key = self.key_of(node_id)
        if key is None:
            return f"signer node {node_id!r} has no registered public key"
        why = self.ring.problem(key, ts_us)
        return None if why is None else f"signed by node {node_id!r}, whose {why}"

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

    def key_of(self, node_id: str) -> bytes | None:
        """The public key registered for ``node_id`` (as last read), or ``None``."""
        with self._lock:
            return self._keys.get(node_id)

    def check_event(self, event: Event) -> EventCheck:
        """``(digest hex, None)`` for an event whose seal verifies under a trusted key;
        ``(digest hex or None, why)`` for one to refuse. No I/O (see ``warm``)."""
        digest, problem = check_event_seal(
            event.seal, event.object_id, event.name, event.payload, event.dedupe_key,
            self._keys, self.ring)
        return (digest.hex() if digest is not None else None), problem


def _sender(seal: bytes) -> str | None:
    from perdure.core.trust import EventSeal

    try:
        return EventSeal.from_bytes(seal).sender
    except ValueError:
        return None
