"""The in-memory store beyond the contract suite: its URL, its lifetime, its wake-ups,
and many threads at once.

The contract suite (``test_contract``, ``test_group_commit``, ``test_step_appends``)
runs on it like on every backend; these are what only it has.
"""

from __future__ import annotations

import threading

import pytest

from perdure.core.chain import Signer
from perdure.errors import ConfigurationError, LeaseLostError, StoreError
from perdure.stores import open_store
from perdure.stores.base import Signal
from perdure.stores.memory import MemoryStore
from tests.stores.builders import NOW, Chain, make_signer


def _store_with(signer: Signer, *object_ids: str) -> tuple[MemoryStore, dict[str, Chain]]:
    store = MemoryStore()
    chains = {oid: Chain(oid, signer) for oid in object_ids}
    for chain in chains.values():
        assert store.create(chain.new_object(ready_at=NOW), NOW)
    return store, chains


def test_memory_urls_open_a_new_empty_store_each_time() -> None:
    """``memory:`` and ``memory://NAME`` open an in-memory store that shows its URL; each
    open is a store of its own (a name does not share anything)."""
    signer = make_signer()
    first = open_store("memory://tests")
    again = open_store("memory://tests")
    try:
        assert isinstance(first, MemoryStore) and first.url == "memory://tests"
        assert first.create(Chain("x", signer).new_object(), NOW)
        assert again.get("x") is None
        assert open_store("memory:").url == "memory:"
    finally:
        first.close()
        again.close()


@pytest.mark.parametrize("url", ["memory:///file.db", "memory://name/path", "memory:?keep=1",
                                 "memory:name"])
def test_a_memory_url_with_a_path_or_options_is_refused(url: str) -> None:
    """Anything beyond a name is a configuration error that says what to write."""
    with pytest.raises(ConfigurationError, match="use memory: or memory://NAME"):
        open_store(url)


def test_a_closed_memory_store_refuses_to_be_used() -> None:
    """Closing drops everything; a call afterwards is a ``StoreError``, not an empty
    answer."""
    store, _ = _store_with(make_signer(), "x")
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.get("x")
    with pytest.raises(StoreError, match="closed"):
        store.apply([], NOW)


def test_subscribers_hear_of_objects_that_may_have_become_runnable() -> None:
    """Wake-ups go out for a new object, an event, a cancel, a signal and a release
    that is runnable now, once the store's lock is let go (an object woken twice by one
    commit is told once); ``stop`` ends them, and a subscriber that fails does not undo
    the write."""
    signer = make_signer()
    store, chains = _store_with(signer, "a", "b")
    heard: list[str] = []
    stop = store.subscribe(heard.append)

    def fail(object_id: str) -> None:
        raise RuntimeError(f"a subscriber that fails on {object_id}")

    failing = store.subscribe(fail)
    c = Chain("c", signer)
    assert store.create(c.new_object(ready_at=NOW), NOW)
    assert heard == ["c"]
    epochs = {claim.object_id: claim.epoch for claim in store.claim("w", NOW, NOW + 30, 3)}
    a, b = chains["a"], chains["b"]
    assert store.apply([
        a.append(epochs["a"], a.extend(1), signal=Signal("b", "ping", b"1", None)),
        b.append(epochs["b"], b.extend(1), status="dormant", phase="dormancy", ready_at=NOW,
                 release=True),
    ], NOW) == [None, None]
    assert heard[1:] == ["b"]  # the signal to b and b let go runnable now: told once
    store.control("c", NOW, cancel=True)
    assert heard[-1] == "c"
    failing()
    stop()
    assert store.send("b", "more", b"2", None, NOW)
    assert heard[-1] == "c"


def test_many_threads_claim_and_append_without_losing_or_doubling() -> None:
    """Threads claiming and appending at once (a worker's loop, read and write threads)
    see one store: every object claimed by one of them, every append at the head
    written once, every stale one refused."""
    signer = make_signer()
    store, chains = _store_with(signer, *(f"o{i:02d}" for i in range(40)))
    errors: list[BaseException] = []
    refused: list[BaseException] = []
    claimed: dict[str, list[str]] = {}
    barrier = threading.Barrier(4)

    def node(name: str) -> None:
        try:
            barrier.wait()
            for claim in store.claim(name, NOW, NOW + 30, 40):
                claimed.setdefault(name, []).append(claim.object_id)
                chain = chains[claim.object_id]
                for _ in range(5):
                    assert store.apply([chain.append(claim.epoch, chain.extend(1))],
                                       NOW) == [None]
                stale = store.apply([chain.append(claim.epoch - 1, chain.peek(1))], NOW)
                refused.extend(result for result in stale if result is not None)
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=node, args=(f"n{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors, errors
    ids = [oid for owned in claimed.values() for oid in owned]
    assert sorted(ids) == sorted(chains)
    assert len(refused) == 40 and all(isinstance(r, LeaseLostError) for r in refused)
    for oid, chain in chains.items():
        assert store.records(oid) == chain.records
        assert store.chain(oid) == chain.records


def test_due_times_in_the_heap_match_a_scan_of_every_row() -> None:
    """``next_ready_at`` and the claim read due times from a heap kept beside the rows:
    through a random run of claims, renewals, expiries, pauses, cancels, sends and
    releases (seeded), both answer what a scan of every row answers."""
    import random

    rng = random.Random(26)
    signer = make_signer()
    ids = [f"obj-{i:02d}" for i in range(30)]
    store, chains = _store_with(signer, *ids)
    held: dict[str, int] = {}  # object id -> epoch of a lease taken here
    now = NOW

    def scanned_next() -> float | None:
        assert store._tables is not None
        due = [row.due() for row in store._tables.objects.values()]
        return min((d for d in due if d is not None), default=None)

    def scanned_claimable(at: float) -> list[str]:
        assert store._tables is not None
        rows = [row for row in store._tables.objects.values()
                if (due := row.due()) is not None and due <= at]
        return [row.object_id for row in sorted(rows, key=lambda r: (r.ready_at, r.order))]

    for _ in range(600):
        now += rng.choice([0.0, 0.5, 3.0])
        oid = rng.choice(ids)
        action = rng.randrange(7)
        if action == 0:
            limit = rng.randint(1, 4)
            expected = scanned_claimable(now)[:limit]
            claims = store.claim("w1", now, now + rng.choice([1.0, 10.0]), limit)
            assert [c.object_id for c in claims] == expected
            held.update({c.object_id: c.epoch for c in claims})
        elif action == 1 and oid in held:
            store.renew(oid, held[oid], now + rng.choice([1.0, 10.0]))
        elif action == 2 and oid in held:
            store.expire_lease(oid, "w1", held[oid], now)
        elif action == 3 and oid in held:
            chain = chains[oid]
            ready_at = rng.choice([None, now, now + 5.0])
            store.apply([chain.append(held.pop(oid), chain.extend(), status="dormant",
                                      phase="dormancy", ready_at=ready_at,
                                      waiting_event="e" if ready_at is None else None,
                                      release=True)], now)
        elif action == 4:
            store.send(oid, "e", b"{}", None, now)
        elif action == 5:
            store.control(oid, now, paused=rng.random() < 0.5)
        elif action == 6 and rng.random() < 0.2:
            store.control(oid, now, cancel=True)
        assert store.next_ready_at() == scanned_next()
