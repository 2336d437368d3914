"""Dormancy: sleeping and waiting objects cost a row, not a thread, and wake on time or event."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import perdure
from tests.integration.engine_support import (
    count_lines,
    kill_process,
    kinds,
    start_worker_process,
    wait_then_act,
    wait_until,
)

AppFactory = Callable[..., perdure.App]


def test_sleep_releases_the_object(make_app: AppFactory) -> None:
    """While an agent sleeps its object is dormant with no lease owner, then it wakes on time."""
    app = make_app()

    @app.agent(name="napper")
    async def napper(run: perdure.Run) -> float:
        started = await run.now()
        await run.sleep(0.5)
        return time.time() - started

    handle = app.options(object_id="nap-1").start("napper")
    with app.background_worker():
        assert wait_until(lambda: handle.status() is perdure.Status.DORMANT)
        row = app.store.get("nap-1")
        assert row is not None
        assert row.lease_owner is None and row.lease_expires is None
        assert row.ready_at is not None and row.ready_at > time.time()
        assert app.get("nap-1").phase == "dormancy"
        slept = handle.result(timeout=10)

    assert slept >= 0.5
    assert kinds(app, "nap-1") == ["instantiated", "value", "dormant", "woke", "terminated"]


def test_wait_for_releases_the_object_and_an_event_wakes_it_promptly(
    make_app: AppFactory,
) -> None:
    """A waiting object holds no lease; an event sent to it is picked up within moments."""
    app = make_app()

    @app.agent(name="waiter")
    async def waiter(run: perdure.Run) -> Any:
        return await run.wait_for("approval")

    handle = app.options(object_id="wait-1").start("waiter")
    with app.background_worker():
        assert wait_until(lambda: handle.info().waiting_event == "approval")
        info = handle.info()
        assert info.status is perdure.Status.DORMANT
        assert info.lease_owner is None and info.ready_at is None
        time.sleep(0.2)
        sent = time.monotonic()
        assert app.send("wait-1", "approval", {"by": "ana"}) is True
        assert handle.result(timeout=5) == {"by": "ana"}
        took = time.monotonic() - sent

    assert took < 1.0, f"an event woke the dormant object only after {took:.2f}s"
    received = [r for r in app.history("wait-1") if r.kind == perdure.Kind.EVENT_RECEIVED]
    assert [r.body["payload"] for r in received] == [{"by": "ana"}]


def test_a_received_event_is_recorded_with_the_next_step(make_app: AppFactory) -> None:
    """Receiving an event costs no commit of its own: its record, and the event's
    consumption, go with the commit of the step that follows."""
    app = make_app()

    @app.agent(name="acts_on_go")
    async def acts_on_go(run: perdure.Run) -> Any:
        payload = await run.wait_for("go")
        return await run.step(lambda: payload, name="act")

    handle = app.options(object_id="go-1").start("acts_on_go")
    with app.background_worker():
        assert wait_until(lambda: handle.info().waiting_event == "go")
        app.send("go-1", "go", 7)
        assert handle.result(timeout=5) == 7

    records = app.history("go-1")
    assert [str(r.kind) for r in records] == [
        "instantiated", "dormant", "event_received", "step_done", "terminated"]
    received, done = records[2], records[3]
    assert received.ts_us == done.ts_us, "sealed by one commit"
    assert app.store.pending_events("go-1") == []


def test_a_received_event_goes_with_values_committed_before_a_step(
    make_app: AppFactory,
) -> None:
    """A value drawn after ``wait_for`` must be durable before the next step's body runs:
    that commit carries the event's receipt too, and consumes the event."""
    app = make_app()
    inbox_seen: list[int] = []

    def look(object_id: str) -> str:
        inbox_seen.append(len(app.store.pending_events(object_id)))
        return "looked"

    @app.agent(name="go_then_value")
    async def go_then_value(run: perdure.Run) -> Any:
        payload = await run.wait_for("go")
        token = await run.uuid()
        await run.step(look, run.object_id, name="look")
        return [payload, len(token)]

    handle = app.options(object_id="go-3").start("go_then_value")
    with app.background_worker():
        assert wait_until(lambda: handle.info().waiting_event == "go")
        app.send("go-3", "go", 1)
        assert handle.result(timeout=5) == [1, 36]

    records = app.history("go-3")
    assert [str(r.kind) for r in records] == [
        "instantiated", "dormant", "event_received", "value", "step_done", "terminated"]
    assert records[2].ts_us == records[3].ts_us < records[4].ts_us
    assert inbox_seen == [0], "the event was consumed before the step's body ran"


def test_the_event_that_woke_an_object_is_taken_from_the_claims_read(
    make_app: AppFactory,
) -> None:
    """Resuming a waiting object reads its inbox once: the ``wait_for`` the event woke
    takes it from the worker's read before running the agent."""
    app = make_app()

    @app.agent(name="acts_on_go_once")
    async def acts_on_go_once(run: perdure.Run) -> Any:
        return await run.wait_for("go")

    handle = app.options(object_id="go-2").start("acts_on_go_once")
    with app.background_worker():
        assert wait_until(lambda: handle.info().waiting_event == "go")
        store = app.store
        reads: list[str] = []
        read_inbox = store.pending_events

        def counted(object_id: str) -> Any:
            reads.append(object_id)
            return read_inbox(object_id)

        store.pending_events = counted  # type: ignore[method-assign]
        app.send("go-2", "go", "now")
        assert handle.result(timeout=5) == "now"
    assert reads == ["go-2"]


def test_an_event_sent_after_the_claims_read_is_still_received(make_app: AppFactory) -> None:
    """An event that arrives while the agent runs (here sent by its own step) is not in
    the worker's earlier read of the inbox: ``wait_for`` reads the inbox again and
    receives it without going dormant."""
    app = make_app()

    def send_to_self() -> str:
        assert app.send("self-1", "note", "from the step") is True
        return "sent"

    @app.agent(name="sends_to_itself")
    async def sends_to_itself(run: perdure.Run) -> Any:
        await run.step(send_to_self, name="send")
        return await run.wait_for("note", timeout=30)

    handle = app.options(object_id="self-1").start("sends_to_itself")
    with app.background_worker():
        assert handle.result(timeout=10) == "from the step"
    assert kinds(app, "self-1") == ["instantiated", "step_done", "event_received",
                                    "terminated"]


def test_an_event_received_before_a_crash_is_delivered_again(
    make_app: AppFactory, store_url: str, key_dir: Path, tmp_path: Path
) -> None:
    """A worker killed (SIGKILL) in the step after ``wait_for``: the event's receipt was
    not committed yet, so the event is still in the inbox, and the next node delivers
    it again and completes with it, recording it once."""
    marks = str(tmp_path / "marks")
    starter = make_app()
    starter.agent(name="wait_then_act")(wait_then_act)
    handle = starter.options(object_id="act-1").start("wait_then_act", marks, 30.0)
    log = tmp_path / "worker.log"
    proc = start_worker_process(store_url, key_dir, log)
    try:
        assert wait_until(lambda: handle.info().waiting_event == "go", timeout=15), (
            log.read_text())
        starter.send("act-1", "go", {"n": 1})
        assert wait_until(lambda: count_lines(marks) == 1, timeout=15), log.read_text()
    finally:
        kill_process(proc)
    assert kinds(starter, "act-1") == ["instantiated", "dormant"]
    assert [e.name for e in starter.store.pending_events("act-1")] == ["go"]

    resumer = make_app()
    resumer.agent(name="wait_then_act")(wait_then_act)
    with resumer.background_worker():
        result = resumer.handle("act-1").result(timeout=15)

    assert result == {"payload": {"n": 1}, "outcome": "done"}
    assert count_lines(marks) == 2, "the interrupted step ran again"
    assert kinds(resumer, "act-1").count("event_received") == 1
    assert resumer.store.pending_events("act-1") == []
    assert resumer.verify("act-1").ok


def test_events_sent_before_waiting_are_delivered_in_order(make_app: AppFactory) -> None:
    """Events sent before the agent waits are kept and delivered in arrival order."""
    app = make_app()

    @app.agent(name="collector")
    async def collector(run: perdure.Run) -> list[Any]:
        await run.sleep(0.3)
        first = await run.wait_for("item")
        second = await run.wait_for("item")
        other = await run.wait_for("other")
        return [first, second, other]

    handle = app.options(object_id="collect-1").start("collector")
    app.send("collect-1", "item", 1)
    app.send("collect-1", "other", "o")
    app.send("collect-1", "item", 2)
    with app.background_worker():
        assert handle.result(timeout=10) == [1, 2, "o"]
    assert app.store.pending_events("collect-1") == []


def test_duplicate_sends_with_a_dedupe_key_are_delivered_once(make_app: AppFactory) -> None:
    """A second send with the same ``dedupe_key`` is refused and the event arrives once."""
    app = make_app()

    @app.agent(name="once")
    async def once(run: perdure.Run) -> list[Any]:
        first = await run.wait_for("pay")
        second = await run.wait_for("pay", timeout=0.3)
        return [first, second]

    handle = app.options(object_id="once-1").start("once")
    assert app.send("once-1", "pay", {"n": 1}, dedupe_key="payment-1") is True
    assert app.send("once-1", "pay", {"n": 1}, dedupe_key="payment-1") is False
    assert handle.send("pay", {"n": 2}, dedupe_key="payment-1") is False
    with app.background_worker():
        assert handle.result(timeout=10) == [{"n": 1}, None]
    assert kinds(app, "once-1").count("event_received") == 1


def test_wait_for_times_out_with_none(make_app: AppFactory) -> None:
    """``wait_for(timeout=...)`` returns ``None`` once the timeout passes without the event."""
    app = make_app()

    @app.agent(name="impatient")
    async def impatient(run: perdure.Run) -> dict[str, Any]:
        began = await run.now()
        got = await run.wait_for("reply", timeout=0.4)
        ended = await run.now()
        return {"got": got, "waited": ended - began}

    handle = app.options(object_id="impatient-1").start("impatient")
    with app.background_worker():
        assert wait_until(lambda: handle.status() is perdure.Status.DORMANT)
        assert handle.info().waiting_event == "reply"
        result = handle.result(timeout=10)

    assert result["got"] is None
    assert result["waited"] >= 0.4
    assert "wait_timed_out" in kinds(app, "impatient-1")


def test_event_arriving_before_the_timeout_wins(make_app: AppFactory) -> None:
    """An event sent during a timed wait is returned instead of ``None``."""
    app = make_app()

    @app.agent(name="timed")
    async def timed(run: perdure.Run) -> Any:
        return await run.wait_for("reply", timeout=5)

    handle = app.options(object_id="timed-1").start("timed")
    with app.background_worker():
        assert wait_until(lambda: handle.info().waiting_event == "reply")
        app.send("timed-1", "reply", "yes")
        assert handle.result(timeout=3) == "yes"
    assert "wait_timed_out" not in kinds(app, "timed-1")


def test_many_dormant_objects_hold_no_worker_slots(make_app: AppFactory) -> None:
    """Dormant objects do not occupy the node: with 2 slots, 10 waiting objects all finish.

    If waiting held a slot, the node could never get to the events sent to the others.
    """
    app = make_app()

    @app.agent(name="slot")
    async def slot(run: perdure.Run, n: int) -> int:
        got = await run.wait_for("go")
        return int(got) + n

    handles = [app.options(object_id=f"slot-{n}").start("slot", n) for n in range(10)]
    with app.background_worker(concurrency=2):
        assert wait_until(lambda: all(h.info().waiting_event == "go" for h in handles))
        for h in handles:
            h.send("go", 100)
        assert [h.result(timeout=10) for h in handles] == [100 + n for n in range(10)]
