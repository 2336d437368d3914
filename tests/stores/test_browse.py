"""The ``Browse`` role: what the dashboard reads, the same on every backend.

Objects are made with the creation times (``now``) each test chooses, so that pages,
bounds and ties are exact. Leases are taken at the logical time ``NOW`` and judged at
it (a backend deciding expiry by its own clock gives them a later expiry: still live).
"""

from __future__ import annotations

import dataclasses

import pytest

from perdure.core.chain import Signer
from perdure.core.records import Kind
from perdure.stores import Store
from perdure.stores._sql import load_queries
from perdure.stores.base import ObjectFilter, ObjectRow
from tests.stores.builders import NOW, Chain

LATER = NOW + 100_000.0
"""A ready time no claim at ``NOW`` reaches: objects made with it stay unclaimed."""


def _made(store: Store, signer: Signer, object_id: str, *, at: float = NOW,
          agent: str = "agent", version: str = "1", parent: str | None = None,
          labels: dict[str, str] | None = None, ready_at: float = LATER) -> Chain:
    body: dict[str, object] = {"intent": "test", "context": {"labels": labels or {}}}
    chain = Chain(object_id, signer, agent=agent, first_body=body)
    new = dataclasses.replace(chain.new_object(ready_at=ready_at, parent_id=parent),
                              agent_version=version)
    assert store.create(new, at) is True
    return chain


def _claimed(store: Store, signer: Signer, object_id: str, *, owner: str = "node-x/w1",
             at: float = NOW, **options: object) -> tuple[Chain, int]:
    """A new object a node holds now; its chain and epoch."""
    chain = _made(store, signer, object_id, at=at, ready_at=NOW, **options)  # type: ignore[arg-type]
    claims = store.claim(owner, NOW, NOW + 30.0, 100)
    assert [c.object_id for c in claims] == [object_id]
    return chain, claims[0].epoch


def _released(store: Store, signer: Signer, object_id: str, status: str, *,
              at: float = NOW, when: float = NOW, **options: object) -> Chain:
    """A new object a node ran and let go with ``status`` (at the time ``when``)."""
    chain, epoch = _claimed(store, signer, object_id, at=at)
    op = chain.append(epoch, chain.extend(), status=status, phase=options.pop("phase", "x"),  # type: ignore[arg-type]
                      ready_at=None, release=True, **options)
    assert store.apply([op], when) == [None]
    return chain


def _ids(rows: list[ObjectRow]) -> list[str]:
    return [row.object_id for row in rows]


def _found(store: Store, **where: object) -> set[str]:
    return set(_ids(store.browse(ObjectFilter(**where), limit=1000, now=NOW)))  # type: ignore[arg-type]


def _all_pages(store: Store, where: ObjectFilter, size: int) -> list[list[str]]:
    pages: list[list[str]] = []
    after = None
    while True:
        rows = store.browse(where, after=after, limit=size, now=NOW)
        assert len(rows) <= size
        if not rows:
            return pages
        pages.append(_ids(rows))
        after = (rows[-1].created_at, rows[-1].object_id)


def test_pages_run_newest_first_and_through_equal_times(store: Store, signer: Signer) -> None:
    """Newest first by creation time, ids ascending among equal times; paging after the
    key of a page's last row gives every object once, even where a page boundary falls
    among objects created at the same moment."""
    times = {"m-c": NOW, "m-a": NOW, "m-e": NOW, "m-b": NOW, "m-d": NOW,
             "new-1": NOW + 5, "old-2": NOW - 5, "old-1": NOW - 5, "oldest": NOW - 9}
    for oid, at in times.items():
        _made(store, signer, oid, at=at)
    expected = ["new-1", "m-a", "m-b", "m-c", "m-d", "m-e", "old-1", "old-2", "oldest"]
    assert _ids(store.browse(ObjectFilter(), limit=100, now=NOW)) == expected
    for size in (1, 2, 3, 4):
        pages = _all_pages(store, ObjectFilter(), size)
        assert [oid for page in pages for oid in page] == expected
        assert all(len(page) == size for page in pages[:-1])
    assert _all_pages(store, ObjectFilter(since=NOW), 2) == [["new-1", "m-a"],
                                                              ["m-b", "m-c"], ["m-d", "m-e"]]
    assert store.browse(ObjectFilter(), limit=0, now=NOW) == []


def test_each_filter(store: Store, signer: Signer) -> None:
    """Every filter alone: stored statuses (not parked or paused ones, unless ended), the
    derived parked, paused and running, phase, agent, version, parent, node, the
    creation-time bounds (inclusive) and the id prefix."""
    _made(store, signer, "idle", at=NOW - 50, agent="writer")
    _made(store, signer, "v2", at=NOW - 40, version="2")
    _made(store, signer, "child", at=NOW - 30, parent="idle", agent="writer")
    _claimed(store, signer, "running-x", at=NOW - 20, owner="node-x/w1")
    _claimed(store, signer, "running-xy", at=NOW - 19, owner="node-xy/w1")
    _released(store, signer, "parked", "parked", at=NOW - 10, parked=True, note="stuck")
    _released(store, signer, "done", "completed", at=NOW, phase="terminated")
    _released(store, signer, "dormant", "dormant", at=NOW + 10, phase="dormancy",
              waiting_event="approve")
    _made(store, signer, "paused", at=NOW + 20)
    store.control("paused", NOW, paused=True)
    everything = {"idle", "v2", "child", "running-x", "running-xy", "parked", "done",
                  "dormant", "paused"}
    assert _found(store) == everything
    assert _found(store, status="ready") == {"idle", "v2", "child"}  # not "paused"
    assert _found(store, status="paused") == {"paused"}
    assert _found(store, status="parked") == {"parked"}
    assert _found(store, status="running") == {"running-x", "running-xy"}
    assert _found(store, status="completed") == {"done"}
    assert _found(store, status="dormant") == {"dormant"}
    assert _found(store, status="failed") == set()
    assert _found(store, phase="dormancy") == {"dormant"}
    assert _found(store, phase="terminated") == {"done"}
    assert _found(store, agent="writer") == {"idle", "child"}
    assert _found(store, agent="nobody") == set()
    assert _found(store, version="2") == {"v2"}
    assert _found(store, parent="idle") == {"child"}
    assert _found(store, parent="child") == set()
    assert _found(store, node="node-x") == {"running-x"}  # the whole node name
    assert _found(store, node="node-xy") == {"running-xy"}
    assert _found(store, node="node") == set()
    assert _found(store, since=NOW) == {"done", "dormant", "paused"}
    assert _found(store, until=NOW) == everything - {"dormant", "paused"}
    assert _found(store, since=NOW - 20, until=NOW - 10) == {"running-x", "running-xy",
                                                             "parked"}
    assert _found(store, prefix="running-x") == {"running-x", "running-xy"}
    assert _found(store, prefix="running-xy") == {"running-xy"}
    assert _found(store, prefix="Running") == set()  # case as given
    assert _found(store, prefix="") == everything
    # A lease that ran out is not running, and its node no longer holds it.
    assert _found(store, status="running", node="node-x") == {"running-x"}
    later = max(r.lease_expires or 0 for r in store.browse(ObjectFilter(), now=NOW))
    assert store.browse(ObjectFilter(status="running"), now=later + 1) == []
    assert store.browse(ObjectFilter(node="node-x"), now=later + 1) == []


def test_filters_combine_and_page(store: Store, signer: Signer) -> None:
    """Filters together narrow to what matches them all, whichever leads the query,
    and a filtered list pages by key like the whole one."""
    for n in range(6):
        _made(store, signer, f"w-{n}", at=NOW + n // 2, agent="writer", parent="root",
              labels={"team": "red" if n % 2 else "blue"})
        _made(store, signer, f"r-{n}", at=NOW + n // 2, agent="reviewer",
              labels={"team": "red"})
    red_writers = ["w-5", "w-3", "w-1"]
    for where in (ObjectFilter(agent="writer", label=("team", "red")),
                  ObjectFilter(parent="root", label=("team", "red"), status="ready"),
                  ObjectFilter(prefix="w-", label=("team", "red"), agent="writer"),
                  ObjectFilter(status="ready", agent="writer", label=("team", "red"),
                               since=NOW, version="1", phase="instantiated")):
        assert [oid for page in _all_pages(store, where, 1) for oid in page] == red_writers
    assert _found(store, agent="writer", prefix="r-") == set()
    assert _found(store, parent="root", agent="reviewer") == set()
    assert _found(store, status="ready", until=NOW) == {"w-0", "w-1", "r-0", "r-1"}


def test_label_filter(store: Store, signer: Signer) -> None:
    """A label matches the objects started with that key and value, and no other: not
    another value, not a label-less object, and a key's dots and quotes are its own."""
    _made(store, signer, "red", labels={"team": "red", "env": "prod"})
    _made(store, signer, "blue", labels={"team": "blue"})
    _made(store, signer, "bare")
    _made(store, signer, "dotted", labels={"a.b": "x=y", 'q"k': "v"})
    _made(store, signer, "nested", labels={"a": "b"})
    assert _found(store, label=("team", "red")) == {"red"}
    assert _found(store, label=("team", "blue")) == {"blue"}
    assert _found(store, label=("env", "prod")) == {"red"}
    assert _found(store, label=("team", "green")) == set()
    assert _found(store, label=("a.b", "x=y")) == {"dotted"}
    assert _found(store, label=('q"k', "v")) == {"dotted"}
    assert _found(store, label=("a", "b")) == {"nested"}
    assert _found(store, label=("team", "")) == set()


@pytest.mark.parametrize(("prefix", "expected"), [
    ("p%", {"p%1", "p%%"}),
    ("p_", {"p_1"}),
    ("p%%", {"p%%"}),
    ("p\\", {"p\\1"}),
    ("p", {"p%1", "p%%", "p_1", "pX1", "p\\1", "pé"}),
    ("pé", {"pé"}),
    ("%", set()),
    ("_", set()),
])
def test_prefix_is_matched_as_written(store: Store, signer: Signer, prefix: str,
                                      expected: set[str]) -> None:
    """The id prefix is compared character for character: ``%``, ``_`` and ``\\`` in it
    match only themselves, and letters only in their own case."""
    for oid in ("p%1", "p%%", "p_1", "pX1", "p\\1", "P%1", "pé", "q_1"):
        _made(store, signer, oid)
    assert _found(store, prefix=prefix) == expected


def test_records_of_kinds(store: Store, signer: Signer) -> None:
    """An object's records of the given kinds, oldest first, at most ``limit``."""
    chain, epoch = _claimed(store, signer, "obj")
    records = [*chain.extend(2), *chain.extend(1, Kind.INTENT_REFINED), *chain.extend(1),
               *chain.extend(1, Kind.INTENT_REFINED)]
    assert store.apply([chain.append(epoch, records)], NOW) == [None]
    kinds = [Kind.INSTANTIATED.value, Kind.INTENT_REFINED.value]
    got = store.records_of_kinds("obj", kinds, 10)
    assert [(r.seq, r.kind) for r in got] == [(1, "instantiated"), (4, "intent_refined"),
                                              (6, "intent_refined")]
    assert got == [r for r in chain.records if r.kind in kinds]
    assert [r.seq for r in store.records_of_kinds("obj", kinds, 2)] == [1, 4]
    assert store.records_of_kinds("obj", ["woke"], 10) == []
    assert store.records_of_kinds("nobody", kinds, 10) == []


def test_status_counts(store: Store, signer: Signer) -> None:
    """How many objects hold each stored status; none held, none listed."""
    assert store.status_counts() == {}
    _made(store, signer, "a")
    _made(store, signer, "b")
    _released(store, signer, "c", "completed")
    _claimed(store, signer, "d")
    assert store.status_counts() == {"ready": 2, "completed": 1, "running": 1}


def test_object_counts(store: Store, signer: Signer) -> None:
    """Objects per agent and status in one grouped read; those waiting for a decision on
    a tool call counted beside; none held, none listed."""
    assert store.object_counts() == []
    _made(store, signer, "a1")
    _made(store, signer, "a2")
    _made(store, signer, "b1", agent="other")
    _released(store, signer, "c", "completed")
    _released(store, signer, "w1", "dormant", waiting_event="perdure:approval")
    _released(store, signer, "w2", "dormant", waiting_event="answer")
    _released(store, signer, "p", "dormant", parked=True, note="stuck")
    _made(store, signer, "z")
    store.control("z", NOW, paused=True)
    got = {(c.agent, c.status): (c.count, c.approvals) for c in store.object_counts()}
    assert got == {("agent", "ready"): (2, 0), ("other", "ready"): (1, 0),
                   ("agent", "completed"): (1, 0), ("agent", "dormant"): (2, 1),
                   ("agent", "parked"): (1, 0), ("agent", "paused"): (1, 0)}


def test_awaiting_outside(store: Store, signer: Signer) -> None:
    """Dormant, unheld objects waiting for an event from outside, latest updated first;
    not those waiting for perdure's own events, for a timer, or held by a node."""
    _released(store, signer, "asks-1", "dormant", waiting_event="approve", when=NOW + 1)
    _released(store, signer, "asks-2", "dormant", waiting_event="answer", when=NOW + 2)
    _released(store, signer, "asks-3", "dormant", waiting_event="answer", when=NOW + 3)
    _released(store, signer, "child", "dormant", waiting_event="perdure:child_done")
    _released(store, signer, "timer", "dormant")
    _released(store, signer, "ended", "completed")
    _made(store, signer, "new")
    assert _ids(store.awaiting_outside(10)) == ["asks-3", "asks-2", "asks-1"]
    assert _ids(store.awaiting_outside(2)) == ["asks-3", "asks-2"]


def test_lease_holders(store: Store, signer: Signer) -> None:
    """Live leases by object id, with their owner; a lease that ran out is left out."""
    _claimed(store, signer, "b", owner="n1/w1")
    _claimed(store, signer, "a", owner="n2/w1")
    _, epoch = _claimed(store, signer, "c", owner="n1/w2")
    _made(store, signer, "idle")
    assert store.lease_holders(NOW, 100) == [("a", "n2/w1"), ("b", "n1/w1"), ("c", "n1/w2")]
    assert store.lease_holders(NOW, 1) == [("a", "n2/w1")]
    assert store.expire_lease("c", "n1/w2", epoch, NOW) is True
    ended = store.get("c")  # a backend may end it by its own clock: judged at that time
    assert ended is not None and ended.lease_expires is not None
    assert store.lease_holders(ended.lease_expires, 100) == [("a", "n2/w1"), ("b", "n1/w1")]


def test_hour_figures(store: Store, signer: Signer) -> None:
    """The last hour's raw figures: ended objects since a time, the ids updated most
    recently, records of some kinds and objects since a time, and events' send times."""
    _released(store, signer, "done-old", "completed", when=NOW - 100)
    _released(store, signer, "done", "completed", when=NOW + 1)
    _released(store, signer, "failed", "failed", when=NOW + 2)
    _released(store, signer, "cancelled", "cancelled", when=NOW + 3)
    _released(store, signer, "waits", "dormant", waiting_event="go", when=NOW + 4)
    assert sorted(store.ended_since(NOW)) == [("cancelled", NOW + 3), ("completed", NOW + 1),
                                              ("failed", NOW + 2)]
    assert store.ended_since(NOW + 10) == []
    assert store.updated_since(NOW, 10) == ["waits", "cancelled", "failed", "done"]
    assert store.updated_since(NOW, 2) == ["waits", "cancelled"]
    assert store.updated_since(NOW + 10, 10) == []

    chain, epoch = _claimed(store, signer, "busy")
    extra = [*chain.extend(1, Kind.MODEL_CALL), *chain.extend(1), *chain.extend(1, Kind.WOKE)]
    assert store.apply([chain.append(epoch, extra)], NOW) == [None]
    kinds = ["model_call", "woke", "instantiated"]
    got = store.bodies_since(["busy", "waits", "nobody"], kinds, 0)
    assert [(b.object_id, b.seq, b.kind) for b in got] == [
        ("busy", 1, "instantiated"), ("busy", 2, "model_call"), ("busy", 4, "woke"),
        ("waits", 1, "instantiated")]
    by_seq = {r.seq: r for r in chain.records}
    assert all(b.body == by_seq[b.seq].body_bytes and b.ts_us == by_seq[b.seq].ts_us
               for b in got if b.object_id == "busy")
    since = by_seq[2].ts_us
    assert [b.seq for b in store.bodies_since(["busy"], kinds, since)] == [2, 4]
    assert store.bodies_since(["busy"], ["dormant"], 0) == []
    assert store.bodies_since([], kinds, 0) == []

    assert store.send("waits", "go", b"{}", None, NOW + 7) is True
    assert store.send("busy", "other", b"{}", None, NOW + 8) is True
    sent = {e.name: e.event_id for e in [*store.pending_events("waits"),
                                        *store.pending_events("busy")]}
    assert store.sent_at([sent["go"], sent["other"], 987_654]) == {
        sent["go"]: NOW + 7, sent["other"]: NOW + 8}
    assert store.sent_at([]) == {}


def test_sqlite_browse_forms_are_one_query() -> None:
    """SQLite's ``browse_*`` forms are ``browse_objects`` led by one more predicate (an
    index's), and nothing else: a filter added to one must be added to all."""
    queries = load_queries("sqlite")
    whole = queries["browse_objects"]
    forms = {name: sql for name, sql in queries.items()
             if name.startswith("browse_") and name != "browse_objects"}
    assert sorted(forms) == ["browse_by_agent", "browse_by_prefix", "browse_by_status",
                             "browse_children"]
    head, _, rest = whole.partition("WHERE ")
    for name, sql in forms.items():
        assert sql.startswith(head + "WHERE "), name
        lead, _, tail = sql.removeprefix(head + "WHERE ").partition("\n  AND ")
        assert tail == rest, name
        assert lead and "created_at" not in lead, name
