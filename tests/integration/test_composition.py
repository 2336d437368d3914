"""Composition in one process, on both stores: delegation, gather, refine, patches, routing.

Every test runs real workers (``App.background_worker``) on the test's real store;
several nodes are several Apps with their own node ids on the same store.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import perdure
from perdure.core.cycle import LocalPolicy
from tests.integration.engine_support import wait_until

AppFactory = Callable[..., perdure.App]


def records_of(app: perdure.App, object_id: str, kind: perdure.Kind) -> list[perdure.Record]:
    """The object's records of one kind, in memory order."""
    return [r for r in app.history(object_id) if r.kind == kind]


def context_of(app: perdure.App, object_id: str) -> dict[str, Any]:
    """The context sealed into the object's first record."""
    return dict(app.history(object_id)[0].body["context"])


# -- delegation ---------------------------------------------------------------------------


def test_delegation_lineage_result_and_listing(make_app: AppFactory) -> None:
    """A child (and grandchild) carry parent, root, depth and the root's trace; results
    flow back up; ``app.list(parent=...)`` lists the children."""
    app = make_app()

    @app.agent(name="leaf")
    async def leaf(run: perdure.Run, x: int) -> int:
        return await run.step(lambda v: v * 10, x, name="times10")

    @app.agent(name="middle")
    async def middle(run: perdure.Run, x: int) -> int:
        child = await run.delegate(leaf, x + 1)
        return await child + 1

    @app.agent(name="top")
    async def top(run: perdure.Run, x: int) -> dict[str, Any]:
        child = await run.options(object_id="top-1-named-child").delegate(middle, x)
        other = await run.delegate("leaf", 7)
        got = await run.join(child, other)
        return {"got": got, "ids": [child.child_id, other.child_id]}

    handle = app.options(object_id="top-1").start("top", 2)
    with app.background_worker():
        result = handle.result(timeout=20)

    assert result == {"got": [31, 70], "ids": ["top-1-named-child", "top-1.1"]}
    root = context_of(app, "top-1")
    child = context_of(app, "top-1-named-child")
    grandchild = context_of(app, "top-1-named-child.0")
    assert root["parent_id"] is None and root["depth"] == 0
    assert child["parent_id"] == "top-1" and child["root_id"] == "top-1"
    assert child["depth"] == 1 and child["trace_id"] == root["trace_id"]
    assert grandchild["parent_id"] == "top-1-named-child"
    assert grandchild["root_id"] == "top-1" and grandchild["depth"] == 2
    assert grandchild["trace_id"] == root["trace_id"]
    listed = {i.object_id: i for i in app.list(parent="top-1")}
    assert set(listed) == {"top-1-named-child", "top-1.1"}
    assert all(i.status is perdure.Status.COMPLETED for i in listed.values())
    assert [i.object_id for i in app.list(parent="top-1-named-child")] == [
        "top-1-named-child.0"]
    finished = records_of(app, "top-1", perdure.Kind.CHILD_FINISHED)
    assert sorted(r.body["child_id"] for r in finished) == ["top-1-named-child", "top-1.1"]
    delegated = records_of(app, "top-1", perdure.Kind.DELEGATED)
    assert [r.body["child_id"] for r in delegated] == ["top-1-named-child", "top-1.1"]
    for oid in ("top-1", "top-1-named-child", "top-1-named-child.0", "top-1.1"):
        assert app.verify(oid).ok, oid


def test_child_failure_raises_child_failed_error(make_app: AppFactory) -> None:
    """A failed child surfaces as ``ChildFailedError`` in the parent, which can catch it;
    a parent that does not catch it fails itself."""
    app = make_app()

    @app.agent(name="breaks")
    async def breaks(run: perdure.Run) -> None:
        await run.step(lambda: 1, name="first")
        raise ValueError("child broke")

    @app.agent(name="careful")
    async def careful(run: perdure.Run) -> dict[str, str]:
        child = await run.delegate(breaks)
        try:
            await child.result()
        except perdure.ChildFailedError as exc:
            return {"child": exc.child_id, "outcome": exc.outcome,
                    "type": exc.error_type, "message": exc.message}
        return {"outcome": "no error"}

    @app.agent(name="careless")
    async def careless(run: perdure.Run) -> Any:
        return await (await run.delegate(breaks))

    caught = app.options(object_id="careful-1").start("careful")
    uncaught = app.options(object_id="careless-1").start("careless")
    with app.background_worker():
        result = caught.result(timeout=20)
        assert wait_until(lambda: uncaught.info().terminal, timeout=20)

    assert result == {"child": "careful-1.0", "outcome": "failed",
                      "type": "builtins:ValueError", "message": "child broke"}
    assert app.get("careful-1.0").status is perdure.Status.FAILED
    assert app.get("careless-1").status is perdure.Status.FAILED
    terminal = records_of(app, "careless-1", perdure.Kind.TERMINATED)[0].body
    assert "ChildFailedError" in terminal["error"]["type"], terminal


def test_parent_runs_once_more_only_after_all_children_finish(make_app: AppFactory) -> None:
    """Children finishing one by one are folded into the parent's memory without running
    it; the parent's code runs exactly twice: once to delegate, once when all are done."""
    app = make_app()
    calls: list[float] = []

    @app.agent(name="napper")
    async def napper(run: perdure.Run, seconds: float) -> float:
        await run.sleep(seconds)
        return seconds

    @app.agent(name="boss")
    async def boss(run: perdure.Run) -> list[Any]:
        calls.append(time.time())
        children = [await run.delegate(napper, s) for s in (0.2, 0.5, 0.8)]
        return await run.join(*children)

    handle = app.options(object_id="boss-1").start("boss")
    with app.background_worker():
        result = handle.result(timeout=20)

    assert result == [0.2, 0.5, 0.8]
    assert len(calls) == 2, f"the parent's code ran {len(calls)} times"
    ends = {r.body["child_id"]: r for r in records_of(app, "boss-1", perdure.Kind.CHILD_FINISHED)}
    assert set(ends) == {"boss-1.0", "boss-1.1", "boss-1.2"}
    last_fold = max(r.ts_us for r in ends.values()) / 1e6
    assert calls[1] >= last_fold, "the parent ran again before its last child was folded"
    assert all(r.body["outcome"] == "completed" for r in ends.values())
    assert {i.object_id for i in app.list(parent="boss-1")} == set(ends)
    assert app.verify("boss-1").ok


def test_cancelling_a_dormant_parent_cancels_its_live_children(make_app: AppFactory) -> None:
    """Cancel reaches a parent dormant on its children; its live children are cancelled,
    a child that already finished stays completed."""
    app = make_app()

    @app.agent(name="waits")
    async def waits(run: perdure.Run, wait: bool) -> str:
        if wait:
            await run.wait_for("never")
        return "done"

    @app.agent(name="holder")
    async def holder(run: perdure.Run) -> list[Any]:
        kids = [await run.delegate(waits, w) for w in (True, False, True)]
        return await run.join(*kids)

    handle = app.options(object_id="hold-1").start("holder")
    with app.background_worker():
        assert wait_until(lambda: len(records_of(app, "hold-1", perdure.Kind.CHILD_FINISHED))
                          == 1 and handle.status() is perdure.Status.DORMANT, timeout=20)
        assert wait_until(lambda: app.get("hold-1.2").waiting_event == "never", timeout=10)
        app.cancel("hold-1")
        assert wait_until(lambda: all(app.get(o).terminal for o in ("hold-1.0", "hold-1.2")),
                          timeout=20)
        assert wait_until(lambda: handle.info().terminal, timeout=10)

    assert handle.status() is perdure.Status.CANCELLED
    assert app.get("hold-1.0").status is perdure.Status.CANCELLED
    assert app.get("hold-1.1").status is perdure.Status.COMPLETED
    assert app.get("hold-1.2").status is perdure.Status.CANCELLED


def test_cancel_children_false_lets_children_finish(make_app: AppFactory) -> None:
    """With ``LocalPolicy(cancel_children=False)`` a cancelled parent leaves its children
    running; they finish normally afterwards."""
    app = make_app(policy=LocalPolicy(cancel_children=False))

    @app.agent(name="waits")
    async def waits(run: perdure.Run) -> Any:
        return await run.wait_for("go")

    @app.agent(name="holder")
    async def holder(run: perdure.Run) -> list[Any]:
        return await run.join(await run.delegate(waits), await run.delegate(waits))

    handle = app.options(object_id="keep-1").start("holder")
    with app.background_worker():
        assert wait_until(lambda: all(app.get(f"keep-1.{i}").waiting_event == "go"
                                      for i in (0, 1)) if len(app.list(parent="keep-1")) == 2
                          else False, timeout=20)
        assert wait_until(lambda: handle.status() is perdure.Status.DORMANT, timeout=10)
        app.cancel("keep-1")
        assert wait_until(lambda: handle.info().terminal, timeout=10)
        time.sleep(0.3)
        assert not app.get("keep-1.0").terminal and not app.get("keep-1.1").terminal
        app.send("keep-1.0", "go", "a")
        app.send("keep-1.1", "go", "b")
        assert app.handle("keep-1.0").result(timeout=10) == "a"
        assert app.handle("keep-1.1").result(timeout=10) == "b"

    assert handle.status() is perdure.Status.CANCELLED


# -- gather ---------------------------------------------------------------------------------


def test_gather_returns_results_in_argument_order(make_app: AppFactory) -> None:
    """Branches finishing in reverse order still give results in argument order; each
    branch's command takes position ``<gather>.<branch>.<n>``; a child handle may be a
    branch, and the object waits for it once."""
    app = make_app()
    ran: Counter[str] = Counter()

    async def timed(label: str, seconds: float) -> str:
        ran[label] += 1
        await asyncio.sleep(seconds)
        return label

    @app.agent(name="kid")
    async def kid(run: perdure.Run) -> str:
        await run.sleep(0.3)
        return "kid"

    @app.agent(name="fan")
    async def fan(run: perdure.Run) -> list[Any]:
        first = await run.step(timed, "pre", 0.0, name="pre")
        child = await run.delegate(kid)
        got = await run.gather(
            run.step(timed, "slow", 0.6, name="slow"),
            run.step(timed, "mid", 0.3, name="mid"),
            run.step(timed, "fast", 0.0, name="fast"),
            child,
        )
        return [first, *got]

    handle = app.options(object_id="fan-1").start("fan")
    with app.background_worker():
        result = handle.result(timeout=20)

    assert result == ["pre", "slow", "mid", "fast", "kid"]
    assert ran == Counter(pre=1, slow=1, mid=1, fast=1), "a finished branch ran again"
    done = records_of(app, "fan-1", perdure.Kind.STEP_DONE)
    assert [(r.body["name"], r.body["pos"]) for r in done] == [
        ("pre", 0), ("fast", "2.2.0"), ("mid", "2.1.0"), ("slow", "2.0.0")]
    assert app.verify("fan-1").ok


def test_gather_replay_after_a_node_stalls_does_not_rerun_finished_branches(
    make_app: AppFactory,
) -> None:
    """Node 1 records one branch of a gather, then freezes inside the other; node 2 takes
    the object after the lease lapses, replays the recorded branch and runs only the
    other; node 1's late result is fenced out."""
    first_node = make_app(node_id="stall-1", lease_seconds=1.0)
    second_node = make_app(node_id="stall-2", lease_seconds=1.0)
    calls: Counter[str] = Counter()
    release = threading.Event()

    def fast(x: int) -> int:
        calls["fast"] += 1
        return x + 1

    async def freezing(x: int) -> int:
        calls["freezing"] += 1
        if calls["freezing"] == 1:
            while not any(r.kind == perdure.Kind.STEP_DONE
                          for r in first_node.store.records("g-1")):
                await asyncio.sleep(0.01)
            release.wait(30)  # blocks the node's whole event loop: no renewals, no commits
        return x * 2

    for app in (first_node, second_node):

        @app.agent(name="pair")
        async def pair(run: perdure.Run, x: int) -> list[int]:
            return await run.gather(run.step(freezing, x, name="freezing"),
                                    run.step(fast, x, name="fast"))

    first_node.options(object_id="g-1").start("pair", 5)
    try:
        with first_node.background_worker():
            assert wait_until(lambda: calls["freezing"] == 1 and any(
                r.kind == perdure.Kind.STEP_DONE for r in first_node.history("g-1")),
                timeout=20)
            with second_node.background_worker():
                assert second_node.handle("g-1").result(timeout=30) == [10, 6]
            release.set()
    finally:
        release.set()

    assert calls == Counter(fast=1, freezing=2)
    done = {r.body["name"]: r for r in records_of(first_node, "g-1", perdure.Kind.STEP_DONE)}
    assert set(done) == {"fast", "freezing"}
    assert done["fast"].node_id == "stall-1" and done["fast"].body["pos"] == "0.1.0"
    assert done["freezing"].node_id == "stall-2" and done["freezing"].body["pos"] == "0.0.0"
    assert first_node.verify("g-1").ok


# -- refine ---------------------------------------------------------------------------------


def test_refine_inside_an_agent_and_from_outside_while_dormant(make_app: AppFactory) -> None:
    """``run.refine`` appends an intent refinement at once; ``app.refine`` on a dormant
    object is applied on its next cycle; replaying the inner refinement does not wind
    ``run.intent`` back, so the agent sees the newest version."""
    app = make_app()
    seen: list[tuple[int, dict[str, Any], int | None]] = []

    @app.agent(name="adjusts")
    async def adjusts(run: perdure.Run) -> dict[str, Any]:
        refined = await run.refine(goal={"stage": "inner"})
        inner = refined.version_no  # recorded: the same on every replay
        assert run.intent.version_no >= inner
        await run.wait_for("go")
        seen.append((run.intent.version_no, dict(run.intent.goal), run.intent.max_failures))
        return {"inner": inner, "now": run.intent.version_no,
                "goal": run.intent.goal, "max_failures": run.intent.max_failures}

    @app.agent(name="sleeper")
    async def sleeper(run: perdure.Run) -> dict[str, Any]:
        await run.wait_for("go")
        return {"version": run.intent.version_no, "goal": run.intent.goal}

    both = app.options(object_id="ref-1").start("adjusts")
    outer = app.options(object_id="ref-2").start("sleeper")
    with app.background_worker():
        for oid in ("ref-1", "ref-2"):
            assert wait_until(lambda o=oid: app.get(o).waiting_event == "go", timeout=20)
        app.refine("ref-1", max_failures=5)
        app.refine("ref-2", goal={"stage": "outer"})
        for oid, count in (("ref-1", 2), ("ref-2", 1)):
            assert wait_until(lambda o=oid, c=count: len(
                records_of(app, o, perdure.Kind.INTENT_REFINED)) == c, timeout=10)
        assert wait_until(lambda: app.get("ref-2").status is perdure.Status.DORMANT
                          and app.get("ref-2").waiting_event == "go", timeout=10)
        app.send("ref-1", "go")
        app.send("ref-2", "go")
        result = both.result(timeout=10)
        assert outer.result(timeout=10) == {"version": 2, "goal": {"stage": "outer"}}

    assert result == {"inner": 2, "now": 3, "goal": {"stage": "inner"}, "max_failures": 5}
    assert seen == [(3, {"stage": "inner"}, 5)]
    refined = records_of(app, "ref-1", perdure.Kind.INTENT_REFINED)
    assert [r.body["intent"]["version_no"] for r in refined] == [2, 3]


# -- run.patched ------------------------------------------------------------------------------


def test_patched_block_old_objects_replay_old_path_new_ones_take_it(
    make_app: AppFactory,
) -> None:
    """An object whose memory predates ``if run.patched(...)`` replays the old path after
    the code changes; a new object takes (and records) the patched path."""
    old_code = make_app(node_id="patch-old")
    new_code = make_app(node_id="patch-new")
    extras: list[str] = []

    @old_code.agent(name="flow")
    async def flow_v1(run: perdure.Run, tag: str) -> list[str]:
        a = await run.step(lambda t: f"a-{t}", tag, name="a")
        go = await run.wait_for("go")
        c = await run.step(lambda t: f"c-{t}", tag, name="c")
        return [a, go, c]

    def extra(tag: str) -> str:
        extras.append(tag)
        return f"extra-{tag}"

    @new_code.agent(name="flow")
    async def flow_v1_patched(run: perdure.Run, tag: str) -> list[str]:
        a = await run.step(lambda t: f"a-{t}", tag, name="a")
        out = [a]
        if run.patched("add-extra"):
            out.append(await run.step(extra, tag, name="extra"))
        go = await run.wait_for("go")
        c = await run.step(lambda t: f"c-{t}", tag, name="c")
        return [*out, go, c]

    old = old_code.options(object_id="flow-old").start("flow", "old")
    with old_code.background_worker():
        assert wait_until(lambda: old.info().waiting_event == "go", timeout=20)
    new = new_code.options(object_id="flow-new").start("flow", "new")
    new_code.send("flow-old", "go", "g")
    new_code.send("flow-new", "go", "g")
    with new_code.background_worker():
        assert new_code.handle("flow-old").result(timeout=20) == ["a-old", "g", "c-old"]
        assert new.result(timeout=20) == ["a-new", "extra-new", "g", "c-new"]

    assert extras == ["new"]
    assert not records_of(new_code, "flow-old", perdure.Kind.PATCHED)
    assert not records_of(new_code, "flow-old", perdure.Kind.NONDETERMINISM)
    patched = records_of(new_code, "flow-new", perdure.Kind.PATCHED)
    assert [(r.body["name"], r.body["pos"]) for r in patched] == [("add-extra", 1)]


# -- capability routing ---------------------------------------------------------------------


def _nodes_with(make_app: AppFactory, *specs: tuple[str, set[str]]) -> list[perdure.App]:
    return [make_app(node_id=node, capabilities=caps) for node, caps in specs]


def test_agent_level_requires_is_never_claimed_by_a_node_without_it(
    make_app: AppFactory,
) -> None:
    """An agent registered with ``requires={"browser"}`` is left alone by a node without a
    browser (the note says why) and run by one that has it."""
    plain, browsing = _nodes_with(make_app, ("plain", set()), ("browsing", {"browser"}))
    for app in (plain, browsing):

        @app.agent(name="surf", requires={"browser"})
        async def surf(run: perdure.Run, url: str) -> str:
            return await run.step(lambda u: f"read {u}", url, name="read")

    handle = plain.options(object_id="surf-1").start("surf", "example.org")
    with plain.background_worker():
        time.sleep(1.0)
        info = plain.get("surf-1")
        assert info.epoch == 0 and info.records == 1, info
        assert info.requires == ("browser",)
        assert info.note == "waiting: no live node serving surf@1 has browser", info
    with browsing.background_worker():
        assert handle.result(timeout=20) == "read example.org"

    assert {r.node_id for r in plain.history("surf-1")[1:]} == {"browsing"}


def test_step_level_requires_records_capability_missing_once(make_app: AppFactory) -> None:
    """A step needing a capability the node lacks records ``capability_missing`` once and
    leaves the object to a capable node, which runs that step; the lacking node never
    runs it."""
    plain, gpu = _nodes_with(make_app, ("cpu-node", set()), ("gpu-node", {"gpu"}))
    trained: list[str] = []

    def train(x: int) -> int:
        trained.append(perdure.current_step().name)
        return x * 100

    for app in (plain, gpu):

        @app.agent(name="learn")
        async def learn(run: perdure.Run, x: int) -> list[int]:
            prepared = await run.step(lambda v: v + 1, x, name="prepare")
            model = await run.step(train, prepared, name="train", requires={"gpu"})
            score = await run.step(lambda v: v - 1, model, name="score")
            return [prepared, model, score]

    handle = plain.options(object_id="learn-1").start("learn", 2)
    with plain.background_worker():
        assert wait_until(lambda: records_of(plain, "learn-1", perdure.Kind.CAPABILITY_MISSING),
                          timeout=20)
        time.sleep(0.8)
        info = plain.get("learn-1")
        assert info.requires == ("gpu",) and info.lease_owner is None, info
        assert info.note is not None and "gpu" in info.note, info
    assert trained == []
    with gpu.background_worker():
        assert handle.result(timeout=20) == [3, 300, 299]

    missing = records_of(plain, "learn-1", perdure.Kind.CAPABILITY_MISSING)
    assert len(missing) == 1, [r.body for r in missing]
    body = missing[0].body
    assert body["node"] == "cpu-node" and body["capabilities"] == ["gpu"]
    assert body["step"] == "train" and isinstance(body["at"], float)
    assert missing[0].node_id == "cpu-node"
    done = {r.body["name"]: r.node_id for r in records_of(plain, "learn-1",
                                                           perdure.Kind.STEP_DONE)}
    assert done["prepare"] == "cpu-node" and done["train"] == "gpu-node"
    assert trained == ["train"]
    assert plain.get("learn-1").requires == ()
    assert plain.verify("learn-1").ok


def test_cannot_do_moves_the_object_to_another_node_without_a_failure(
    make_app: AppFactory,
) -> None:
    """A step raising ``CannotDo`` records a negative capability for its node; that node
    does not take the object again, another node completes it, and no failure is
    recorded."""
    refusing, willing = _nodes_with(make_app, ("refuser", set()), ("willing", set()))
    attempts: list[str] = []

    def register(app: perdure.App, can: bool) -> None:
        node = app.node_id

        def licensed(x: int) -> int:
            attempts.append(node)
            if not can:
                raise perdure.CannotDo("no licence on this node")
            return x + 40

        @app.agent(name="render")
        async def render(run: perdure.Run, x: int) -> int:
            return await run.step(licensed, x, name="licensed")

    register(refusing, False)
    register(willing, True)

    handle = refusing.options(object_id="render-1").start("render", 2)
    with refusing.background_worker():
        assert wait_until(lambda: records_of(refusing, "render-1",
                                             perdure.Kind.CAPABILITY_MISSING), timeout=20)
        time.sleep(0.8)
    assert attempts == ["refuser"], "the refusing node took the object again"
    with willing.background_worker():
        assert handle.result(timeout=20) == 42

    assert attempts == ["refuser", "willing"]
    missing = records_of(refusing, "render-1", perdure.Kind.CAPABILITY_MISSING)
    assert len(missing) == 1
    assert missing[0].body["node"] == "refuser" and missing[0].body["cannot_do"] == "licensed"
    assert missing[0].body["reason"] == "no licence on this node"
    assert not records_of(refusing, "render-1", perdure.Kind.STEP_FAILED)
    assert records_of(refusing, "render-1", perdure.Kind.STEP_DONE)[0].node_id == "willing"


# -- versions ---------------------------------------------------------------------------------


def test_object_of_version_1_waits_for_a_version_1_node(make_app: AppFactory) -> None:
    """An object started under version 1 is not claimed by a node serving only version 2;
    its note says no live node serves it; a version-1 node then finishes it."""
    v1 = make_app(node_id="node-v1")
    v2 = make_app(node_id="node-v2")

    @v1.agent(name="job", version="1")
    async def job_v1(run: perdure.Run) -> str:
        return await run.step(lambda: "v1", name="work")

    @v2.agent(name="job", version="2")
    async def job_v2(run: perdure.Run) -> str:
        return await run.step(lambda: "v2", name="work")

    handle = v1.options(object_id="job-1").start("job")
    v2_job = v2.options(object_id="job-2").start("job")
    with v2.background_worker():
        assert v2_job.result(timeout=20) == "v2"
        time.sleep(0.5)
        info = v1.get("job-1")
        assert info.epoch == 0 and info.records == 1, info
        assert info.note == "waiting: no live node serves job@1", info
    with v1.background_worker():
        assert handle.result(timeout=20) == "v1"

    assert {r.node_id for r in v1.history("job-1")[1:]} == {"node-v1"}
    assert v1.get("job-1").agent_version == "1"
