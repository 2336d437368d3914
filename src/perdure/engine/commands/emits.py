"""``run.emit(name, data)``: an event for whoever follows the object, written once.

The replay rule: an ``emitted`` record at the position means the event was emitted
before; nothing is written again, so a follower (``Handle.stream``, ``perdure tail
--follow``) that saw it never sees it twice, even when the agent is replayed after a
crash. The execution rule: check the run may go on, then commit the ``emitted`` record
at once (with whatever was deferred before it), so a follower sees it while the agent
goes on: one store write per emit. An emit whose commit a crash prevented was never
seen by anyone; the replayed agent emits it then.

``run.progress`` differs: a progress note takes no position, waits for the next
record's commit and is not replayed (it may be lost, or in rare cases written twice).
Use ``emit`` for what a client must see exactly once, in order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from perdure.core.bodies import Emitted
from perdure.core.codec import MAX_DEPTH
from perdure.core.names import check_name
from perdure.core.records import Kind
from perdure.engine.commands.positions import find

if TYPE_CHECKING:
    from perdure.engine.run import Run

__all__ = ["emit"]


async def emit(self: Run, name: str, data: Any = None) -> None:
    """Emit event ``name`` with JSON ``data`` to the object's followers, once.

    Committed to memory at once (one write); on replay an event already emitted is not
    written again. ``SerializationError`` if ``data`` is not a JSON value.
    """
    check_name(name, "emitted event name")
    pos, recs = self._take("emit", name)
    if find(recs, Kind.EMITTED) is not None:
        return
    stored, _ = self._stored(data, what=f"data of emitted event {name!r}", max_depth=MAX_DEPTH)
    self._boundary()
    await self._journal.commit([Emitted(pos, name, stored).draft()])
