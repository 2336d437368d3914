"""Group commit: many appends in one ``Store.apply`` or one writer's commit, on every backend.

A node's committer hands a store every append submitted while the previous commit
ran, for any number of objects, in submission order. Whatever the backend does to
make that cheap (PostgreSQL sends one statement for the whole batch), each append is
still judged on its own: one refused by its fence writes nothing and the others go
through; two appends of one object chain in order; appends that consume events or
signal another object mix with plain ones; every field of an append lands exactly.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Sequence

import pytest

from perdure.core.chain import CommitSeal, Signer, seal_commit, seal_ref
from perdure.errors import CancelRequestedError, LeaseLostError
from perdure.stores import Store
from perdure.stores._rows import record_params
from perdure.stores.base import Append, Outcomes, Route, Signal
from tests.stores.builders import NOW, Chain

LEASE = NOW + 30.0


def _claimed(store: Store, signer: Signer, *object_ids: str) -> tuple[dict[str, Chain],
                                                                         dict[str, int]]:
    """Create ``object_ids`` ready at ``NOW`` and claim them all: chains and epochs."""
    chains = {oid: Chain(oid, signer) for oid in object_ids}
    for chain in chains.values():
        assert store.create(chain.new_object(ready_at=NOW), NOW)
    epochs = {c.object_id: c.epoch for c in store.claim("w1", NOW, LEASE, len(object_ids))}
    assert sorted(epochs) == sorted(object_ids)
    return chains, epochs


def test_a_batch_refuses_only_its_fenced_out_appends(store: Store, signer: Signer) -> None:
    """In one batch, a stale epoch and a seq gap are refused and write nothing, while
    appends of several records and a record-less row update around them go through."""
    chains, epochs = _claimed(store, signer, "multi", "stale", "gap", "bare", "single")
    multi, stale, gap, bare, single = (chains[k] for k in ("multi", "stale", "gap", "bare",
                                                             "single"))
    results = store.apply([
        multi.append(epochs["multi"], multi.extend(3)),
        stale.append(epochs["stale"] - 1, stale.peek(1)),
        gap.append(epochs["gap"], gap.peek(2)[1:]),
        bare.append(epochs["bare"], [], status="running", phase="evaluation"),
        single.append(epochs["single"], single.extend(1), phase="termination"),
    ], NOW + 1)

    assert results[0] is None and results[3] is None and results[4] is None
    assert isinstance(results[1], LeaseLostError) and isinstance(results[2], LeaseLostError)
    for chain in (multi, stale, gap, bare, single):
        assert store.records(chain.object_id) == chain.records
        row = store.get(chain.object_id)
        assert row is not None
        assert (row.head_seq, row.head_hash) == (chain.head.seq, chain.head.hash)
    for refused in ("stale", "gap"):
        row = store.get(refused)
        assert row is not None and (row.phase, row.updated_at) == ("evaluation", NOW)
    row = store.get("bare")
    assert row is not None and (row.phase, row.updated_at) == ("evaluation", NOW + 1)
    row = store.get("single")
    assert row is not None and (row.phase, row.lease_owner) == ("termination", "w1")


def test_two_appends_of_one_object_in_a_batch_chain_in_order(store: Store,
                                                             signer: Signer) -> None:
    """A second append of an object in the same batch (parallel branches) follows the
    first; when the first is refused, the second, which chains onto it, is too."""
    chains, epochs = _claimed(store, signer, "a", "b")
    a, b = chains["a"], chains["b"]
    results = store.apply([
        a.append(epochs["a"], a.extend(1)),
        b.append(epochs["b"], b.extend(2)),
        a.append(epochs["a"], a.extend(2), phase="termination"),
        b.append(epochs["b"], b.extend(1)),
    ], NOW)
    assert results == [None, None, None, None]
    assert store.records("a") == a.records and store.records("b") == b.records
    row = store.get("a")
    assert row is not None and (row.head_seq, row.phase) == (4, "termination")

    first, second = a.peek(2)
    refused = store.apply([a.append(epochs["a"] - 1, [first]),
                           a.append(epochs["a"], [second])], NOW)
    assert all(isinstance(r, LeaseLostError) for r in refused)
    assert store.records("a") == a.records


def test_a_batch_mixes_event_consumers_signals_and_plain_appends(store: Store,
                                                                 signer: Signer) -> None:
    """Appends that consume events or signal another object, in a batch among plain
    ones (one object twice): a second consumption of an event is refused alone; a
    signal reaches its target's inbox and wakes it; the plain appends go through."""
    chains, epochs = _claimed(store, signer, "plain-1", "eater", "plain-2", "late",
                              "child", "plain-3")
    parent = Chain("parent", signer)
    assert store.create(parent.new_object(ready_at=NOW), NOW)
    (parent_claim,) = store.claim("w1", NOW, LEASE, 1)
    assert store.apply([parent.append(parent_claim.epoch, parent.extend(), status="dormant",
                                       phase="dormancy", ready_at=None,
                                       waiting_event="child:done", release=True)],
                       NOW) == [None]
    store.send("eater", "go", b"1", None, NOW)
    (event,) = store.pending_events("eater")
    store.send("late", "go", b"2", None, NOW)
    (late_event,) = store.pending_events("late")
    assert store.apply([chains["late"].append(epochs["late"], chains["late"].extend(),
                                              consume_event_ids=(late_event.event_id,))],
                       NOW) == [None]
    late_replay = chains["late"].peek(1)

    c = chains
    results = store.apply([
        c["plain-1"].append(epochs["plain-1"], c["plain-1"].extend()),
        c["plain-1"].append(epochs["plain-1"], c["plain-1"].extend()),
        c["eater"].append(epochs["eater"], c["eater"].extend(),
                          consume_event_ids=(event.event_id,)),
        c["plain-2"].append(epochs["plain-2"], c["plain-2"].extend()),
        c["late"].append(epochs["late"], late_replay, consume_event_ids=(late_event.event_id,)),
        c["child"].append(epochs["child"], c["child"].extend(), status="completed",
                          phase="termination", ready_at=None, release=True,
                          signal=Signal("parent", "child:done", b'{"ok":1}', "child-done")),
        c["plain-3"].append(epochs["plain-3"], c["plain-3"].extend()),
    ], NOW + 2)

    assert [r is None for r in results] == [True, True, True, True, False, True, True]
    assert isinstance(results[4], LeaseLostError)
    for chain in c.values():
        assert store.records(chain.object_id) == chain.records
    assert store.pending_events("eater") == []
    (signal,) = store.pending_events("parent")
    assert (signal.name, signal.payload, signal.dedupe_key) == ("child:done", b'{"ok":1}',
                                                                 "child-done")
    row = store.get("parent")
    assert row is not None and row.ready_at == NOW + 2


def test_a_batch_sets_routing_fields(store: Store, signer: Signer) -> None:
    """Capabilities needed next, a node to avoid and clearing the avoid list, each set
    by one append of a batch, decide which nodes may claim each object next."""
    chains, epochs = _claimed(store, signer, "gpu", "avoided", "cleared")
    gpu, avoided, cleared = chains["gpu"], chains["avoided"], chains["cleared"]
    releasing = {"ready_at": NOW, "release": True, "status": "ready", "phase": "evaluation"}
    assert store.apply([
        gpu.append(epochs["gpu"], gpu.extend(), requires=("gpu",), **releasing),
        avoided.append(epochs["avoided"], avoided.extend(), avoid_node="node-b", **releasing),
        cleared.append(epochs["cleared"], cleared.extend(), avoid_node="node-b", **releasing),
    ], NOW) == [None, None, None]
    row = store.get("gpu")
    assert row is not None and row.requires == ("gpu",)

    def claimable(node: str, caps: tuple[str, ...] = ()) -> list[str]:
        claims = store.claim(node, NOW, LEASE, 10, Route(node_id=node, capabilities=caps))
        found = sorted(c.object_id for c in claims)
        for claim in claims:  # let go again, unchanged
            chain = chains[claim.object_id]
            assert store.apply([chain.append(claim.epoch, chain.extend(), **releasing)],
                               NOW) == [None]
        return found

    assert claimable("node-b") == []
    assert claimable("node-b", ("gpu",)) == ["gpu"]
    assert claimable("node-c") == ["avoided", "cleared"]
    claims = {c.object_id: c for c in store.claim("node-c", NOW, LEASE, 10,
                                                  Route(node_id="node-c"))}
    assert store.apply([
        avoided.append(claims["avoided"].epoch, avoided.extend(), **releasing),
        cleared.append(claims["cleared"].epoch, cleared.extend(), clear_avoid=True,
                       **releasing),
    ], NOW) == [None, None]
    assert claimable("node-b") == ["cleared"]


def test_an_append_keeps_times_bytes_and_text_exactly(store: Store, signer: Signer) -> None:
    """Timers that are not round numbers, result bytes of every value and non-ASCII
    notes come back exactly as appended."""
    chains, epochs = _claimed(store, signer, "exact", "other")
    exact = chains["exact"]
    result = bytes(range(256))
    assert store.apply([
        exact.append(epochs["exact"], exact.extend(), status="completed", phase="termination",
                     ready_at=NOW + 0.1, release=True, result=result,
                     note="naïve ✓ 日本 \"quoted\" \\ back"),
        chains["other"].append(epochs["other"], chains["other"].extend(), ready_at=1 / 3),
    ], NOW + 0.7) == [None, None]
    row = store.get("exact")
    assert row is not None
    assert (row.ready_at, row.result, row.updated_at) == (NOW + 0.1, result, NOW + 0.7)
    assert row.note == "naïve ✓ 日本 \"quoted\" \\ back"
    row = store.get("other")
    assert row is not None and row.ready_at == 1 / 3
    assert store.records("exact") == exact.records


def test_commit_seals_are_stored_with_the_batch(store: Store, signer: Signer) -> None:
    """Seals handed to ``apply`` are stored in the same commit and read back by digest,
    also the one covering an append its fence refused (a seal only vouches for hashes);
    storing a seal twice keeps one, and an unknown digest is simply absent."""
    chains, epochs = _claimed(store, signer, "a", "b")
    a, b = chains["a"], chains["b"]
    new_a, new_b = a.extend(2), b.peek(1)
    commit_seal, refs = seal_commit([*new_a, *new_b], signer)
    sealed_a, sealed_b = refs[:2], refs[2:]
    results = store.apply([
        a.append(epochs["a"], sealed_a),
        b.append(epochs["b"] - 1, sealed_b),
    ], NOW, [commit_seal])
    assert results[0] is None and isinstance(results[1], LeaseLostError)
    assert [r.signature for r in store.records("a")[1:]] == [seal_ref(commit_seal.digest)] * 2
    assert store.seals([commit_seal.digest, bytes(32)]) == {commit_seal.digest: commit_seal}
    assert store.seals([]) == {}

    more = a.extend(1)
    assert store.apply([a.append(epochs["a"], more)], NOW, [commit_seal]) == [None]
    assert store.seals([commit_seal.digest]) == {commit_seal.digest: commit_seal}


def test_commit_seals_go_in_with_careful_appends(store: Store, signer: Signer) -> None:
    """A batch that also consumes events or signals (the careful path) stores its seal."""
    chains, epochs = _claimed(store, signer, "parent", "child")
    parent, child = chains["parent"], chains["child"]
    commit_seal, refs = seal_commit([*parent.extend(1), *child.extend(1)], signer)
    results = store.apply([
        parent.append(epochs["parent"], refs[:1]),
        child.append(epochs["child"], refs[1:], status="completed", phase="termination",
                     signal=Signal("parent", "perdure:child", b"{}", "child-done")),
    ], NOW, [commit_seal])
    assert results == [None, None]
    assert store.seals([commit_seal.digest]) == {commit_seal.digest: commit_seal}
    assert store.records("child")[-1].signature == seal_ref(commit_seal.digest)


async def _apply_async(store: Store, ops: list[Append], now: float
                       ) -> list[BaseException | None] | None:
    from perdure.stores.postgres import PostgresStore

    assert isinstance(store, PostgresStore)
    try:
        return await store.apply_async(ops, now)
    finally:
        await store.close_async()


async def _through_writer(store: Store, batches: list[list[Append]], now: float,
                          seals: Sequence[CommitSeal] = ()) -> list[Outcomes]:
    """Commit each batch through the store's writer, as a node's event loop does (its
    write thread a pool of one thread); each batch's outcomes."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    loop = asyncio.get_running_loop()
    await store.open_async()
    try:
        writer = store.writer(pool)
        found = []
        for ops in batches:
            future: asyncio.Future[Outcomes] = loop.create_future()

            def done(results: Outcomes | None, error: BaseException | None,
                     future: asyncio.Future[Outcomes] = future) -> None:
                if results is None:
                    future.set_exception(error or RuntimeError("no outcome"))
                else:
                    future.set_result(results)

            writer.write(loop, ops, now, seals, done)
            found.append(await future)
        return found
    finally:
        await store.close_async()
        pool.shutdown()


def test_apply_async_takes_plain_batches_and_leaves_the_rest(store: Store, signer: Signer,
                                                             place: str) -> None:
    """PostgreSQL commits a batch of plain appends to distinct objects on the event loop,
    each judged on its own as ``apply`` would; a batch of several appends where one
    consumes an event, one that signals, two appends of one object, or a record conflict
    is left to ``apply`` (``None``) with nothing written."""
    if not place.startswith("postgresql"):
        pytest.skip("PostgreSQL's commit on an asynchronous connection")
    chains, epochs = _claimed(store, signer, "a", "b", "c")
    a, b, c = chains["a"], chains["b"], chains["c"]
    plain = [a.append(epochs["a"], a.extend(1)), b.append(epochs["b"] - 1, b.peek(1)),
             c.append(epochs["c"], c.extend(2))]
    results = asyncio.run(_apply_async(store, plain, NOW + 1))
    assert results is not None and results[0] is None and results[2] is None
    assert isinstance(results[1], LeaseLostError)
    for chain in (a, b, c):
        assert store.records(chain.object_id) == chain.records

    squatter = c.peek(1)[0]  # a stray row at c's next seq: its append hits a conflict
    import psycopg

    with psycopg.connect(place) as pg:
        pg.execute(b"INSERT INTO records (object_id, seq, trace_id, ts_us, node_id, "
                   b"policy_ref, kind, body, prev_hash, hash, signature) "
                   b"VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                   record_params(squatter))
    twice = [a.append(epochs["a"], a.peek(1)), a.append(epochs["a"], a.peek(2)[1:])]
    careful = [a.append(epochs["a"], a.peek(1), consume_event_ids=(1,)),
               b.append(epochs["b"], b.peek(1))]
    signals = [a.append(epochs["a"], a.peek(1), signal=Signal("b", "hi", b"1", None))]
    clash = [b.append(epochs["b"], b.peek(1)), c.append(epochs["c"], c.peek(1))]
    for batch in (twice, careful, signals, clash):
        assert asyncio.run(_apply_async(store, batch, NOW + 3)) is None
    assert store.records("a") == a.records and store.records("b") == b.records
    assert store.records("c") == [*c.records, squatter]


def test_apply_async_takes_a_lone_append_that_consumes_events(store: Store, signer: Signer,
                                                              place: str) -> None:
    """An agent receiving what it waited for commits on the event loop too (PostgreSQL):
    the append and the consumption of its events go through together, or, when the
    epoch is stale or an event was already consumed, neither does."""
    if not place.startswith("postgresql"):
        pytest.skip("PostgreSQL's commit on an asynchronous connection")
    chains, epochs = _claimed(store, signer, "a", "b")
    a, b = chains["a"], chains["b"]
    for name in ("go", "more"):
        store.send("a", name, b'{"x":1}', None, NOW)
    store.send("b", "go", b"2", None, NOW)
    go, more = store.pending_events("a")
    (b_go,) = store.pending_events("b")

    stale = a.append(epochs["a"] - 1, a.peek(1), consume_event_ids=(go.event_id,))
    refused = asyncio.run(_apply_async(store, [stale], NOW))
    assert refused is not None and isinstance(refused[0], LeaseLostError)
    assert store.pending_events("a") == [go, more] and store.records("a") == a.records

    both = a.append(epochs["a"], a.extend(2), consume_event_ids=(go.event_id, more.event_id))
    assert asyncio.run(_apply_async(store, [both], NOW)) == [None]
    assert store.pending_events("a") == [] and store.records("a") == a.records

    again = a.append(epochs["a"], a.peek(1), consume_event_ids=(go.event_id,))
    refused = asyncio.run(_apply_async(store, [again], NOW))
    assert refused is not None and isinstance(refused[0], LeaseLostError)
    assert "consumed by another node" in str(refused[0])
    assert store.records("a") == a.records

    other = b.append(epochs["b"], b.peek(1), consume_event_ids=(b_go.event_id, go.event_id))
    refused = asyncio.run(_apply_async(store, [other], NOW))
    assert refused is not None and isinstance(refused[0], LeaseLostError)
    assert store.pending_events("b") == [b_go] and store.records("b") == b.records
    row = store.get("b")
    assert row is not None and row.head_seq == b.head.seq


def test_a_writer_commits_through_its_loop_as_apply_does(store: Store, signer: Signer) -> None:
    """However a store commits from a node's event loop (on the loop, awaited there, or on
    the write thread), it opens and closes what the loop needs as often as a worker asks,
    and each batch it commits is judged as ``apply`` judges it: the fenced-out append
    writes nothing, and a batch mixing an event consumer, a signal and plain appends
    lands whole, with its commit seal."""
    chains, epochs = _claimed(store, signer, "a", "b", "c")
    a, b, c = chains["a"], chains["b"], chains["c"]
    store.send("a", "go", b"1", None, NOW)
    (go,) = store.pending_events("a")
    first = [a.append(epochs["a"], a.extend(1)), b.append(epochs["b"] - 1, b.peek(1)),
             c.append(epochs["c"], c.extend(2))]
    mixed_records = a.extend(1) + b.extend(1)
    commit_seal, sealed = seal_commit(mixed_records, signer)
    mixed = [a.append(epochs["a"], sealed[:1], consume_event_ids=(go.event_id,)),
             b.append(epochs["b"], sealed[1:], signal=Signal("c", "hi", b"2", "hi-1")),
             c.append(epochs["c"], [], status="dormant", phase="dormancy", ready_at=None,
                      waiting_event="hi", release=True)]
    a.records[-1], b.records[-1] = sealed

    async def go_through() -> tuple[list[Outcomes], list[Outcomes]]:
        await store.open_async()  # a worker opens as it starts; once more changes nothing
        one = await _through_writer(store, [first], NOW + 1)
        return one, await _through_writer(store, [mixed], NOW + 2, [commit_seal])

    (outcomes,), (mixed_outcomes,) = asyncio.run(go_through())
    assert outcomes[0] is None and outcomes[2] is None
    assert isinstance(outcomes[1], LeaseLostError)
    assert mixed_outcomes == [None, None, None]
    for chain in (a, b, c):
        assert store.records(chain.object_id) == chain.records
    assert store.pending_events("a") == []
    assert [e.name for e in store.pending_events("c")] == ["hi"]
    row = store.get("c")
    assert row is not None and row.ready_at == NOW + 2 and row.lease_owner is None
    assert store.seals([commit_seal.digest]) == {commit_seal.digest: commit_seal}


def _family(store: Store, signer: Signer) -> tuple[dict[str, Chain], dict[str, int]]:
    """A parent with a running child, a dormant child and a child that already ended,
    all claimed (the ended one is set terminal through its own append)."""
    chains = {oid: Chain(oid, signer) for oid in ("mum", "busy", "sleepy", "done", "other")}
    assert store.create(chains["mum"].new_object(ready_at=NOW), NOW)
    for kid in ("busy", "sleepy", "done"):
        assert store.create(chains[kid].new_object(ready_at=NOW, parent_id="mum"), NOW)
    assert store.create(chains["other"].new_object(ready_at=NOW), NOW)
    epochs = {c.object_id: c.epoch for c in store.claim("w1", NOW, LEASE, 5)}
    done = chains["done"]
    assert store.apply([done.append(epochs["done"], done.extend(1), status="completed",
                                    phase="termination", ready_at=None, release=True)],
                       NOW) == [None]
    return chains, epochs


@pytest.mark.parametrize("how", ["apply", "writer"])
def test_a_child_appending_in_its_parents_ending_batch_is_cancelled(
        store: Store, signer: Signer, how: str) -> None:
    """A parent that ends and cancels its children in the same batch (one statement on
    PostgreSQL), through ``apply`` or from the event loop, as its children's own
    appends: the running child's step is written and reports the cancel, the child that
    lets go in the batch is runnable now with its cancel pending, a child that ended
    stays as it was, and an unrelated object in the batch is untouched. Every row's head
    still matches its records."""
    chains, epochs = _family(store, signer)
    mum, busy, sleepy, other = (chains[k] for k in ("mum", "busy", "sleepy", "other"))
    batch = [
        busy.append(epochs["busy"], busy.extend(1)),
        mum.append(epochs["mum"], mum.extend(1), status="failed", phase="termination",
                   ready_at=None, release=True, cancel_children=True),
        sleepy.append(epochs["sleepy"], sleepy.extend(1), status="dormant",
                      phase="dormancy", ready_at=None, release=True),
        other.append(epochs["other"], other.extend(1)),
    ]
    if how == "apply":
        results = store.apply(batch, NOW + 1)
    else:
        (results,) = asyncio.run(_through_writer(store, [batch], NOW + 1))
    # The child's step is written; it reports the cancel when the store sees the parent's
    # end first (one statement), else its next commit will: either way it is pending.
    assert results[0] is None or isinstance(results[0], CancelRequestedError)
    assert results[1] is None and results[3] is None
    assert results[2] is None or isinstance(results[2], CancelRequestedError)
    flags = store.control_flags(["busy", "sleepy", "done", "other"])
    assert flags["busy"][1] and flags["sleepy"][1]
    assert not flags["done"][1] and not flags["other"][1]
    sleeper = store.get("sleepy")
    assert sleeper is not None and sleeper.ready_at is not None and sleeper.ready_at <= NOW + 1
    for chain in chains.values():
        row = store.get(chain.object_id)
        assert row is not None
        assert store.records(chain.object_id) == chain.records
        assert (row.head_seq, row.head_hash) == (chain.head.seq, chain.head.hash)


def test_a_fenced_out_ending_cancels_no_child_in_its_batch(store: Store,
                                                          signer: Signer) -> None:
    """A parent's ending refused by its fence (another node holds it now) cancels none of
    its children, neither those in the same batch nor the others."""
    chains, epochs = _family(store, signer)
    mum, busy = chains["mum"], chains["busy"]
    results = store.apply([
        busy.append(epochs["busy"], busy.extend(1)),
        mum.append(epochs["mum"] - 1, mum.peek(1), status="failed", phase="termination",
                   ready_at=None, release=True, cancel_children=True),
    ], NOW + 1)
    assert results[0] is None and isinstance(results[1], LeaseLostError)
    flags = store.control_flags(["busy", "sleepy"])
    assert not flags["busy"][1] and not flags["sleepy"][1]
    assert store.records("mum") == mum.records


def test_append_ending_is_append_with_its_cancel_step_added() -> None:
    """PostgreSQL's ``append_ending`` is ``append`` plus the children's cancel: every line
    of ``append`` appears in it, in order (a column list or RETURNING line may go on), so
    a change to ``append`` that is not carried over fails here."""
    from perdure.stores._sql import load_queries

    queries = load_queries("postgres")

    def lines(name: str) -> list[str]:
        return [line.strip() for line in queries[name].splitlines()
                if line.strip() and not line.strip().startswith("--")]

    plain, ending = lines("append"), lines("append_ending")
    assert len(ending) > len(plain)
    at = 0
    for line in plain:
        stem = line.rstrip(")").rstrip(",")
        while at < len(ending) and not (ending[at] == line or ending[at].startswith(stem)):
            at += 1
        assert at < len(ending), f"append_ending lacks append's line {line!r}"
        at += 1
    assert any("kids AS" in line for line in ending)
