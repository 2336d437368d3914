"""The store contract of alerts (``AlertRows`` role): firing and resolving are conditional
writes, so of many stores opened on one place (nodes) racing to fire or resolve the same
alert, exactly one wins each change. Times are logical (the caller's ``now``)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from perdure.stores import Store

NOW = 1_000_000.0


def test_fire_once_resolve_once_fire_again(store: Store) -> None:
    """A firing alert is not fired again; only a firing one resolves, and the resolving
    call gets the row as it fired; a resolved alert fires again, as new."""
    assert store.fire_alert("parked", "obj-1", "parked: bad", "node-a", NOW)
    assert not store.fire_alert("parked", "obj-1", "parked: bad", "node-b", NOW + 1)
    (row,) = store.alerts()
    assert (row.state, row.node_id, row.fired_at, row.summary) == (
        "firing", "node-a", NOW, "parked: bad")
    resolved = store.resolve_alert("parked", "obj-1", NOW + 5)
    assert resolved is not None and resolved.fired_at == NOW and resolved.resolved_at == NOW + 5
    assert store.resolve_alert("parked", "obj-1", NOW + 6) is None
    assert store.resolve_alert("parked", "never", NOW + 6) is None
    assert [r.state for r in store.alerts()] == ["resolved"]
    assert store.fire_alert("parked", "obj-1", "parked again", "node-b", NOW + 10)
    (row,) = store.alerts(state="firing")
    assert (row.node_id, row.fired_at, row.resolved_at) == ("node-b", NOW + 10, None)


def test_listing_filters_and_orders(store: Store) -> None:
    """Latest changed first; by state and by the start of the rule's name; limited."""
    store.fire_alert("workers", "nodes", "1 live", "n", NOW)
    store.fire_alert("notify.question", "o:1", "asks", "n", NOW + 1)
    store.fire_alert("parked", "o", "parked", "n", NOW + 2)
    store.resolve_alert("workers", "nodes", NOW + 3)
    assert [r.rule for r in store.alerts()] == ["workers", "parked", "notify.question"]
    assert [r.rule for r in store.alerts(state="firing")] == ["parked", "notify.question"]
    assert [r.rule for r in store.alerts(rule_prefix="notify.")] == ["notify.question"]
    assert len(store.alerts(limit=1)) == 1


def test_racing_nodes_fire_and_resolve_once(store: Store,
                                            open_again: Callable[[], Store]) -> None:
    """Eight stores on one place fire, then resolve, the same alert at once, over and
    over: each change is won by exactly one of them."""
    stores = [open_again() for _ in range(8)]
    for round_ in range(5):
        for verb in ("fire", "resolve"):
            wins: list[bool] = []
            gate = threading.Barrier(len(stores))

            def race(one: Store, verb: str = verb, at: float = NOW + round_,
                     gate: threading.Barrier = gate, wins: list[bool] = wins) -> None:
                gate.wait()
                if verb == "fire":
                    wins.append(one.fire_alert("rate", "all", "failing", "n", at))
                else:
                    wins.append(one.resolve_alert("rate", "all", at) is not None)

            threads = [threading.Thread(target=race, args=(one,)) for one in stores]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert sorted(wins) == [False] * 7 + [True]
