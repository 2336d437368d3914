"""What an object's memory adds to what its row says: the questions it asks, and where it
was forked from. ``App.get``, ``App.list`` and ``App.questions`` use it.

Reads stay small: an object's questions are read only when its row says it may ask one
(``questions.may_ask``: its note says it asks, or it waits for an event from outside),
from the last ``QUESTION_TAIL`` records (the whole memory only when they hold none, as
when a gather branch asked long before); a fork's
origin is its first record, read once per object (a first record never changes). What
they say is shown only when a signature under a key this node trusts vouches for the
records it comes from (their links checked, the last one's signature: it covers every
record before it); a forged or damaged record is left out, with a warning naming it.
A question sealed by an agent that encrypts all is opened with the App's data keys when
the App opens what it reads (``App.open_sealed``), else it stays sealed.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from perdure.core.chain import check_links
from perdure.core.lifecycle import Status
from perdure.core.questions import Question, forked_from, may_ask, pending_questions
from perdure.core.records import Record
from perdure.errors import (
    ConfigurationError,
    IntegrityError,
    RecordDecodeError,
    SealBrokenError,
)
from perdure.info import ObjectInfo

if TYPE_CHECKING:
    from perdure.app import App

__all__ = ["ORIGINS_KEPT", "QUESTION_TAIL", "MemoryNotes"]

QUESTION_TAIL = 64
"""Records read back from an object's head for the questions it asks."""

ORIGINS_KEPT = 4096
"""Fork origins an App keeps (then it forgets them all and reads again)."""

log = logging.getLogger("perdure")


class MemoryNotes:
    """Questions and fork origins of an App's objects, read from their memory."""

    def __init__(self, app: App) -> None:
        self._app = app
        self._lock = threading.Lock()
        self._origins: dict[str, dict[str, Any] | None] = {}

    def annotate(self, info: ObjectInfo) -> ObjectInfo:
        """``info`` with the questions it asks and where it was forked from. Damaged
        memory adds nothing (``verify`` and ``show`` say what is wrong)."""
        origin = self.origin(info.object_id)
        info = self.asking(info)
        return dataclasses.replace(info, forked_from=origin) if origin else info

    def origin(self, object_id: str) -> dict[str, Any] | None:
        """Where the object was forked from, as its first record says."""
        with self._lock:
            if object_id in self._origins:
                return self._origins[object_id]
        try:
            first = self._app.store.record(object_id, 1)
        except RecordDecodeError:
            return None
        if first is None or not self.vouched(object_id, [first]):
            return None
        origin = forked_from([first])
        with self._lock:
            if len(self._origins) >= ORIGINS_KEPT:
                self._origins.clear()
            self._origins[object_id] = origin
        return origin

    def asking(self, info: ObjectInfo) -> ObjectInfo:
        """``info`` with the questions it asks, for an object whose row says it may ask."""
        if info.terminal or not may_ask(info.note, info.waiting_event):
            return info
        try:
            asking = self.questions_of(info.object_id, info.agent, info.records)
        except RecordDecodeError:
            return info
        return dataclasses.replace(info, asking=tuple(asking))

    def questions(self, agent: str | None, limit: int) -> list[Question]:
        """See ``App.questions``."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ConfigurationError(f"limit must be a whole number, 0 or more, not {limit!r}")
        found: list[Question] = []
        for row in self._app.store.list(status=Status.DORMANT.value, agent=agent,
                                        limit=100_000):
            if not may_ask(row.note, row.waiting_event):
                continue
            try:
                found.extend(self.questions_of(row.object_id, row.agent, row.head_seq))
            except RecordDecodeError:
                continue  # damaged memory: ``verify`` names it
        found.sort(key=lambda q: (q.asked_at, q.object_id, q.seq), reverse=True)
        return found[:limit]

    def questions_of(self, object_id: str, agent: str, head_seq: int) -> list[Question]:
        """The pending questions of an object that asks: from the tail of its memory,
        else from all of it."""
        store = self._app.store
        tail = store.records(object_id, after_seq=max(0, head_seq - QUESTION_TAIL))
        found = (pending_questions(self._opened(tail), agent)
                 if self.vouched(object_id, tail) else [])
        if found or head_seq <= QUESTION_TAIL:
            return found
        records = store.records(object_id)
        return (pending_questions(self._opened(records), agent)
                if self.vouched(object_id, records) else [])

    def _opened(self, records: list[Record]) -> list[Record]:
        """``records`` opened where the App may (a sealed prompt); a sealed value that
        does not decrypt stays sealed, with a warning (``verify`` names the record)."""
        try:
            return self._app.client.opener(self._app.open_sealed).records(records)
        except SealBrokenError as exc:
            log.warning("%s; its question is shown sealed", exc,
                        extra={"action": "seal_broken"})
            return records

    def vouched(self, object_id: str, records: Sequence[Record]) -> bool:
        """Whether ``records`` (a run of an object's memory) link up and their last one is
        signed under a key this node trusts, which vouches for the run; a warning names
        them otherwise."""
        if not records:
            return True
        try:
            check_links(object_id, records, start_hash=records[0].prev_hash,
                        start_seq=records[0].seq)
        except IntegrityError as exc:
            problem: str | None = exc.reason
        else:
            problem = self._app.verifier.record_problem(records[-1])
        if problem is not None:
            log.warning("object %s: records #%d..#%d are not vouched for (%s); what they "
                        "say is not shown (run `perdure verify %s`)", object_id,
                        records[0].seq, records[-1].seq, problem, object_id,
                        extra={"action": "not_vouched"})
        return problem is None
