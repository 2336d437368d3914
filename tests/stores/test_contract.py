"""The store contract: every backend behaves the same behind the ``Store`` protocol.

Written against the protocol only (no backend internals); records are sealed and
signed the way a node does it.

Timers (``ready_at``) are compared with the ``now`` a node passes, so most tests use
the logical time ``NOW``. Lease expiry is real time (a backend may decide it by its
own clock, as PostgreSQL does), so tests about leases running out use ``time.time()``,
short leases and real waits.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from perdure.core.chain import Signer
from perdure.errors import (
    IntegrityError,
    LeaseLostError,
    ObjectNotFoundError,
    ObjectTerminatedError,
)
from perdure.keys.folder import public_bytes
from perdure.stores import Claim, Store
from tests.stores.builders import NOW, Chain, make_signer

LEASE = NOW + 30.0
SHORT = 0.3
"""Seconds of a lease meant to run out during the test."""
CLOCK_SLACK = 1.0
"""How far a lease expiry may be from ``lease_until``: a backend deciding expiry by its
own clock counts the lease from when it runs the claim, a little after ``now``."""


def _sleep_past(moment: float) -> None:
    """Sleep in real time until a little after the Unix time ``moment``."""
    time.sleep(max(0.0, moment - time.time()) + 0.05)


def _created(store: Store, signer: Signer, object_id: str, *, ready_at: float = NOW,
             now: float = NOW, agent: str = "agent") -> Chain:
    chain = Chain(object_id, signer, agent=agent)
    assert store.create(chain.new_object(ready_at=ready_at), now) is True
    return chain


def _claim_one(store: Store, object_id: str, *, owner: str = "w1", now: float = NOW) -> Claim:
    claims = store.claim(owner, now, now + 30.0, 100)
    found = [c for c in claims if c.object_id == object_id]
    assert found, f"{object_id} was not claimable; got {claims}"
    return found[0]


def _dormant(store: Store, chain: Chain, claim: Claim, *, ready_at: float | None,
             waiting_event: str | None = None, now: float = NOW) -> None:
    """Append one dormancy record and release the object, as a node going dormant does."""
    op = chain.append(claim.epoch, chain.extend(), status="dormant", phase="dormancy",
                      ready_at=ready_at, waiting_event=waiting_event, release=True)
    assert store.apply([op], now) == [None]


# -- nodes ------------------------------------------------------------------------------


def test_a_node_is_live_until_its_heartbeat_runs_out(store: Store) -> None:
    """A heartbeat makes a node live until the time it names (the first one adds the node);
    after that, or once the node says it stopped, it is not live."""
    key = {name: public_bytes(make_signer(name).private_key) for name in ("node-a", "node-b")}
    store.heartbeat("node-a", key["node-a"], ["agent@1"], ["gpu"], NOW, NOW + 30)
    store.heartbeat("node-b", key["node-b"], [], [], NOW, NOW + 10)
    live = store.live_nodes(NOW + 5)
    assert [(n.node_id, n.serves, n.capabilities, n.seen_at, n.live_until) for n in live] == [
        ("node-a", ("agent@1",), ("gpu",), NOW, NOW + 30),
        ("node-b", (), (), NOW, NOW + 10),
    ]
    assert [n.node_id for n in store.live_nodes(NOW + 10)] == ["node-a"]
    store.node_gone("node-a", NOW + 11)
    assert store.live_nodes(NOW + 11) == []
    store.heartbeat("node-a", key["node-a"], [], [], NOW + 12, NOW + 42)  # back again
    assert [n.node_id for n in store.live_nodes(NOW + 12)] == ["node-a"]
    store.node_gone("node-a", NOW + 50)  # stopping after it aged out changes nothing
    assert store.live_nodes(NOW + 13)[0].live_until == NOW + 42


# -- objects and records ----------------------------------------------------------------


def test_create_then_get(store: Store, signer: Signer) -> None:
    """A created object is ready, unleased, at epoch 0, with its first record as head."""
    chain = Chain("obj-1", signer)
    assert store.create(chain.new_object(ready_at=NOW + 5, parent_id="parent"), NOW) is True
    row = store.get("obj-1")
    assert row is not None
    assert (row.object_id, row.agent, row.agent_version) == ("obj-1", "agent", "1")
    assert (row.status, row.phase, row.epoch) == ("ready", "instantiated", 0)
    assert row.lease_owner is None and row.lease_expires is None
    assert row.ready_at == NOW + 5
    assert (row.head_seq, row.head_hash) == (1, chain.head.hash)
    assert row.parent_id == "parent"
    assert not (row.paused or row.cancel_requested or row.parked)
    assert row.result is None and row.note is None
    assert store.records("obj-1") == chain.records


def test_create_is_idempotent(store: Store, signer: Signer) -> None:
    """Creating an existing id returns False and changes neither the row nor the memory."""
    chain = _created(store, signer, "obj-1")
    before = store.get("obj-1")
    other = Chain("obj-1", make_signer("node-b"), agent="other-agent")
    assert store.create(other.new_object(ready_at=NOW + 99), NOW + 1) is False
    assert store.get("obj-1") == before
    assert store.records("obj-1") == chain.records


def test_get_unknown_is_none(store: Store) -> None:
    """``get`` of an id never created returns None; its records are empty."""
    assert store.get("nope") is None
    assert store.records("nope") == []


def test_list_filters_and_orders_newest_first(store: Store, signer: Signer) -> None:
    """``list`` filters by status, phase and agent, honours ``limit``, newest first."""
    _created(store, signer, "a", now=NOW + 1, agent="alpha", ready_at=NOW + 100)
    _created(store, signer, "b", now=NOW + 2, agent="beta", ready_at=NOW + 100)
    chain_c = _created(store, signer, "c", now=NOW + 3, agent="alpha")
    claim = _claim_one(store, "c", now=NOW + 4)
    assert store.apply([chain_c.append(claim.epoch, chain_c.extend(), status="completed",
                                       phase="termination", ready_at=None, release=True)],
                       NOW + 4) == [None]

    assert [r.object_id for r in store.list()] == ["c", "b", "a"]
    assert [r.object_id for r in store.list(agent="alpha")] == ["c", "a"]
    assert [r.object_id for r in store.list(status="ready")] == ["b", "a"]
    assert [r.object_id for r in store.list(status="completed")] == ["c"]
    assert [r.object_id for r in store.list(phase="termination")] == ["c"]
    assert [r.object_id for r in store.list(status="ready", agent="beta")] == ["b"]
    assert [r.object_id for r in store.list(limit=2)] == ["c", "b"]
    assert store.list(agent="gamma") == []


def test_records_in_order_after_seq(store: Store, signer: Signer) -> None:
    """``records`` returns the memory in sequence order, only past ``after_seq``."""
    chain = _created(store, signer, "obj-1")
    claim = _claim_one(store, "obj-1")
    assert store.apply([chain.append(claim.epoch, chain.extend(4))], NOW) == [None]
    got = store.records("obj-1")
    assert [r.seq for r in got] == [1, 2, 3, 4, 5]
    assert got == chain.records
    assert [r.seq for r in store.records("obj-1", after_seq=3)] == [4, 5]
    assert store.records("obj-1", after_seq=5) == []
    assert got[2].body == {"n": 3} and got[2].signature == chain.records[2].signature


def test_chain_is_the_records_with_links_checked(store: Store, signer: Signer) -> None:
    """``chain`` gives what ``records`` gives, checked from the hash it follows."""
    chain = _created(store, signer, "obj-1")
    claim = _claim_one(store, "obj-1")
    assert store.apply([chain.append(claim.epoch, chain.extend(4))], NOW) == [None]
    assert store.chain("obj-1") == store.records("obj-1") == chain.records
    assert store.chain("obj-1", 3, chain.records[2].hash) == chain.records[3:]
    assert store.chain("obj-1", 5, chain.records[4].hash) == []
    with pytest.raises(IntegrityError) as info:
        store.chain("obj-1", 3, chain.records[1].hash)
    assert info.value.seq == 4 and "previous-hash" in info.value.reason


def test_chain_with_header_strings_that_need_escaping(store: Store) -> None:
    """A node id holding a quote and U+001F (the separator one backend joins the header
    strings with) reads back exactly, through the full read."""
    odd = make_signer('node "a"\x1fb')
    chain = _created(store, odd, "obj-odd")
    claim = _claim_one(store, "obj-odd")
    assert store.apply([chain.append(claim.epoch, chain.extend(2))], NOW) == [None]
    assert store.chain("obj-odd") == chain.records
    assert store.chain("obj-odd", 1, chain.records[0].hash) == chain.records[1:]


# -- claiming and leases ----------------------------------------------------------------


def test_claim_up_to_limit_and_bumps_epoch(store: Store, signer: Signer) -> None:
    """``claim`` leases at most ``limit`` objects, oldest ready first, each at epoch + 1.

    The lease runs ``lease_until - now`` seconds of real time from the claim; the row
    and the claim agree on its expiry, and nobody else can claim it meanwhile.
    """
    now = time.time()
    for index, oid in enumerate(["o1", "o2", "o3"]):
        _created(store, signer, oid, ready_at=now - 10 + index)
    lease_until = now + 30.0
    first = store.claim("w1", now, lease_until, 2)
    assert [c.object_id for c in first] == ["o1", "o2"]
    assert all(c.epoch == 1 for c in first)
    assert all(c.lease_expires == pytest.approx(lease_until, abs=CLOCK_SLACK) for c in first)
    second = store.claim("w2", time.time(), time.time() + 30.0, 5)
    assert [c.object_id for c in second] == ["o3"]
    assert store.claim("w3", time.time(), time.time() + 30.0, 5) == []
    row = store.get("o1")
    assert row is not None
    assert (row.lease_owner, row.lease_expires, row.epoch) == ("w1", first[0].lease_expires, 1)
    assert row.status == "running"
    assert store.claim("w1", time.time(), time.time() + 30.0, 0) == []


def test_claim_skips_not_ready_paused_and_parked(store: Store, signer: Signer) -> None:
    """Objects ready later, paused, parked or dormant without a timer are not claimed."""
    _created(store, signer, "later", ready_at=NOW + 60)
    _created(store, signer, "paused")
    store.control("paused", NOW, paused=True)
    parked = _created(store, signer, "parked")
    claim = _claim_one(store, "parked")
    op = parked.append(claim.epoch, parked.extend(), status="parked", phase="evaluation",
                       ready_at=None, release=True, parked=True, note="needs a person")
    assert store.apply([op], NOW) == [None]
    waiting = _created(store, signer, "waiting")
    _dormant(store, waiting, _claim_one(store, "waiting"), ready_at=None, waiting_event="go")

    assert store.claim("w2", NOW + 1, NOW + 31, 10) == []
    assert [c.object_id for c in store.claim("w2", NOW + 60, NOW + 90, 10)] == ["later"]


def test_claim_takes_over_an_expired_lease(store: Store, signer: Signer) -> None:
    """A lease that ran out in real time is taken over by another owner at a higher epoch.

    Until it runs out nobody else gets it, whatever ``now`` the other node passes.
    """
    _created(store, signer, "obj-1", ready_at=time.time() - 1)
    start = time.time()
    held = store.claim("w1", start, start + SHORT, 1)
    assert [c.epoch for c in held] == [1]
    assert store.claim("w2", time.time(), time.time() + 30, 1) == []
    _sleep_past(held[0].lease_expires)
    now = time.time()
    taken = store.claim("w2", now, now + 30, 1)
    assert [(c.object_id, c.epoch) for c in taken] == [("obj-1", 2)]
    row = store.get("obj-1")
    assert row is not None and (row.lease_owner, row.epoch) == ("w2", 2)
    assert row.lease_expires == taken[0].lease_expires


def test_renew_while_held_and_none_after_takeover(store: Store, signer: Signer) -> None:
    """``renew`` extends a held lease past its first expiry; after a takeover the old
    epoch gets None and the new holder can renew."""
    _created(store, signer, "obj-1", ready_at=time.time() - 1)
    start = time.time()
    (claim,) = store.claim("w1", start, start + SHORT, 1)
    until = time.time() + 45
    renewed = store.renew("obj-1", claim.epoch, until)
    assert renewed is not None and renewed.object_id == "obj-1"
    assert renewed.epoch == claim.epoch
    assert renewed.lease_expires == pytest.approx(until, abs=CLOCK_SLACK)
    row = store.get("obj-1")
    assert row is not None and row.lease_expires == renewed.lease_expires
    _sleep_past(claim.lease_expires)  # the first lease would have run out by now
    assert store.claim("w2", time.time(), time.time() + 30, 1) == []

    shortened = store.renew("obj-1", claim.epoch, time.time() + SHORT)
    assert shortened is not None
    _sleep_past(shortened.lease_expires)
    later = time.time()
    taken = store.claim("w2", later, later + 30, 1)
    assert [c.epoch for c in taken] == [claim.epoch + 1]
    assert store.renew("obj-1", claim.epoch, time.time() + 60) is None
    assert store.renew("obj-1", taken[0].epoch, time.time() + 60) is not None
    row = store.get("obj-1")
    assert row is not None and (row.lease_owner, row.epoch) == ("w2", taken[0].epoch)


def test_renew_after_release_is_none(store: Store, signer: Signer) -> None:
    """A released lease cannot be renewed, even at the same epoch."""
    chain = _created(store, signer, "obj-1")
    claim = _claim_one(store, "obj-1")
    _dormant(store, chain, claim, ready_at=NOW + 100)
    assert store.renew("obj-1", claim.epoch, time.time() + 60) is None
    row = store.get("obj-1")
    assert row is not None and (row.lease_owner, row.lease_expires) == (None, None)


def test_renew_reports_pause_and_cancel(store: Store, signer: Signer) -> None:
    """The claim returned by ``renew`` carries the pause and cancel flags set meanwhile."""
    _created(store, signer, "obj-1")
    claim = _claim_one(store, "obj-1")
    store.control("obj-1", NOW, paused=True)
    renewed = store.renew("obj-1", claim.epoch, time.time() + 40)
    assert renewed is not None and renewed.paused and not renewed.cancel_requested
    store.control("obj-1", NOW, cancel=True)
    renewed = store.renew("obj-1", claim.epoch, time.time() + 40)
    assert renewed is not None and renewed.cancel_requested


def test_control_flags_and_leases_held(store: Store, signer: Signer) -> None:
    """``control_flags`` reads epoch, cancel and pause in one go; ``leases_held`` and
    ``expire_lease`` find and end the live leases of one owner prefix."""
    _created(store, signer, "obj-1", ready_at=time.time() - 2)
    _created(store, signer, "obj-2", ready_at=time.time() - 1)
    now = time.time()
    claim = store.claim("node-a/123", now, now + 30, 1)[0]
    store.control(claim.object_id, now, cancel=True)
    flags = store.control_flags([claim.object_id, "missing"])
    assert flags == {claim.object_id: (claim.epoch, True, False)}
    assert store.control_flags([]) == {}
    now = time.time()
    assert store.leases_held("node-a/", now) == [(claim.object_id, "node-a/123", claim.epoch)]
    assert store.leases_held("node-b/", now) == []
    assert store.leases_held("node-a_", now) == []  # the prefix is literal, not a pattern
    assert not store.expire_lease(claim.object_id, "node-a/999", claim.epoch, now)
    assert not store.expire_lease(claim.object_id, "node-a/123", claim.epoch + 1, now)
    assert store.leases_held("node-a/", now) == [(claim.object_id, "node-a/123", claim.epoch)]
    assert store.expire_lease(claim.object_id, "node-a/123", claim.epoch, now)
    assert store.leases_held("node-a/", time.time()) == []
    now = time.time()
    retaken = store.claim("node-b/1", now, now + 30, 2)
    assert {c.object_id for c in retaken} == {"obj-1", "obj-2"}


def test_leases_held_drops_a_lease_that_ran_out(store: Store, signer: Signer) -> None:
    """A lease past its expiry in real time is no longer listed by ``leases_held``."""
    _created(store, signer, "obj-1", ready_at=time.time() - 1)
    start = time.time()
    (claim,) = store.claim("node-a/7", start, start + SHORT, 1)
    assert store.leases_held("node-a/", time.time()) == [("obj-1", "node-a/7", claim.epoch)]
    _sleep_past(claim.lease_expires)
    assert store.leases_held("node-a/", time.time()) == []


def test_next_ready_at_waits_for_a_held_lease(store: Store, signer: Signer) -> None:
    """An object that is due but leased becomes claimable when its lease runs out."""
    _created(store, signer, "obj-1", ready_at=time.time() - 5)
    start = time.time()
    (claim,) = store.claim("w1", start, start + 20, 1)
    due = store.next_ready_at()
    assert due is not None and due == pytest.approx(claim.lease_expires, abs=CLOCK_SLACK)


def test_concurrent_claims_never_share_or_wait(store: Store, signer: Signer,
                                               open_again: Callable[[], Store]) -> None:
    """Two nodes (own connections, own threads) claiming at the same moment, round after
    round, on many ready objects: each claim gets a full batch, no object is claimed
    twice, every object is claimed once, and no claim waits on the other."""
    batch, rounds = 6, 10
    total = 2 * batch * rounds
    base = time.time() - 60
    for index in range(total):
        _created(store, signer, f"obj-{index:03d}", ready_at=base + index * 0.001)
    other = open_again()
    barrier = threading.Barrier(2, timeout=20)
    taken: dict[str, list[Claim]] = {"node-a": [], "node-b": []}
    sizes: dict[str, list[int]] = {"node-a": [], "node-b": []}
    slowest: dict[str, float] = {"node-a": 0.0, "node-b": 0.0}
    errors: list[BaseException] = []

    def node(owner: str, opened: Store) -> None:
        try:
            for _ in range(rounds):
                barrier.wait()
                began = time.monotonic()
                now = time.time()
                claims = opened.claim(owner, now, now + 30, batch)
                slowest[owner] = max(slowest[owner], time.monotonic() - began)
                sizes[owner].append(len(claims))
                taken[owner].extend(claims)
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=node, args=("node-a", store)),
               threading.Thread(target=node, args=("node-b", other))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    assert sizes == {"node-a": [batch] * rounds, "node-b": [batch] * rounds}
    ids_a = {c.object_id for c in taken["node-a"]}
    ids_b = {c.object_id for c in taken["node-b"]}
    assert len(ids_a) == len(ids_b) == batch * rounds
    assert not ids_a & ids_b
    assert ids_a | ids_b == {f"obj-{index:03d}" for index in range(total)}
    assert all(c.epoch == 1 for c in taken["node-a"] + taken["node-b"])
    assert max(slowest.values()) < 2.0, slowest
    assert store.claim("node-c", time.time(), time.time() + 30, total) == []
    for owner in ("node-a", "node-b"):
        row = store.get(taken[owner][0].object_id)
        assert row is not None and row.lease_owner == owner


# -- fenced appends -----------------------------------------------------------------------


def test_apply_appends_and_updates_the_row(store: Store, signer: Signer) -> None:
    """An append at the held epoch adds the records and moves the head, status and phase."""
    chain = _created(store, signer, "obj-1")
    claim = _claim_one(store, "obj-1")
    assert store.apply([chain.append(claim.epoch, chain.extend(2), phase="execution")],
                       NOW + 1) == [None]
    row = store.get("obj-1")
    assert row is not None
    assert (row.head_seq, row.head_hash) == (3, chain.head.hash)
    assert (row.status, row.phase, row.lease_owner) == ("running", "execution", "w1")
    assert row.updated_at == NOW + 1
    assert store.records("obj-1") == chain.records
    assert store.apply([], NOW) == []


def test_apply_is_fenced_by_epoch(store: Store, signer: Signer) -> None:
    """A stale epoch is refused with LeaseLostError while others in the batch still apply."""
    stale = _created(store, signer, "stale", ready_at=time.time() - 1)
    fresh = _created(store, signer, "fresh", ready_at=time.time() - 1)
    start = time.time()
    claims = {c.object_id: c for c in store.claim("w1", start, start + SHORT, 10)}
    _sleep_past(max(c.lease_expires for c in claims.values()))
    later = time.time()
    retaken = store.claim("w2", later, later + 30, 10)
    assert {c.object_id for c in retaken} == {"stale", "fresh"}
    fresh_epoch = next(c.epoch for c in retaken if c.object_id == "fresh")

    results = store.apply(
        [stale.append(claims["stale"].epoch, stale.peek(1)),
         fresh.append(fresh_epoch, fresh.extend(1))],
        later,
    )
    assert isinstance(results[0], LeaseLostError)
    assert results[1] is None
    assert [r.seq for r in store.records("stale")] == [1]
    assert store.records("fresh") == fresh.records
    row = store.get("stale")
    assert row is not None and row.head_seq == 1 and row.lease_owner == "w2"


def test_apply_refuses_a_seq_that_does_not_follow_the_head(store: Store, signer: Signer) -> None:
    """Records must start right after the head: a gap or a repeated seq is refused."""
    chain = _created(store, signer, "obj-1")
    claim = _claim_one(store, "obj-1")
    gap = chain.peek(3)[1:]  # seq 3 and 4 while the head is 1
    results = store.apply([chain.append(claim.epoch, gap)], NOW)
    assert isinstance(results[0], LeaseLostError)
    assert [r.seq for r in store.records("obj-1")] == [1]

    first = chain.extend(1)
    assert store.apply([chain.append(claim.epoch, first)], NOW) == [None]
    again = store.apply([chain.append(claim.epoch, first)], NOW)
    assert isinstance(again[0], LeaseLostError)
    assert store.records("obj-1") == chain.records
    row = store.get("obj-1")
    assert row is not None and row.head_seq == 2


def test_apply_consumes_an_event_exactly_once(store: Store, signer: Signer) -> None:
    """A consumed event leaves the inbox; consuming it again refuses the whole append."""
    chain = _created(store, signer, "obj-1")
    store.send("obj-1", "go", b'{"x":1}', None, NOW)
    (event,) = store.pending_events("obj-1")
    claim = _claim_one(store, "obj-1")
    ok = store.apply([chain.append(claim.epoch, chain.extend(1),
                                   consume_event_ids=(event.event_id,))], NOW)
    assert ok == [None]
    assert store.pending_events("obj-1") == []

    replay = chain.peek(1)
    refused = store.apply([chain.append(claim.epoch, replay,
                                        consume_event_ids=(event.event_id,))], NOW)
    assert isinstance(refused[0], LeaseLostError)
    assert store.records("obj-1") == chain.records
    row = store.get("obj-1")
    assert row is not None and row.head_seq == chain.head.seq


def test_waiting_for_an_already_pending_event_is_ready_now(store: Store, signer: Signer) -> None:
    """Going dormant on an event that is already in the inbox makes the object ready at once."""
    chain = _created(store, signer, "obj-1")
    claim = _claim_one(store, "obj-1")
    store.send("obj-1", "approval", b"true", None, NOW)
    _dormant(store, chain, claim, ready_at=None, waiting_event="approval", now=NOW + 3)
    row = store.get("obj-1")
    assert row is not None
    assert (row.ready_at, row.waiting_event) == (NOW + 3, "approval")
    assert [c.object_id for c in store.claim("w2", NOW + 3, NOW + 30, 5)] == ["obj-1"]


def test_an_event_the_append_consumes_does_not_wake_it_again(store: Store,
                                                             signer: Signer) -> None:
    """An append that receives the event it waited for and waits for the same event again
    (a second question on one event) sleeps: the event it consumes is taken, not pending.
    Another such event in the inbox still wakes it at once."""
    chain = _created(store, signer, "obj-1")
    claim = _claim_one(store, "obj-1")
    store.send("obj-1", "answer", b'"first"', None, NOW)
    (first,) = store.pending_events("obj-1")
    op = chain.append(claim.epoch, chain.extend(2), status="dormant", phase="dormancy",
                      ready_at=None, waiting_event="answer", release=True,
                      consume_event_ids=(first.event_id,))
    assert store.apply([op], NOW + 1) == [None]
    row = store.get("obj-1")
    assert row is not None and (row.ready_at, row.waiting_event) == (None, "answer")
    assert store.claim("w2", NOW + 2, NOW + 30, 5) == []

    store.send("obj-1", "answer", b'"second"', None, NOW + 3)
    store.send("obj-1", "answer", b'"third"', None, NOW + 3)
    second, _third = store.pending_events("obj-1")
    claim = _claim_one(store, "obj-1", now=NOW + 4)
    op = chain.append(claim.epoch, chain.extend(2), status="dormant", phase="dormancy",
                      ready_at=None, waiting_event="answer", release=True,
                      consume_event_ids=(second.event_id,))
    assert store.apply([op], NOW + 5) == [None]
    row = store.get("obj-1")
    assert row is not None and row.ready_at == NOW + 5  # "third" still waits: ready now


def test_waiting_without_a_pending_event_sleeps(store: Store, signer: Signer) -> None:
    """Going dormant on an event not yet sent leaves the object without a ready time."""
    chain = _created(store, signer, "obj-1")
    store.send("obj-1", "other", b"null", None, NOW)
    _dormant(store, chain, _claim_one(store, "obj-1"), ready_at=None, waiting_event="approval")
    row = store.get("obj-1")
    assert row is not None and row.ready_at is None and row.status == "dormant"


def test_release_clears_the_lease(store: Store, signer: Signer) -> None:
    """A releasing append drops owner and expiry; the next claim gets a higher epoch."""
    chain = _created(store, signer, "obj-1")
    claim = _claim_one(store, "obj-1")
    _dormant(store, chain, claim, ready_at=NOW + 10)
    row = store.get("obj-1")
    assert row is not None
    assert (row.lease_owner, row.lease_expires, row.ready_at) == (None, None, NOW + 10)
    again = store.claim("w2", NOW + 10, NOW + 40, 1)
    assert [c.epoch for c in again] == [claim.epoch + 1]


def test_cancel_asked_while_running_survives_going_dormant(store: Store, signer: Signer) -> None:
    """A cancel requested while a node holds the object is not lost when that node lets the
    object go dormant on an event: the object stays claimable so a node can cancel it."""
    chain = _created(store, signer, "obj-1")
    claim = _claim_one(store, "obj-1")
    store.control("obj-1", NOW, cancel=True)
    _dormant(store, chain, claim, ready_at=None, waiting_event="never", now=NOW + 1)
    row = store.get("obj-1")
    assert row is not None and row.ready_at == NOW + 1
    assert [c.object_id for c in store.claim("w2", NOW + 1, time.time() + 30, 5)] == ["obj-1"]


def test_apply_stores_result_park_and_note(store: Store, signer: Signer) -> None:
    """An append can set the result bytes, the parked flag and a note."""
    done = _created(store, signer, "done")
    stuck = _created(store, signer, "stuck")
    claims = {c.object_id: c for c in store.claim("w1", NOW, LEASE, 5)}
    results = store.apply([
        done.append(claims["done"].epoch, done.extend(), status="completed",
                    phase="termination", ready_at=None, release=True, result=b'{"ok":true}'),
        stuck.append(claims["stuck"].epoch, stuck.extend(), status="parked", phase="evaluation",
                     ready_at=None, release=True, parked=True, note="memory damaged"),
    ], NOW)
    assert results == [None, None]
    row = store.get("done")
    assert row is not None and row.result == b'{"ok":true}' and row.status == "completed"
    row = store.get("stuck")
    assert row is not None and row.parked and row.note == "memory damaged"


# -- inbox ----------------------------------------------------------------------------------


def test_send_and_pending_events_in_order(store: Store, signer: Signer) -> None:
    """Events come back unconsumed in arrival order with their payload and time."""
    _created(store, signer, "obj-1")
    for index, name in enumerate(["b", "a", "c"]):
        assert store.send("obj-1", name, f'"{name}"'.encode(), None, NOW + index) is True
    events = store.pending_events("obj-1")
    assert [e.name for e in events] == ["b", "a", "c"]
    assert [e.payload for e in events] == [b'"b"', b'"a"', b'"c"']
    assert [e.sent_at for e in events] == [NOW, NOW + 1, NOW + 2]
    assert all(e.object_id == "obj-1" and e.dedupe_key is None for e in events)
    assert events[0].event_id < events[1].event_id < events[2].event_id
    assert store.pending_events("other") == []


def test_send_with_dedupe_key_delivers_once(store: Store, signer: Signer) -> None:
    """A dedupe key already used for the object is not delivered again (per object)."""
    _created(store, signer, "obj-1")
    _created(store, signer, "obj-2")
    assert store.send("obj-1", "pay", b"1", "key-1", NOW) is True
    assert store.send("obj-1", "pay", b"2", "key-1", NOW) is False
    assert store.send("obj-2", "pay", b"3", "key-1", NOW) is True
    assert [e.payload for e in store.pending_events("obj-1")] == [b"1"]
    assert [e.dedupe_key for e in store.pending_events("obj-2")] == ["key-1"]


def test_send_dedupe_key_survives_consumption(store: Store, signer: Signer) -> None:
    """A dedupe key stays used after its event was consumed."""
    chain = _created(store, signer, "obj-1")
    store.send("obj-1", "pay", b"1", "key-1", NOW)
    (event,) = store.pending_events("obj-1")
    claim = _claim_one(store, "obj-1")
    assert store.apply([chain.append(claim.epoch, chain.extend(),
                                     consume_event_ids=(event.event_id,))], NOW) == [None]
    assert store.send("obj-1", "pay", b"1", "key-1", NOW) is False
    assert store.pending_events("obj-1") == []


def test_send_to_unknown_or_terminated(store: Store, signer: Signer) -> None:
    """Sending to an unknown id or a terminated object raises and queues nothing."""
    with pytest.raises(ObjectNotFoundError, match="ghost"):
        store.send("ghost", "go", b"null", None, NOW)
    chain = _created(store, signer, "obj-1")
    claim = _claim_one(store, "obj-1")
    assert store.apply([chain.append(claim.epoch, chain.extend(), status="completed",
                                     phase="termination", ready_at=None, release=True)],
                       NOW) == [None]
    with pytest.raises(ObjectTerminatedError, match="obj-1"):
        store.send("obj-1", "go", b"null", None, NOW)
    assert store.pending_events("obj-1") == []


def test_send_wakes_an_object_waiting_for_that_name(store: Store, signer: Signer) -> None:
    """An event of the awaited name makes a dormant object ready; another name does not."""
    chain = _created(store, signer, "obj-1")
    _dormant(store, chain, _claim_one(store, "obj-1"), ready_at=NOW + 3600,
             waiting_event="approval")
    store.send("obj-1", "other", b"null", None, NOW + 5)
    row = store.get("obj-1")
    assert row is not None and row.ready_at == NOW + 3600
    store.send("obj-1", "approval", b"null", None, NOW + 6)
    row = store.get("obj-1")
    assert row is not None and row.ready_at == NOW + 6
    assert [c.object_id for c in store.claim("w2", NOW + 6, NOW + 36, 5)] == ["obj-1"]


# -- control ------------------------------------------------------------------------------


def test_pause_and_resume(store: Store, signer: Signer) -> None:
    """A paused object is not claimed and is left out of ``next_ready_at``; resume undoes it."""
    _created(store, signer, "obj-1")
    row = store.control("obj-1", NOW, paused=True)
    assert row.paused
    assert store.claim("w1", NOW, LEASE, 5) == []
    assert store.next_ready_at() is None
    row = store.control("obj-1", NOW, paused=False)
    assert not row.paused
    assert store.next_ready_at() == NOW
    assert [c.object_id for c in store.claim("w1", NOW, LEASE, 5)] == ["obj-1"]


def test_cancel_makes_the_object_claimable_now(store: Store, signer: Signer) -> None:
    """Cancel flags the object and brings its ready time forward, even if it is paused."""
    _created(store, signer, "obj-1", ready_at=NOW + 3600)
    store.control("obj-1", NOW, paused=True)
    row = store.control("obj-1", NOW + 1, cancel=True)
    assert row.cancel_requested and row.ready_at == NOW + 1
    (claim,) = store.claim("w1", NOW + 1, LEASE, 5)
    assert claim.cancel_requested and claim.paused


def test_cancel_keeps_an_earlier_ready_time(store: Store, signer: Signer) -> None:
    """Cancelling an object already ready does not push its ready time later."""
    _created(store, signer, "obj-1", ready_at=NOW - 50)
    row = store.control("obj-1", NOW, cancel=True)
    assert row.ready_at == NOW - 50


def test_unpark(store: Store, signer: Signer) -> None:
    """Unparking clears the flag and note and makes the object ready now; else a no-op."""
    chain = _created(store, signer, "obj-1")
    claim = _claim_one(store, "obj-1")
    assert store.apply([chain.append(claim.epoch, chain.extend(), status="parked",
                                     phase="evaluation", ready_at=None, release=True,
                                     parked=True, note="fix the code")], NOW) == [None]
    row = store.control("obj-1", NOW + 5, unpark=True)
    assert not row.parked and row.note is None
    assert (row.status, row.ready_at) == ("ready", NOW + 5)
    assert [c.object_id for c in store.claim("w1", NOW + 5, LEASE, 5)] == ["obj-1"]

    _created(store, signer, "obj-2", ready_at=NOW + 999)
    row = store.control("obj-2", NOW + 5, unpark=True)
    assert row.ready_at == NOW + 999 and row.status == "ready"


def test_control_unknown_or_terminated(store: Store, signer: Signer) -> None:
    """Control of an unknown id or a terminated object raises."""
    with pytest.raises(ObjectNotFoundError):
        store.control("ghost", NOW, paused=True)
    chain = _created(store, signer, "obj-1")
    claim = _claim_one(store, "obj-1")
    assert store.apply([chain.append(claim.epoch, chain.extend(), status="cancelled",
                                     phase="termination", ready_at=None, release=True)],
                       NOW) == [None]
    with pytest.raises(ObjectTerminatedError):
        store.control("obj-1", NOW, cancel=True)


# -- timers ---------------------------------------------------------------------------------


def test_next_ready_at(store: Store, signer: Signer) -> None:
    """``next_ready_at`` is the earliest ready time of an unpaused object, None if none."""
    assert store.next_ready_at() is None
    _created(store, signer, "late", ready_at=NOW + 20)
    _created(store, signer, "soon", ready_at=NOW + 10)
    _created(store, signer, "held", ready_at=NOW + 1)
    store.control("held", NOW, paused=True)
    waiting = _created(store, signer, "waiting", ready_at=NOW)
    _dormant(store, waiting, _claim_one(store, "waiting"), ready_at=None, waiting_event="e")
    assert store.next_ready_at() == NOW + 10
