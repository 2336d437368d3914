"""``run.resource``: hold a live thing, with its descriptor in memory.

The replay rule: a position holding a ``resource`` record returns the live thing the
reentry restored (``engine.restore`` brings back every resource still held before the
agent's code continues); a resource released later in memory is brought back from its
last descriptor when its declaration is replayed (the code up to the release runs
again and may use it), and closed by the replayed release.

The execution rule: open the live thing (``recipe.open()``), describe it (the
descriptor and what its staleness checks see, through the same JSON encoding step
results take), record the descriptor durably, then hand the live thing to the agent.
A recipe that cannot open here (``CannotRestoreError``) records a negative capability
and the object moves to another node.

``run.checkpoint_resources()`` records each held resource's descriptor as of now (a
file's position, say) when it changed; ``run.release(name)`` closes one and records
that it is no longer held. Neither takes a position: a later descriptor supersedes
the earlier ones, so it goes to the resource's checkpoint slot (``engine.slots``),
outside the chain, where it replaces the one before; the release is a chain record and
deletes the slot.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from perdure.core.bodies import CapabilityMissing, ResourceHeld
from perdure.core.lifecycle import Status
from perdure.core.records import Kind
from perdure.engine.payloads import recorded_payload
from perdure.engine.signals import Suspend
from perdure.engine.slots import resource_slot
from perdure.errors import CannotRestoreError, ConfigurationError, PerdureSignal
from perdure.resources._protocol import Resource, type_name
from perdure.resources.checks import see_all

if TYPE_CHECKING:
    from perdure.engine.run import Run

__all__ = ["CMD", "Held", "checkpoint_resources", "clean_descriptor", "holding",
           "put_descriptors", "release", "resource"]

T = TypeVar("T")

CMD = "resource"
log = logging.getLogger("perdure.resources")


@dataclass
class Held:
    """A resource this run holds: its recipe, declaration position and latest descriptor."""

    name: str
    recipe: type[Resource[Any]]
    pos: int | str
    version: int
    on_stale: str
    descriptor: dict[str, Any]
    live: Any
    #: Whether this node wrote the resource's checkpoint slot (release deletes it).
    written: bool = False

    def record(self, run: Run, state: str = "open") -> ResourceHeld:
        """A superseding descriptor record of this resource (its secrets sealed by
        ``run``'s sealer, as every payload is)."""
        return ResourceHeld(self.name, type_name(self.recipe), self.version,
                            sealed_descriptor(run, self.name, self.descriptor),
                            state, self.on_stale, decl=self.pos)


def clean_descriptor(name: str, descriptor: Any) -> dict[str, Any]:
    """``descriptor`` as memory holds it: through the encoder every recorded value takes
    (``SerializationError`` for what is not JSON), read back."""
    if not isinstance(descriptor, dict):
        raise ConfigurationError(f"resource {name!r}: describe() must return a dict, not "
                                 f"{type(descriptor).__name__}")
    clean: dict[str, Any] = recorded_payload(descriptor,
                                             what=f"descriptor of resource {name!r}")
    return clean


def sealed_descriptor(run: Run, name: str, descriptor: dict[str, Any]) -> Any:
    """``descriptor`` as the record body keeps it: secrets (or, for an agent that
    encrypts all, the whole descriptor) sealed through the run's payload path."""
    stored, _ = run._stored(descriptor, what=f"descriptor of resource {name!r}")
    return stored


async def resource(self: Run, name: str, recipe: Resource[T]) -> T:
    """Hold the live thing ``recipe`` opens, under ``name``; on every reentry it is
    restored from its descriptor (and validated) before the agent's code continues.

    The descriptor, never a handle, is recorded. See ``perdure.resources``.
    """
    if not isinstance(name, str) or not name:
        raise ConfigurationError("run.resource: name must be a non-empty string")
    if not isinstance(recipe, Resource):
        raise ConfigurationError(f"run.resource({name!r}): {recipe!r} is not a "
                                 f"perdure.resources.Resource")
    pos, recs = self._take(CMD, name)
    if recs:
        held = self._held.get(name)
        if held is not None and held.pos == pos:
            return held.live  # type: ignore[no-any-return]
        # Released later in memory (or a name declared again since): the code between
        # here and the release runs again, so it gets the thing again, until the
        # replayed release closes it.
        return await _again(self, name, pos)  # type: ignore[no-any-return]
    self._boundary()
    if name in self._held:
        raise ConfigurationError(f"run.resource: {name!r} is already held; release it first")
    cls = type(recipe)
    try:
        live = await recipe.open()
    except CannotRestoreError as exc:
        node = self._journal.signer.node_id
        raise Suspend([CapabilityMissing.cannot(node, f"resource {name}", exc.reason, pos,
                                                self._clock()).draft()],
                      ready_at=self._clock(), status=Status.READY, avoid_node=node,
                      reason=f"node {node} cannot open resource {name}: {exc.reason}",
                      note=f"node {node} cannot open resource {name}: {exc.reason}"[:500]
                      ) from None
    try:
        described = recipe.describe(live)
        if recipe.checks:
            described = {**described, "checks": await see_all(recipe.checks, live)}
        descriptor = clean_descriptor(name, described)
        await self._journal.commit([ResourceHeld(
            name, type_name(cls), recipe.version, sealed_descriptor(self, name, descriptor),
            "open", recipe.on_stale,
            pos=pos).draft()])
    except BaseException:
        await cls.close(live)
        raise
    self._held[name] = Held(name, cls, pos, recipe.version, recipe.on_stale, descriptor, live)
    return live


async def _again(run: Run, name: str, pos: int | str) -> Any:
    """The live thing of a resource declared at ``pos`` and released since, restored
    from its last descriptor for the replay (not validated, nothing recorded); ``None``
    when a replay check runs (nothing is restored there) or it cannot be restored."""
    if run._journal.committer is None:
        return None
    from perdure.resources._protocol import recipe_for

    body = None
    for rec in reversed(run._records):
        if rec.kind == Kind.RESOURCE and rec.body.get("name") == name and (
                rec.body.get("pos", rec.body.get("decl")) == pos):
            body = rec.body
            break
    if body is None:
        return None
    try:
        recipe = recipe_for(str(body["type"]))
        live = await recipe.restore(dict(body["descriptor"]))
    except Exception:
        log.warning("resource %s (released later) could not be brought back for the "
                    "replay", name, exc_info=True, extra={"action": "resource_replay_failed"})
        return None
    run._replayed[name] = Held(name, recipe, pos, int(body["version"]), str(body["on_stale"]),
                               dict(body["descriptor"]), live)
    return live


async def checkpoint_resources(self: Run, *names: str) -> int:
    """Record the descriptor of each held resource (or of ``names``) as of now, where it
    changed (a file's position, a new process id); returns how many were recorded.

    Durable when it returns. Skipped while the agent is still replaying: the restored
    descriptors are the latest ones.
    """
    if self.replaying:
        return 0
    unknown = [n for n in names if n not in self._held]
    if unknown:
        raise ConfigurationError(f"checkpoint_resources: not held: {', '.join(unknown)}")
    changed = []
    for held in [self._held[n] for n in names] if names else list(self._held.values()):
        now = clean_descriptor(held.name, await held.recipe.recapture(held.descriptor,
                                                                       held.live))
        if now != held.descriptor:
            held.descriptor = now
            changed.append(held)
    if changed:
        self._boundary()
        await put_descriptors(self, changed)
    return len(changed)


async def put_descriptors(run: Run, changed: list[Held]) -> None:
    """Keep each of ``changed``'s latest descriptor in its checkpoint slot
    (``engine.slots``: outside the chain, superseding the one before); a journal without
    slots (none in tests of a bare run) records them in the chain instead."""
    slots = run._journal.slots
    if slots is None:
        await run._journal.commit([held.record(run).draft() for held in changed])
        return
    for held in changed:
        await slots.put(run._journal, resource_slot(held.name), held.record(run).encode())
        held.written = True


async def release(self: Run, name: str) -> None:
    """Close the resource held under ``name`` and record that it is no longer held (a
    later reentry does not restore it). Releasing one not held does nothing, and so does
    a release replayed (memory holds it already)."""
    if self.replaying:  # recorded already: close what the replay brought back
        again = self._replayed.pop(name, None)
        if again is not None:
            await again.recipe.close(again.live)
        return
    held = self._held.pop(name, None)
    if held is None:
        return
    try:
        await held.recipe.close(held.live)
    finally:
        await self._journal.commit([held.record(self, "closed").draft()])
        slots = self._journal.slots
        if slots is not None and (held.written or resource_slot(name) in self._slots):
            await slots.drop(self._journal, [resource_slot(name)])
            self._slots.pop(resource_slot(name), None)


@contextlib.asynccontextmanager
async def holding(self: Run, name: str, recipe: Resource[T]) -> AsyncIterator[T]:
    """``async with run.holding(name, recipe) as live:`` hold it for the block, then
    release it (``run.resource`` then ``run.release``)."""
    live = await resource(self, name, recipe)
    try:
        yield live
    except PerdureSignal:  # dormancy, a lost lease: the resource is still held in memory
        raise
    except BaseException:
        await release(self, name)
        raise
    await release(self, name)
