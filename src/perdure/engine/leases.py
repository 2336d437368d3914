"""Keeping the objects a node runs: lease renewal, control flags, revocation, dead leases.

A lease is renewed at a third of its length while the object runs here; a lease
found lost stops the run at its next command. Cancel and pause requests (and lost
leases) are noticed by one read for every running object every ``control_interval``,
and again just before a step starts. A node whose own key was revoked stops. A
restarted worker takes back its crashed predecessor's objects at once. Safety never
depends on any of this being timely: every write is fenced by the epoch.
"""

from __future__ import annotations

import asyncio
import logging
import os

from perdure.core.trust import public_key_bytes, when
from perdure.engine.journal import Journal, StoreUnavailable
from perdure.engine.node import Active, Node
from perdure.engine.run import Run
from perdure.errors import StoreError
from perdure.keys.folder import public_bytes

__all__ = [
    "cancel_pending",
    "control_loop",
    "heartbeat",
    "node_gone",
    "recover_dead_leases",
    "refresh_flags",
    "renew_loop",
]

log = logging.getLogger("perdure.worker")


def heartbeat(node: Node) -> None:
    """Tell the store this node is alive, which agent versions and capabilities it has."""
    now = node.clock()
    signer = node.signer
    node.store.heartbeat(signer.node_id, public_bytes(signer.private_key), node.serves,
                         sorted(node.capabilities), now, now + node.settings.lease_seconds)


def node_gone(node: Node) -> None:
    """Tell the store this node stopped, so it stops counting as live at once."""
    node.store.node_gone(node.signer.node_id, node.clock())


def recover_dead_leases(node: Node) -> int:
    """End leases held by earlier processes of this node that are no longer alive.

    A restarted worker on the same node takes its crashed predecessor's objects
    back at once instead of waiting for their leases to lapse. Safety does not
    depend on this: every write is still fenced by the epoch.
    """
    now = node.clock()
    ended = 0
    for object_id, owner, epoch in node.store.leases_held(f"{node.signer.node_id}/", now):
        pid_text = owner.rsplit("/", 1)[-1]
        if not pid_text.isdigit() or owner == node.owner or _alive(int(pid_text)):
            continue
        if node.store.expire_lease(object_id, owner, epoch, now):
            ended += 1
            log.info("took back %s from dead process %s", object_id, owner,
                     extra={"action": "lease_recovered"})
    return ended


async def renew_loop(node: Node, stop: asyncio.Event) -> None:
    """Every third of a lease: heartbeat, flush seen heads, check this node's key, and
    renew each running object's lease (passing on its flags, or that it was lost)."""
    interval = node.settings.lease_seconds / 3
    while True:
        await asyncio.sleep(interval)
        try:
            await node.write(heartbeat, node)
        except StoreError as exc:
            node.store_failed(exc)
        # The heads this node saw reach its key folder (a restarted node keeps them).
        await node.read(node.anchors.flush)
        if await _revoked(node):
            stop.set()  # records it writes would count for nobody: let everything go
        for object_id, active in list(node.active.items()):
            until = node.clock() + node.settings.lease_seconds
            try:
                claim = await node.write(node.store.renew, object_id, active.claim.epoch, until)
            except StoreError as exc:
                node.store_failed(exc)
                continue
            run = active.run
            if claim is None:
                if active.task.done() or await _released_by_us(node, object_id, active):
                    continue  # the run let the object go itself; nothing was lost
                log.warning("lease on %s lost", object_id, extra={"action": "lease_lost"})
                if run is not None:
                    run.lease_lost = True
                continue
            if run is not None:
                run.cancel_requested = claim.cancel_requested
                run.pause_requested = claim.paused
                run.release_requested = stop.is_set()


async def _revoked(node: Node) -> bool:
    """Whether this node's own key was revoked (a revocation published in the store
    reaches the node within the verifier's ``max_age_seconds``)."""
    try:
        await node.read(node.verifier.refresh_if_stale)
    except StoreError as exc:
        node.store_failed(exc)
        return False
    since = node.verifier.ring.revoked_since(public_key_bytes(node.signer.private_key))
    if since is None or since > node.clock():
        return False
    log.error("this node's key was revoked (from %s): it stops; give it a new key "
              "(`perdure keys rotate`) and have it certified", when(since),
              extra={"action": "key_revoked"})
    return True


async def control_loop(node: Node) -> None:
    """Notice cancel and pause requests (and lost leases) within ``control_interval``.

    One read for all running objects; the run acts on the flags at its next
    command boundary.
    """
    while True:
        await asyncio.sleep(node.settings.control_interval)
        if not node.active:
            continue
        active = dict(node.active)
        try:
            flags = await node.read(node.store.control_flags, list(active))
        except StoreError as exc:
            node.store_failed(exc)
            continue
        for object_id, entry in active.items():
            run = entry.run
            found = flags.get(object_id)
            if run is None or found is None or entry.task.done():
                continue
            epoch, cancel, paused = found
            if epoch != entry.claim.epoch:
                log.warning("lease on %s lost (epoch %d is now %d)", object_id,
                            entry.claim.epoch, epoch, extra={"action": "lease_lost"})
                run.lease_lost = True
                continue
            run.cancel_requested = run.cancel_requested or cancel
            run.pause_requested = paused


async def _released_by_us(node: Node, object_id: str, active: Active) -> bool:
    try:
        row = await node.read(node.store.get, object_id)
    except StoreError:
        return False
    return row is not None and row.epoch == active.claim.epoch and row.lease_owner is None


async def refresh_flags(node: Node, run: Run, epoch: int) -> None:
    """Read the object's cancel and pause flags now (before a step starts)."""
    try:
        flags = await node.read(node.store.control_flags, [run.object_id])
    except StoreError as exc:
        raise StoreUnavailable(exc) from exc
    found = flags.get(run.object_id)
    if found is None:
        return
    current, cancel, paused = found
    if current != epoch:
        run.lease_lost = True
    run.cancel_requested = run.cancel_requested or cancel
    run.pause_requested = paused


async def cancel_pending(node: Node, journal: Journal) -> bool:
    """Whether this node still holds the object (its epoch) and a cancel is pending."""
    try:
        flags = await node.read(node.store.control_flags, [journal.object_id])
    except StoreError as exc:
        raise StoreUnavailable(exc) from exc
    found = flags.get(journal.object_id)
    return found is not None and found[0] == journal.epoch and found[1]


def _alive(pid: int) -> bool:
    """True if a process with ``pid`` exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
