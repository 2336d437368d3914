"""Non-determinism: code that no longer matches its recorded history parks the object."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

import perdure
from tests.integration.engine_support import kinds, wait_until

AppFactory = Callable[..., perdure.App]


def _shop_v1(app: perdure.App, calls: Counter[str]) -> None:
    """The original code: pick, wait for ``go``, pay."""

    def pick(item: str) -> str:
        calls["pick"] += 1
        return f"picked {item}"

    def pay(what: str) -> str:
        calls["pay"] += 1
        return f"paid for {what}"

    @app.agent(name="shop")
    async def shop(run: perdure.Run, item: str) -> str:
        picked = await run.step(pick, item, name="pick")
        await run.wait_for("go")
        return await run.step(pay, picked, name="pay")


def _shop_renamed(app: perdure.App, calls: Counter[str]) -> None:
    """A change that breaks replay: a different step name at recorded position 0."""

    def choose(item: str) -> str:
        calls["choose"] += 1
        return f"chose {item}"

    @app.agent(name="shop")
    async def shop(run: perdure.Run, item: str) -> str:
        chosen = await run.step(choose, item, name="choose")
        await run.wait_for("go")
        return chosen


def _run_v1_until_waiting(make_app: AppFactory, object_id: str) -> perdure.App:
    first = make_app()
    calls: Counter[str] = Counter()
    _shop_v1(first, calls)
    first.options(object_id=object_id).start("shop", "apple")
    with first.background_worker():
        assert wait_until(lambda: first.get(object_id).waiting_event == "go")
    assert calls == Counter({"pick": 1})
    return first


def test_mismatch_parks_without_looping_until_resumed(make_app: AppFactory) -> None:
    """A step renamed at a recorded position parks the object with a clear record.

    The ``nondeterminism`` record names the position, what was recorded and what the
    code asked for; the object is not claimed again (no new records for a second);
    ``result()`` raises ``AgentParkedError``; with the code fixed, ``resume`` lets it finish.
    """
    _run_v1_until_waiting(make_app, "shop-1")

    broken = make_app()
    broken_calls: Counter[str] = Counter()
    _shop_renamed(broken, broken_calls)
    broken.send("shop-1", "go")
    with broken.background_worker():
        assert wait_until(lambda: broken.get("shop-1").status is perdure.Status.PARKED)
        parked = broken.get("shop-1")
        time.sleep(1.0)
        later = broken.get("shop-1")
        assert later.records == parked.records, "a parked object takes no new records"
        assert later.epoch == parked.epoch, "a parked object is not claimed again"
        assert later.status is perdure.Status.PARKED and later.lease_owner is None
        with pytest.raises(perdure.AgentParkedError, match="resume"):
            broken.handle("shop-1").result(timeout=2)

    assert broken_calls == Counter(), "the mismatching step body never ran"
    record = broken.history("shop-1")[-1]
    assert record.kind == perdure.Kind.NONDETERMINISM
    assert record.body["position"] == 0
    assert record.body["recorded"] == "step('pick')"
    assert record.body["found"] == "step('choose')"
    assert "#0" in record.body["reason"]
    assert parked.note is not None and "step('pick')" in parked.note

    fixed = make_app()
    fixed_calls: Counter[str] = Counter()
    _shop_v1(fixed, fixed_calls)
    assert fixed.resume("shop-1").status is not perdure.Status.PARKED
    with fixed.background_worker():
        assert fixed.handle("shop-1").result(timeout=10) == "paid for picked apple"
    assert fixed_calls == Counter({"pay": 1})
    assert fixed.verify("shop-1").ok


def test_changed_command_kind_at_a_position_parks(make_app: AppFactory) -> None:
    """A ``sleep`` where memory recorded a ``step`` is a mismatch too."""
    _run_v1_until_waiting(make_app, "shop-2")

    changed = make_app()

    @changed.agent(name="shop")
    async def shop(run: perdure.Run, item: str) -> str:
        await run.sleep(0.01)
        return item

    changed.send("shop-2", "go")
    with changed.background_worker(), pytest.raises(perdure.AgentParkedError):
        changed.handle("shop-2").result(timeout=10)
    body = changed.history("shop-2")[-1].body
    assert (body["position"], body["recorded"], body["found"]) == (0, "step('pick')",
                                                                    "sleep(None)")


def test_agent_returning_before_recorded_commands_parks(make_app: AppFactory) -> None:
    """Code that ends before the commands memory holds is parked, not completed."""
    _run_v1_until_waiting(make_app, "shop-3")

    shorter = make_app()

    def pick(item: str) -> str:
        return f"picked {item}"

    @shorter.agent(name="shop")
    async def shop(run: perdure.Run, item: str) -> str:
        return await run.step(pick, item, name="pick")

    shorter.send("shop-3", "go")
    with shorter.background_worker(), pytest.raises(perdure.AgentParkedError):
        shorter.handle("shop-3").result(timeout=10)
    body = shorter.history("shop-3")[-1].body
    assert body["position"] == 1
    assert body["found"] == "the agent returning"


def test_new_steps_and_changed_bodies_need_no_operator(make_app: AppFactory) -> None:
    """Changing a recorded step's body and adding steps after the last record just work.

    The recorded step keeps its recorded result (its new body does not run); the new
    steps run normally and the object completes without being parked.
    """
    _run_v1_until_waiting(make_app, "shop-4")

    evolved = make_app()
    calls: Counter[str] = Counter()

    def pick(item: str) -> str:
        calls["pick"] += 1
        return f"PICKED {item.upper()} (new body)"

    def pay(what: str) -> str:
        calls["pay"] += 1
        return f"paid for {what}"

    def receipt(paid: str) -> dict[str, Any]:
        calls["receipt"] += 1
        return {"receipt": paid}

    @evolved.agent(name="shop")
    async def shop(run: perdure.Run, item: str) -> dict[str, Any]:
        picked = await run.step(pick, item, name="pick")
        await run.wait_for("go")
        paid = await run.step(pay, picked, name="pay")
        await run.sleep(0.01)
        return await run.step(receipt, paid, name="receipt")

    evolved.send("shop-4", "go")
    with evolved.background_worker():
        result = evolved.handle("shop-4").result(timeout=10)

    assert result == {"receipt": "paid for picked apple"}
    assert calls == Counter({"pay": 1, "receipt": 1})
    assert "nondeterminism" not in kinds(evolved, "shop-4")


def _tick(i: int) -> int:
    return i


def _tock(i: int) -> int:
    return -i


@perdure.step(name="tally")
def _named(i: int) -> int:
    return i * 10


def _loop_agent(app: perdure.App, fns: tuple[Callable[[int], int], ...]) -> None:
    """The ``loop`` agent: step ``fns[i](i)`` for each i, unnamed, then wait for ``go``."""

    @app.agent(name="loop")
    async def loop(run: perdure.Run) -> list[int]:
        got = [await run.step(fn, i) for i, fn in enumerate(fns)]
        await run.wait_for("go")
        return got


def test_unnamed_steps_in_a_loop_replay_by_function_and_catch_a_swapped_one(
        make_app: AppFactory) -> None:
    """Steps named after their function replay in a loop that switches functions; a
    later version that calls another function at a recorded position parks."""
    first = make_app()
    _loop_agent(first, (_tick, _tick, _tock, _named, _tick, _named))
    first.options(object_id="loop-1").start("loop")
    first.options(object_id="loop-2").start("loop")
    with first.background_worker():
        assert wait_until(lambda: all(first.get(o).waiting_event == "go"
                                      for o in ("loop-1", "loop-2")))
    steps = [r.body["name"] for r in first.history("loop-1") if r.kind == perdure.Kind.STEP_DONE]
    assert steps == ["_tick", "_tick", "_tock", "tally", "_tick", "tally"]

    first.send("loop-1", "go")
    with first.background_worker():
        assert first.handle("loop-1").result(timeout=10) == [0, 1, -2, 30, 4, 50]

    swapped = make_app()
    _loop_agent(swapped, (_tick, _tick, _tick, _named, _tick, _named))  # _tick for _tock
    swapped.send("loop-2", "go")
    with swapped.background_worker(), pytest.raises(perdure.AgentParkedError):
        swapped.handle("loop-2").result(timeout=10)
    body = swapped.history("loop-2")[-1].body
    assert (body["position"], body["recorded"], body["found"]) == (2, "step('_tock')",
                                                                    "step('_tick')")
