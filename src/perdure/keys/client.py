"""``Client``: a caller's side of objects it does not run, checked and signed.

What every caller outside an object needs, in one place: the store, this node's identity
(its key, the roots it trusts, its certificate) and its data keys. ``certified`` is this
node as the store's readers will see it (certified under its id, or a
``NodeIdentityError``); ``seal_event`` and ``send`` put a signed event into an object's
inbox (refusing at once when the object's writers would not accept the signature);
``checked_memory`` is an object's memory checked as ``verify`` checks it; ``opener``
opens sealed values for a caller allowed to see them. The App holds one (``App.client``);
the API's helpers (approvals, fork, queries, followers, the dashboard's actions) take it
instead of the whole App.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping

from perdure.core.chain import Signer, VerifyReport, sealed_by, verify_chain
from perdure.core.codec import encode
from perdure.core.lifecycle import TERMINAL_STATUSES
from perdure.core.names import check_name
from perdure.core.records import Kind, Record
from perdure.core.trust import seal_event
from perdure.errors import (
    ConfigurationError,
    IntegrityError,
    ObjectNotFoundError,
    RecordDecodeError,
)
from perdure.keys.anchors import HeadAnchors, rollback_problem
from perdure.keys.data_keys import DataKeys
from perdure.keys.identity import NodeIdentity
from perdure.keys.opener import RecordOpener
from perdure.keys.verifier import Verifier
from perdure.stores.base import ObjectRow, Store

__all__ = ["Client", "lookup_id", "row_against_memory"]


def lookup_id(object_id: str) -> str:
    """An id to look up: any id perdure could hold (``ConfigurationError`` for one no
    store can, such as a lone surrogate or a NUL), the same on every store."""
    return check_name(object_id, "object id", max_length=10_000)


class Client:
    """The store, this node's identity and its data keys, and what a caller does with
    them (see the module)."""

    def __init__(self, store: Store, identity: NodeIdentity, data_keys: DataKeys, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.identity = identity
        self.data_keys = data_keys
        #: What events this client sends are stamped with (seconds since the epoch).
        self.clock = clock
        self._lock = threading.RLock()
        self._verifier: Verifier | None = None
        self._anchors: HeadAnchors | None = None
        self._certified = False

    @property
    def signer(self) -> Signer:
        """This node's id and signing key (created on first use)."""
        return self.identity.signer()

    @property
    def node_id(self) -> str:
        """This node's id."""
        return self.signer.node_id

    @property
    def verifier(self) -> Verifier:
        """What this node believes of the store (its trusted roots, cached keys)."""
        with self._lock:
            if self._verifier is None:
                self._verifier = self.identity.verifier(self.store)
            return self._verifier

    @property
    def anchors(self) -> HeadAnchors:
        """The heads this node saw (its key folder's ``heads.db``)."""
        with self._lock:
            if self._anchors is None:
                self._anchors = self.identity.anchors()
            return self._anchors

    def close(self) -> None:
        """Close the seen-heads file, if it was opened."""
        with self._lock:
            if self._anchors is not None:
                self._anchors.close()

    # -- signing --------------------------------------------------------------------

    def certified(self) -> Signer:
        """This node, certified under its node id by a trusted root (the certificate
        published in the store): ``NodeIdentityError`` when its key is certified only
        under other names. Nothing else ties the id to the key: no store row."""
        signer = self.signer
        if not self._certified:
            self.identity.certified(self.store)
            self._certified = True
        return signer

    def seal_event(self, object_id: str, name: str, data: bytes,
                   dedupe_key: str | None) -> bytes:
        """This node's seal over an event it puts into an inbox; ``ConfigurationError``
        when the object's writers are certified by roots this node does not trust (its
        workers would refuse the event: say so here, at the sender)."""
        signer = self.certified()
        self.check_audience(object_id)
        seal, _ = seal_event(signer.sign, signer.node_id, object_id, name, data, dedupe_key,
                             os.urandom(12).hex())
        return seal

    def send(self, object_id: str, name: str, data: bytes, dedupe_key: str | None) -> bool:
        """Put a signed event into the object's inbox; ``False`` when ``dedupe_key`` was
        used already (see ``Store.send``)."""
        return self.store.send(object_id, name, data, dedupe_key, self.clock(),
                               self.seal_event(object_id, name, data, dedupe_key))

    def check_audience(self, object_id: str) -> None:
        """Refuse to send to an object whose newest record is written under a name no
        root this node trusts certifies: trust goes both ways in a cluster, so its
        workers would refuse what this node signs (``event_refused``) while the sender
        thought it sent."""
        row = self.store.get(object_id)
        if row is None or not row.head_seq:
            return
        tail = self.store.records(object_id, after_seq=row.head_seq - 1)
        if not tail:
            return
        writer = tail[-1].node_id
        problem = self.verifier.record_problem(tail[-1])
        if problem is None or self.verifier.ring.keys_named(writer):
            return
        raise ConfigurationError(
            f"object {object_id!r} is written by node {writer!r}, which no root trusted in "
            f"{self.identity.folder.path} certifies, so its workers would refuse what this "
            f"key signs; use the key folder its workers use (--key-dir / PERDURE_KEY_DIR / "
            f"App(key_dir=...)), or have their root certify this key ({problem})")

    # -- reading, checked -------------------------------------------------------------

    def checked_memory(self, object_id: str) -> tuple[ObjectRow, list[Record]]:
        """The object's row and its memory, checked as ``App.verify`` checks it (links,
        signatures under trusted keys, the row's head, heads this node saw).

        ``ObjectNotFoundError`` for an unknown object; ``IntegrityError`` naming the first
        bad record otherwise. Records appended after the row was read are kept (and checked
        like the rest): memory only grows.
        """
        try:
            return self._checked_memory(object_id)
        except _BehindSeenHeadError:
            # A worker of this node committed (and noted) a newer head after the read:
            # read again. A store really rolled back stays behind it.
            return self._checked_memory(object_id, last_try=True)

    def _checked_memory(self, object_id: str, *, last_try: bool = False
                        ) -> tuple[ObjectRow, list[Record]]:
        row = self.store.get(lookup_id(object_id))
        if row is None:
            raise ObjectNotFoundError(f"no object {object_id!r} in {self.store.url}")
        try:
            records = self.store.records(object_id)
        except RecordDecodeError as exc:
            raise IntegrityError(object_id, exc.seq, exc.reason) from None
        verifier = self.verifier
        verifier.refresh()
        digests = [d for d in map(sealed_by, records) if d is not None]
        report = verify_chain(object_id, records, {},
                              seals=self.store.seals(digests), trust=verifier.ring)
        if not report.ok:
            raise IntegrityError(object_id, report.bad_seq or 0, report.reason or "does not verify")
        if len(records) < row.head_seq or (
                row.head_seq and records[row.head_seq - 1].hash != row.head_hash):
            raise IntegrityError(object_id, min(len(records), row.head_seq) + 1,
                                 f"memory does not reach the object's head #{row.head_seq}")
        problem = self.anchors.check(object_id, records)
        if problem is not None:
            if not last_try:
                raise _BehindSeenHeadError
            raise IntegrityError(object_id, problem[0], problem[1])
        return row, records

    def verify(self, object_id: str, *,
               anchors: Mapping[str, tuple[int, str]] | None = None) -> VerifyReport:
        """Walk the object's chain and every record's signature; the report names the
        first bad record.

        A signature counts only under a key certified by a root this node trusts.
        The chain must also reach every head this node saw of the object (its
        ``heads.db``) and, with ``anchors`` (object id -> ``(seq, hash)``, as
        ``export_heads`` gives), the head given there: a store rolled back or rewritten
        is reported, naming the record.
        """
        try:
            return self._verify(object_id, anchors)
        except _BehindSeenHeadError:  # as in ``checked_memory``: read again
            return self._verify(object_id, anchors, last_try=True)

    def _verify(self, object_id: str, anchors: Mapping[str, tuple[int, str]] | None, *,
                last_try: bool = False) -> VerifyReport:
        read = self._row_and_records(object_id)
        if isinstance(read, VerifyReport):
            return read
        row, records = read
        verifier = self.verifier
        verifier.refresh()
        digests = [d for d in map(sealed_by, records) if d is not None]
        report = verify_chain(object_id, records, {},
                              head_seq=row.head_seq, head_hash=row.head_hash,
                              seals=self.store.seals(digests), trust=verifier.ring)
        if not report.ok or not records:
            return report
        problem = self.anchors.check(object_id, records)
        if problem is not None and not last_try:
            raise _BehindSeenHeadError
        if problem is None and anchors is not None and object_id in anchors:
            seq, digest = anchors[object_id]
            problem = rollback_problem((records[0].hash, int(seq), str(digest)), records,
                                       seen=False)
        if problem is not None:
            return VerifyReport(object_id, False, len(records), problem[0], problem[1])
        why = row_against_memory(row, records[-1])
        if why is not None:
            return VerifyReport(object_id, False, len(records), records[-1].seq, why)
        return report

    def _row_and_records(self, object_id: str
                         ) -> tuple[ObjectRow, list[Record]] | VerifyReport:
        """The object's row and records, the records reaching no further than the row's
        head; a report when a record does not decode."""
        for attempt in range(_SNAPSHOT_TRIES):
            row = self.store.get(lookup_id(object_id))
            if row is None:
                raise ObjectNotFoundError(f"no object {object_id!r} in {self.store.url}")
            try:
                records = self.store.records(object_id)
            except RecordDecodeError as exc:
                return VerifyReport(object_id, False, 0, exc.seq, exc.reason)
            if not records or records[-1].seq <= row.head_seq or attempt == _SNAPSHOT_TRIES - 1:
                return row, records
            # Appended to after the row was read (the row and the records are two reads):
            # read both again, so that the head checked is the one the records reach.
        raise AssertionError("unreachable")

    def opener(self, open_sealed: bool = True) -> RecordOpener:
        """Opens the sealed values of records read for a caller (``open_sealed=False``:
        a reader that opens nothing, as the command line's)."""
        return RecordOpener(self.store, self.data_keys if open_sealed else None)


_SNAPSHOT_TRIES = 5
"""How often ``verify`` reads an object whose memory keeps growing between its reads of
the row and of the records before it checks what it has."""


class _BehindSeenHeadError(Exception):
    """The memory read is behind a head this node saw: read once more before saying so."""


def row_against_memory(row: ObjectRow, last: Record) -> str | None:
    """Why the object's row (an index) says otherwise than its verified last record about
    how the object ended, or ``None``."""
    terminal = row.status in TERMINAL_STATUSES
    if last.kind != Kind.TERMINATED:
        return (f"the object's row says {row.status} but its memory holds no terminal record"
                if terminal else None)
    outcome = last.body.get("outcome")
    if row.status != outcome:
        return f"the object's row says {row.status} but its terminal record says {outcome}"
    if outcome == "completed" and (row.result is None
                                   or row.result != encode(last.body.get("result"))):
        return "the stored result differs from the result in the signed terminal record"
    return None
