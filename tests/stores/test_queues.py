"""The store contract of queues (``Queues`` role, and ``Leases.claim`` respecting them):
every backend counts a queue's slots (objects under a live lease) inside the claim and
takes only what the queue's limits let, however many nodes claim at once.

Timers use the logical ``NOW``; what depends on a lease running out or on the limiter's
period uses real time (PostgreSQL decides leases by its own clock).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from perdure.core.chain import Signer
from perdure.core.flow import Queue
from perdure.stores import Claim, Store
from perdure.stores.base import NewObject
from tests.stores.builders import NOW, Chain

LEASE = 30.0


def _queued(store: Store, signer: Signer, object_id: str, queue: str, *,
            key: str | None = None, priority: int = 0, dedupe_key: str | None = None,
            ready_at: float = NOW, now: float = NOW) -> tuple[Chain, bool]:
    chain = Chain(object_id, signer)
    plain = chain.new_object(ready_at=ready_at)
    new = NewObject(plain.object_id, plain.agent, plain.agent_version, plain.first,
                    plain.ready_at, queue=queue, queue_key=key, priority=priority,
                    dedupe_key=dedupe_key)
    return chain, store.create(new, now)


def _claim(store: Store, owner: str, limit: int = 100, now: float = NOW) -> list[str]:
    return sorted(c.object_id for c in store.claim(owner, now, now + LEASE, limit))


def _end(store: Store, chain: Chain, claim: Claim, *, now: float = NOW) -> None:
    """Append a terminal record and let the object go, as a node ending it does."""
    op = chain.append(claim.epoch, chain.extend(), status="completed", phase="termination",
                      ready_at=None, release=True)
    assert store.apply([op], now) == [None]


def _sleep(store: Store, chain: Chain, claim: Claim, ready_at: float | None,
           now: float = NOW) -> None:
    """Let the object go dormant until ``ready_at``, as a node does for ``run.sleep``."""
    op = chain.append(claim.epoch, chain.extend(), status="dormant", phase="dormancy",
                      ready_at=ready_at, release=True)
    assert store.apply([op], now) == [None]


def test_a_declaration_is_kept_and_a_change_reports_what_it_replaced(store: Store) -> None:
    """``declare_queue`` keeps the limits; declaring the same again reports nothing, other
    limits report the ones replaced; ``queues`` lists them by name."""
    emails = Queue("emails", concurrency=5, per_key=1, worker_concurrency=2,
                   limiter={"limit": 50, "period": 30}, priority=True)
    assert store.declare_queue(emails, NOW) is None
    assert store.declare_queue(emails, NOW + 1) is None
    assert store.declare_queue(Queue("a-first"), NOW) is None
    assert store.queues() == [Queue("a-first"), emails]
    smaller = Queue("emails", concurrency=2)
    assert store.declare_queue(smaller, NOW + 2) == emails
    assert store.queues() == [Queue("a-first"), smaller]
    assert store.queues()[1].rate_limit is None


def test_concurrency_caps_the_slots_over_every_claimer(store: Store, signer: Signer) -> None:
    """A queue with ``concurrency=2`` lets two of its objects be held at once, whoever
    claims; a slot frees when its object ends, and the next one is claimed then."""
    store.declare_queue(Queue("q", concurrency=2), NOW)
    chains = {f"o{k}": _queued(store, signer, f"o{k}", "q")[0] for k in range(5)}
    first = store.claim("w1", NOW, NOW + LEASE, 10)
    assert len(first) == 2
    assert _claim(store, "w2") == []
    _end(store, chains[first[0].object_id], first[0])
    again = _claim(store, "w2")
    assert len(again) == 1 and again[0] not in {c.object_id for c in first}
    assert _claim(store, "w3") == []


def test_a_dormant_object_holds_no_slot(store: Store, signer: Signer) -> None:
    """An object let go to sleep frees its slot; when it is due again it waits for a slot
    like any other."""
    store.declare_queue(Queue("q", concurrency=1), NOW)
    sleeper = _queued(store, signer, "a", "q")[0]
    _queued(store, signer, "b", "q", ready_at=NOW + 1)
    claim = store.claim("w1", NOW, NOW + LEASE, 10)
    assert [c.object_id for c in claim] == ["a"]
    _sleep(store, sleeper, claim[0], ready_at=NOW + 5)
    assert _claim(store, "w1", now=NOW + 2) == ["b"]
    assert _claim(store, "w1", now=NOW + 6) == []  # "a" is due, but "b" holds the slot


def test_objects_without_a_queue_are_claimed_beside_a_full_queue(store: Store,
                                                                 signer: Signer) -> None:
    """A full queue holds back only its own objects."""
    store.declare_queue(Queue("q", concurrency=1), NOW)
    for k in range(3):
        _queued(store, signer, f"q{k}", "q")
    for k in range(2):
        assert store.create(Chain(f"plain{k}", signer).new_object(), NOW)
    got = _claim(store, "w1")
    assert [oid for oid in got if oid.startswith("plain")] == ["plain0", "plain1"]
    assert len([oid for oid in got if oid.startswith("q")]) == 1


def test_an_undeclared_queue_is_not_claimed(store: Store, signer: Signer) -> None:
    """An object of a queue no one declared waits until it is declared (its limits are
    unknown until then)."""
    _queued(store, signer, "o", "nowhere")
    assert _claim(store, "w1") == []
    store.declare_queue(Queue("nowhere"), NOW)
    assert _claim(store, "w1") == ["o"]


def test_per_key_caps_each_key(store: Store, signer: Signer) -> None:
    """``per_key=1``: one held object per key at a time; objects without a key count only
    against the other limits. A key at its cap does not hold back the keys behind it."""
    store.declare_queue(Queue("q", per_key=1), NOW)
    for k in range(4):
        _queued(store, signer, f"a{k}", "q", key="a", ready_at=NOW - 10 + k)
    _queued(store, signer, "b0", "q", key="b")
    _queued(store, signer, "b1", "q", key="b")
    _queued(store, signer, "none0", "q")
    _queued(store, signer, "none1", "q")
    assert _claim(store, "w1") == ["a0", "b0", "none0", "none1"]
    assert _claim(store, "w2") == []


def test_worker_concurrency_caps_each_worker(store: Store, signer: Signer) -> None:
    """``worker_concurrency=2``: each claiming worker holds at most two of the queue's
    objects; another worker still gets its own two."""
    store.declare_queue(Queue("q", worker_concurrency=2), NOW)
    for k in range(5):
        _queued(store, signer, f"o{k}", "q", ready_at=NOW - 10 + k)
    assert _claim(store, "w1") == ["o0", "o1"]
    assert _claim(store, "w1") == []
    assert _claim(store, "w2") == ["o2", "o3"]
    assert _claim(store, "w3", limit=1) == ["o4"]


def test_priority_lower_first_then_oldest(store: Store, signer: Signer) -> None:
    """Objects are claimed by priority (lower first; none given counts as 0), then by
    ready time, whatever order they were started in."""
    store.declare_queue(Queue("q", concurrency=1, priority=True), NOW)
    chains = {}
    for name, priority, ready in [("p5", 5, NOW - 9), ("p1-late", 1, NOW - 1),
                                  ("p1-early", 1, NOW - 2), ("p0", 0, NOW), ("p3", 3, NOW - 8)]:
        chains[name] = _queued(store, signer, name, "q", priority=priority, ready_at=ready)[0]
    order = []
    for _ in range(5):
        claims = store.claim("w1", NOW, NOW + LEASE, 10)
        assert len(claims) == 1
        order.append(claims[0].object_id)
        _end(store, chains[claims[0].object_id], claims[0])
    assert order == ["p0", "p1-early", "p1-late", "p3", "p5"]


def test_the_limiter_caps_starts_per_period(store: Store, signer: Signer) -> None:
    """``limiter={"limit": 2, "period": P}``: at most two objects start within any P
    seconds; an object that already started resumes without waiting for the limiter;
    once the period has passed, the next ones start."""
    period = 1.5
    store.declare_queue(Queue("q", limiter={"limit": 2, "period": period}), NOW)
    start = time.time()
    chains = {f"o{k}": _queued(store, signer, f"o{k}", "q", ready_at=start - 10 + k,
                               now=start)[0] for k in range(4)}
    first = store.claim("w1", start, start + LEASE, 10)
    assert sorted(c.object_id for c in first) == ["o0", "o1"]
    now = time.time()
    assert _claim(store, "w1", now=now) == []
    _sleep(store, chains["o0"], next(c for c in first if c.object_id == "o0"), ready_at=now,
           now=now)
    assert _claim(store, "w1", now=time.time()) == ["o0"]  # resumes: it started already
    time.sleep(max(0.0, start + period + 0.2 - time.time()))
    assert _claim(store, "w1", now=time.time()) == ["o2", "o3"]


def test_a_lapsed_lease_frees_its_slot(store: Store, signer: Signer) -> None:
    """A worker that dies holds its slot only until its lease lapses: no slot leaks."""
    store.declare_queue(Queue("q", concurrency=1), NOW)
    start = time.time()
    _queued(store, signer, "a", "q", ready_at=start - 2, now=start)
    _queued(store, signer, "b", "q", ready_at=start - 1, now=start)
    held = store.claim("dead", start, start + 2.0, 10)
    assert [c.object_id for c in held] == ["a"]
    assert _claim(store, "w2", now=time.time()) == []
    time.sleep(max(0.0, start + 2.0 - time.time()) + 0.1)
    assert _claim(store, "w2", now=time.time()) == ["a"]


def test_a_cancel_is_claimed_past_the_limits(store: Store, signer: Signer) -> None:
    """An object asked to cancel is taken whatever the queue holds: it only ends."""
    store.declare_queue(Queue("q", concurrency=1), NOW)
    _queued(store, signer, "a", "q")
    _queued(store, signer, "b", "q", ready_at=NOW + 1)
    assert _claim(store, "w1") == ["a"]
    store.control("b", NOW, cancel=True)
    assert _claim(store, "w2") == ["b"]


def test_a_dedupe_key_is_held_while_its_object_lives(store: Store, signer: Signer) -> None:
    """One live object per (queue, dedupe key): a second create is refused and
    ``queue_holder`` names the first; once it ended, the key is free again. The same key
    on another queue is another key."""
    store.declare_queue(Queue("q"), NOW)
    first, made = _queued(store, signer, "first", "q", dedupe_key="user-42")
    assert made
    assert not _queued(store, signer, "second", "q", dedupe_key="user-42")[1]
    assert store.get("second") is None
    assert store.queue_holder("q", "user-42") == "first"
    assert _queued(store, signer, "elsewhere", "other", dedupe_key="user-42")[1]
    claim = store.claim("w1", NOW, NOW + LEASE, 1)
    assert [c.object_id for c in claim] == ["first"]
    _end(store, first, claim[0])
    assert store.queue_holder("q", "user-42") is None
    assert _queued(store, signer, "third", "q", dedupe_key="user-42")[1]
    assert store.queue_holder("q", "user-42") == "third"


def test_queue_stats_count_held_ready_and_waiting(store: Store, signer: Signer) -> None:
    """``queue_stats``: per declared queue, its slots held, its objects ready and not held,
    and its dormant ones; ended objects count nowhere."""
    store.declare_queue(Queue("q", concurrency=2), NOW)
    store.declare_queue(Queue("idle"), NOW)
    chains = {f"o{k}": _queued(store, signer, f"o{k}", "q", ready_at=NOW - 10 + k)[0]
              for k in range(5)}
    claims = store.claim("w1", NOW, NOW + LEASE, 10)
    assert sorted(c.object_id for c in claims) == ["o0", "o1"]
    _sleep(store, chains["o0"], claims[0], ready_at=None)  # waits for an event
    claims = store.claim("w1", NOW, NOW + LEASE, 10)
    assert [c.object_id for c in claims] == ["o2"]
    _end(store, chains["o2"], claims[0])
    stats = {s.queue.name: s for s in store.queue_stats(NOW)}
    assert stats["idle"].queue == Queue("idle")
    assert (stats["idle"].held, stats["idle"].ready, stats["idle"].waiting) == (0, 0, 0)
    assert stats["q"].queue == Queue("q", concurrency=2)
    assert (stats["q"].held, stats["q"].ready, stats["q"].waiting) == (1, 2, 1)


def test_a_debounced_start_is_taken_only_before_the_first_claim(store: Store,
                                                                signer: Signer) -> None:
    """``debounce_start``: before any claim, the event is queued and the first claim put
    off (a claim at the old ready time takes nothing); once claimed, it is refused and
    the key goes free (a new object may take it); a wrong key or an unknown object is
    refused, nothing written."""
    store.declare_queue(Queue("q"), NOW)
    _queued(store, signer, "first", "q", dedupe_key="~k", ready_at=NOW + 1)
    assert store.debounce_start("first", "~k", "perdure:refine", b"{}", b"", NOW + 5,
                                NOW)
    assert [e.name for e in store.pending_events("first")] == ["perdure:refine"]
    assert _claim(store, "w1", now=NOW + 2) == []
    assert not store.debounce_start("first", "other", "perdure:refine", b"{}", b"",
                                    NOW + 9, NOW)
    assert not store.debounce_start("nobody", "~k", "perdure:refine", b"{}", b"", NOW + 9,
                                    NOW)
    assert len(store.pending_events("first")) == 1
    assert _claim(store, "w1", now=NOW + 5) == ["first"]
    assert store.queue_holder("q", "~k") == "first"
    assert not store.debounce_start("first", "~k", "perdure:refine", b"{}", b"", NOW + 9,
                                    NOW + 5)
    assert len(store.pending_events("first")) == 1
    assert store.queue_holder("q", "~k") is None
    assert _queued(store, signer, "second", "q", dedupe_key="~k")[1]


def test_queue_key_holders_rank_the_keys_holding_slots(store: Store, signer: Signer) -> None:
    """``queue_key_holders``: per key, the slots its objects hold now, most first, objects
    without a key under ``None``; objects not held and other queues count nowhere."""
    store.declare_queue(Queue("q"), NOW)
    store.declare_queue(Queue("other"), NOW)
    for k, key in enumerate(["b", "b", "a", None, "c", "c", "c"]):
        _queued(store, signer, f"o{k}", "q", key=key)
    _queued(store, signer, "later", "q", key="z", ready_at=NOW + 1000)
    _queued(store, signer, "elsewhere", "other", key="a")
    assert len(_claim(store, "w1")) == 8
    assert store.queue_key_holders("q", NOW, 10) == [("c", 3), ("b", 2), (None, 1),
                                                     ("a", 1)]
    assert store.queue_key_holders("q", NOW, 2) == [("c", 3), ("b", 2)]
    assert store.queue_key_holders("other", NOW, 10) == [("a", 1)]
    assert store.queue_key_holders("none", NOW, 10) == []


@pytest.mark.parametrize("limits", [{"concurrency": 3}, {"per_key": 1},
                                    {"worker_concurrency": 2}])
def test_concurrent_claimers_never_exceed_the_limits(
        store: Store, signer: Signer, open_again: Callable[[], Store],
        limits: dict[str, Any]) -> None:
    """Six claimers, each its own store connection (as six nodes), claim and end objects
    of one queue at once; after every claim the slots held stay within the limits."""
    store.declare_queue(Queue("q", **limits), NOW)
    count = 36
    chains = {f"o{k:02d}": _queued(store, signer, f"o{k:02d}", "q", key=f"k{k % 3}")[0]
              for k in range(count)}
    stores = [open_again() for _ in range(6)]
    lock = threading.Lock()
    held: dict[str, tuple[str, str | None]] = {}  # object -> (owner, key)
    worst: list[str] = []
    done: set[str] = set()

    def check() -> None:
        keys: dict[str | None, int] = {}
        owners: dict[str, int] = {}
        for owner, key in held.values():
            keys[key] = keys.get(key, 0) + 1
            owners[owner] = owners.get(owner, 0) + 1
        if "concurrency" in limits and len(held) > limits["concurrency"]:
            worst.append(f"{len(held)} held")
        if "per_key" in limits and max(keys.values(), default=0) > limits["per_key"]:
            worst.append(f"per key {keys}")
        if ("worker_concurrency" in limits
                and max(owners.values(), default=0) > limits["worker_concurrency"]):
            worst.append(f"per worker {owners}")

    def node(index: int) -> None:
        mine = stores[index]
        owner = f"node-{index}/1"
        deadline = time.time() + 60
        while time.time() < deadline:
            with lock:
                if len(done) == count:
                    return
            claims = mine.claim(owner, NOW, NOW + LEASE, 3)
            with lock:
                for claim in claims:
                    held[claim.object_id] = (owner, f"k{int(claim.object_id[1:]) % 3}")
                check()
            for claim in claims:
                time.sleep(0.002)
                with lock:  # the slot is let go before the store hears of it: never late
                    del held[claim.object_id]
                    chain = chains[claim.object_id]
                _end(mine, chain, claim)
                with lock:
                    done.add(claim.object_id)
            if not claims:
                time.sleep(0.002)

    threads = [threading.Thread(target=node, args=(k,)) for k in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert worst == []
    assert len(done) == count
