"""``PerdureSaver``: LangGraph's checkpointer conformance suite on SQLite and PostgreSQL,
threads as perdure objects (verified, growing by what changed), two savers on one thread,
and a compiled graph interrupted in one process and resumed in another."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any, TypedDict

import pytest

import perdure

pytest.importorskip("langgraph.checkpoint.conformance")

from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.graph import END, START, StateGraph

from perdure.adapters.langgraph import AGENT, PerdureSaver, thread_object_id
from tests.tools import lg_support

ROOT = Path(__file__).resolve().parents[2]


def test_conformance(make_app: Callable[..., perdure.App]) -> None:
    """Every base capability of LangGraph's conformance suite passes on each backend."""
    app = make_app()

    @checkpointer_test(name="PerdureSaver")
    async def saver() -> AsyncGenerator[PerdureSaver, None]:
        yield PerdureSaver(app)

    report = asyncio.run(validate(saver))
    report.print_report()
    assert report.passed_all_base(), report


def test_graph_resumes_in_another_process(make_app: Callable[..., perdure.App],
                                          store_url: str, key_dir: Path) -> None:
    """A graph stopped before a node (``interrupt_before``) is resumed by a new process
    with a new saver; the thread is a perdure object that verifies."""
    app = make_app()
    graph = lg_support.build(PerdureSaver(app))
    config = {"configurable": {"thread_id": "report 7/a"}}
    first = graph.invoke({"steps": [], "topic": "q3"}, config)
    assert first["steps"] == ["plan q3", "draft"]
    assert graph.get_state(config).next == ("publish",)

    done = subprocess.run(
        [sys.executable, "-m", "tests.tools.lg_support", store_url, str(key_dir), "report 7/a"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["steps"] == ["plan q3", "draft", "publish"]

    state = graph.get_state(config)
    assert state.values["steps"] == ["plan q3", "draft", "publish"] and state.next == ()
    oid = thread_object_id("report 7/a")
    assert oid == "langgraph/report%207%2Fa"
    row = app.store.get(oid)
    assert row is not None and row.agent == AGENT and row.status == "dormant"
    assert app.verify(oid).ok
    history = list(graph.get_state_history(config))
    assert len(history) >= 5


class Counter(TypedDict):
    big: str
    n: int


def test_storage_grows_by_what_changed(make_app: Callable[..., perdure.App]) -> None:
    """A large channel written once is stored once: later checkpoints carry only the
    channels whose version changed."""
    app = make_app()
    saver = PerdureSaver(app)
    big = "x" * 20_000

    def load(state: Counter) -> dict[str, Any]:
        return {"big": big, "n": 0}

    def tick(state: Counter) -> dict[str, Any]:
        return {"n": state["n"] + 1}

    builder = StateGraph(Counter)
    builder.add_node("load", load)
    builder.add_node("tick", tick)
    builder.add_edge(START, "load")
    builder.add_edge("load", "tick")
    builder.add_conditional_edges("tick", lambda s: END if s["n"] >= 30 else "tick")
    graph = builder.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "counter"}, "recursion_limit": 100}
    assert graph.invoke({"big": "", "n": 0}, config)["n"] == 30

    records = app.store.records(thread_object_id("counter"))
    checkpoints = [r for r in records if r.body.get("name") == "langgraph.checkpoint"]
    assert len(checkpoints) >= 30
    holding_big = [r for r in checkpoints if len(r.body_bytes) > 20_000]
    assert len(holding_big) == 1  # the step that wrote it, and no other
    total = sum(len(r.body_bytes) for r in records)
    assert total < 20_000 * 4 / 3 + 40 * 3_000  # the value once, then small steps
    # every checkpoint still reads back whole
    for snapshot in graph.get_state_history(config):
        if snapshot.values.get("n", 0) > 0:
            assert snapshot.values["big"] == big


def test_two_savers_do_not_fork_a_thread(make_app: Callable[..., perdure.App]) -> None:
    """Two savers (two Apps) writing one thread at once: every checkpoint is kept, in
    one chain that verifies."""
    savers = [PerdureSaver(make_app()), PerdureSaver(make_app())]
    config = {"configurable": {"thread_id": "shared", "checkpoint_ns": ""}}
    made: list[str] = []
    lock = threading.Lock()

    def write(saver: PerdureSaver) -> None:
        for _ in range(15):
            checkpoint = empty_checkpoint()
            saver.put(config, checkpoint, {"source": "loop", "step": 1}, {})
            with lock:
                made.append(checkpoint["id"])

    threads = [threading.Thread(target=write, args=(s,)) for s in savers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for saver in savers:
        listed = [c.config["configurable"]["checkpoint_id"] for c in saver.list(config)]
        assert sorted(listed) == sorted(made) and len(made) == 30
    app = savers[0].app
    oid = thread_object_id("shared")
    assert app.verify(oid).ok
    row = app.store.get(oid)
    assert row is not None and row.head_seq == 31


def test_delete_keeps_memory_and_hides_the_thread(make_app: Callable[..., perdure.App]
                                                  ) -> None:
    """``delete_thread`` hides every namespace's checkpoints; memory still verifies, and
    the thread can be written again."""
    app = make_app()
    saver = PerdureSaver(app)
    for ns in ("", "child:1"):
        saver.put({"configurable": {"thread_id": "t", "checkpoint_ns": ns}},
                  empty_checkpoint(), {}, {})
    saver.put({"configurable": {"thread_id": "t2", "checkpoint_ns": ""}},
              empty_checkpoint(), {}, {})
    assert len(list(saver.list({"configurable": {"thread_id": "t"}}))) == 2
    saver.delete_thread("t")
    assert list(saver.list({"configurable": {"thread_id": "t"}})) == []
    assert saver.get_tuple({"configurable": {"thread_id": "t2"}}) is not None
    for ns in ("", "child:1"):
        assert app.verify(thread_object_id("t", ns)).ok
    fresh = PerdureSaver(app)  # reads memory anew
    assert fresh.get_tuple({"configurable": {"thread_id": "t"}}) is None
    fresh.put({"configurable": {"thread_id": "t", "checkpoint_ns": ""}},
              empty_checkpoint(), {}, {})
    assert len(list(saver.list({"configurable": {"thread_id": "t"}}))) == 1


def test_an_object_of_another_agent_is_refused(make_app: Callable[..., perdure.App]) -> None:
    """A thread id whose object is some other agent's is refused, and that object is left
    as it was."""
    app = make_app()

    @app.agent
    async def other(run: perdure.Run) -> str:
        return "ok"

    app.options(object_id=thread_object_id("taken")).start(other)
    before = app.store.get(thread_object_id("taken"))
    with pytest.raises(perdure.ConfigurationError, match="not a LangGraph thread"):
        PerdureSaver(app).put({"configurable": {"thread_id": "taken", "checkpoint_ns": ""}},
                              empty_checkpoint(), {}, {})
    assert app.store.get(thread_object_id("taken")) == before


def test_writes_stored_before_their_checkpoint(make_app: Callable[..., perdure.App]) -> None:
    """LangGraph may store a checkpoint's pending writes before the checkpoint (its calls
    run in the background): they are pending on it once it is stored, read anew too."""
    app = make_app()
    saver = PerdureSaver(app)
    checkpoint = empty_checkpoint()
    config = {"configurable": {"thread_id": "early", "checkpoint_ns": "",
                               "checkpoint_id": checkpoint["id"]}}
    saver.put_writes(config, [("steps", ["a"]), ("topic", "x")], "task-1")
    saver.put({"configurable": {"thread_id": "early", "checkpoint_ns": ""}}, checkpoint,
              {}, {})
    for reader in (saver, PerdureSaver(app)):
        found = reader.get_tuple(config)
        assert found is not None
        assert found.pending_writes == [("task-1", "steps", ["a"]), ("task-1", "topic", "x")]


def test_a_thread_written_under_an_untrusted_key_is_refused(
        make_app: Callable[..., perdure.App], tmp_path: Path) -> None:
    """A saver whose node does not trust the key that wrote a thread refuses to read it
    (``IntegrityError``) and writes nothing to it."""
    app = make_app()
    PerdureSaver(app).put({"configurable": {"thread_id": "t", "checkpoint_ns": ""}},
                          empty_checkpoint(), {}, {})
    stranger = PerdureSaver(make_app(key_dir=tmp_path / "other-keys"))
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    with pytest.raises(perdure.IntegrityError):
        stranger.get_tuple(config)
    with pytest.raises(perdure.IntegrityError):
        stranger.put(config, empty_checkpoint(), {}, {})
    row = app.store.get(thread_object_id("t"))
    assert row is not None and row.head_seq == 2
    assert app.verify(thread_object_id("t")).ok
