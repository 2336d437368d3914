"""The engine's own control-flow signals: how a command unwinds the agent to the node loop.

Each derives from ``perdure.errors.PerdureSignal`` (a ``BaseException``), so an agent's
``except Exception`` cannot swallow it; the node loop (``Worker._execute``) and the
replay checker catch them and turn each into what it says: a dormant (or paused, or
ready) object, a parked one, or a failure by deadline. The whole tree is drawn in
``perdure/errors.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

from perdure.core.lifecycle import Status
from perdure.core.records import RecordDraft
from perdure.errors import PerdureSignal

__all__ = ["DeadlineExceeded", "Park", "Suspend"]


class Suspend(PerdureSignal):
    """Unwind the agent: the object goes dormant (or paused) and the node lets it go."""

    def __init__(
        self,
        drafts: Sequence[RecordDraft],
        *,
        ready_at: float | None,
        waiting_event: str | None = None,
        status: Status = Status.DORMANT,
        reason: str = "",
        children: Sequence[str] = (),
        consume_event_ids: Sequence[int] = (),
        requires: tuple[str, ...] | None = None,
        avoid_node: str | None = None,
        note: str | None = None,
    ) -> None:
        super().__init__(reason)
        self.note = note  # what ``App.get`` says of the dormant object, if anything
        self.drafts = list(drafts)
        self.ready_at = ready_at
        self.waiting_event = waiting_event
        self.status = status
        self.reason = reason
        self.children = tuple(children)
        self.consume_event_ids = tuple(consume_event_ids)
        self.requires = requires
        self.avoid_node = avoid_node


class Park(PerdureSignal):
    """Unwind the agent and park the object: a person must look at it.

    ``record`` is what memory says about why (a non-determinism record, or a park
    record naming the step that kept killing its workers); ``error`` says it in words.
    """

    def __init__(self, error: Exception, record: RecordDraft | None = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.record = record


class DeadlineExceeded(PerdureSignal):
    """The intent's deadline passed while the agent ran."""
