"""How an object changes course mid-life: ``run.refine``, ``run.patched``, ``run.deprecate_patch``.

``refine``: the replay rule reads the ``intent_refined`` record at the position (and
never winds the intent back past a newer refinement); the execution rule commits the
refined intent with the next intent version.

``patched``: the path an object takes through ``if run.patched(name):`` is decided
once per object at the first call of ``name``, from memory: a ``patched`` record at
the position means the new path (replayed past), other records there mean memory
from before the patch (the old path, recording nothing), no record means new work
(the new path, recorded with the next commit). ``deprecate_patch`` replays past a
mark and records nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from perdure.core.bodies import IntentRefined, Patched
from perdure.core.codec import decode, encode
from perdure.core.intent import Intent, budget_body
from perdure.core.records import Kind
from perdure.engine.commands.positions import find

if TYPE_CHECKING:
    from perdure.engine.run import Run

__all__ = ["deprecate_patch", "encode_json", "patched", "refine"]


def encode_json(value: Any) -> Any:
    """``value`` as memory will hold it (raises ``SerializationError`` if it cannot)."""
    return decode(encode(value))


async def refine(self: Run, **changes: Any) -> Intent:
    """Refine this object's intent (deadline, max_failures, goal, requires, budget).

    Appends an intent-refinement record with the next intent version; ``run.intent``
    shows it at once, and on every later cycle.
    """
    key, recs = self._take("refine", None)
    rec = find(recs, Kind.INTENT_REFINED)
    if rec is not None:
        recorded = Intent.from_body(rec.body["intent"])
        # Replay never winds the intent back: later refinements (from outside, or
        # further in memory) already made the current intent newer than this one.
        if recorded.version_no > self._intent.version_no:
            self._intent = recorded
        return recorded
    self._boundary()
    if "budget" in changes:  # a perdure.llm.Budget is recorded as the intent holds it
        changes["budget"] = budget_body(changes["budget"])
    refined = self._intent.refined(dict(changes))
    await self._journal.commit([IntentRefined(refined, encode_json(changes), pos=key).draft()],
        requires=tuple(refined.requires) if "requires" in changes else None)
    self._intent = refined
    return refined


def patched(self: Run, name: str) -> bool:
    """``True`` where code behind ``if run.patched(name):`` should run.

    Decided once per object, at the first call of ``name``: an object that reaches
    it as new work takes the patched path (and records that it did); an object
    whose memory was written before the patch (memory holds something else at that
    point) keeps the old path, at that call and at every later call of the same
    name. So adding a patched block never breaks a running object, and no object
    mixes old and new paths. Retire a patch with ``deprecate_patch``.
    """
    key = self._key(consume=False)
    recs = self._recorded(key)
    marked = bool(recs) and recs[0].kind == Kind.PATCHED and recs[0].body.get("name") == name
    decided = self._patches.get(name)
    if marked:
        self._key()
        self._patches.setdefault(name, True)
        return True  # memory says this call took the new path: replay it
    if decided is not None:
        if decided and not recs:
            self._key()  # new work on the new path: recorded as every call before
            self._journal.defer(Patched(key, name).draft())
        return decided
    if recs:
        self._patches[name] = False  # memory from before the patch: the old path
        return False
    self._patches[name] = True
    self._key()
    self._journal.defer(Patched(key, name).draft())
    return True


def deprecate_patch(self: Run, name: str) -> None:
    """Say that only the new path of patch ``name`` is left in the code.

    Step 2 of retiring a patch (see ``patched``): once no object that began before
    the patch is alive, replace ``if run.patched(name): new else: old`` with
    ``run.deprecate_patch(name)`` followed by the new code. Objects whose memory
    recorded the patch replay past its mark; new objects record nothing. Once no
    object with the mark is alive either, remove the call.
    """
    key = self._key(consume=False)
    recs = self._recorded(key)
    if recs and recs[0].kind == Kind.PATCHED and recs[0].body.get("name") == name:
        self._key()
    self._patches[name] = True
