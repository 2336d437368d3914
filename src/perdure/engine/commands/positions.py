"""Positions: where each command sits in an object's memory, main line or ``gather`` branch.

Commands on the agent's main line take integer positions ``0, 1, 2, ...`` from the
run's cursor (``Run._take``). Inside a branch of ``run.gather`` at position ``5``,
branch ``1``'s commands take ``"5.1.0"``, ``"5.1.1"``, ...: the branch's place in the
call, never the order in which branches happen to run, so a replay after a crash
finds each branch's records where they were. The branch a coroutine runs in is a
context variable, which every task created inside the branch inherits. A run on which
no gather has run yet (``Run._branched``) has no branches: its commands are all on the
main line, and the hot path does not read the variable.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass

from perdure.core.records import Kind, Record

__all__ = ["Branch", "branch", "find", "top"]


@dataclass
class Branch:
    """A branch of ``run.gather``: its commands take positions under ``prefix``."""

    prefix: str
    counter: int = 0


#: The ``gather`` branch the current coroutine runs in (``None``: the main line).
branch: ContextVar[Branch | None] = ContextVar("perdure_branch", default=None)


def top(position: int | str) -> int:
    """The top-level command position of a (possibly branch) position ``3`` / ``"3.1.0"``."""
    return position if isinstance(position, int) else int(str(position).split(".", 1)[0])


def find(recs: Sequence[Record], kind: Kind) -> Record | None:
    """The first record of ``kind`` among what a position holds, or ``None``."""
    for rec in recs:
        if rec.kind == kind:
            return rec
    return None
