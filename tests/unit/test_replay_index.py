"""How a run indexes memory for replay: a step whose result is a position's only record
replays from the quick index, every other position from the full one, with the same
outcome either way."""

from __future__ import annotations

import asyncio
from typing import Any

from perdure.core.intent import Intent
from perdure.core.records import Kind, Record
from perdure.engine.replay import ReplayReport, replay_check
from perdure.engine.run import Run
from perdure.engine.worker import AgentDef
from tests.unit.builders import chain, instantiated


def _done(pos: int, name: str, result: Any) -> tuple[Kind, dict[str, Any]]:
    return (Kind.STEP_DONE, {"pos": pos, "cmd": "step", "name": name, "attempt": 1,
                             "latency": 0.0, "result": result})


def _failed(pos: int, name: str) -> tuple[Kind, dict[str, Any]]:
    return (Kind.STEP_FAILED, {"pos": pos, "cmd": "step", "name": name, "attempt": 1,
                               "error": {"type": "builtins:ValueError", "message": "no"},
                               "final": False})


def _memory(*drafts: tuple[Kind, dict[str, Any]]) -> list[Record]:
    return chain(list(drafts), first=instantiated(Intent(agent="probe", version="1")))


def _replay(records: list[Record], names: list[str], seen: list[Any]) -> ReplayReport:
    async def probe(run: Run) -> None:
        for name in names:
            seen.append(await run.step(lambda: "new", name=name))

    agents = {"probe": AgentDef("probe", "1", probe, True)}
    return asyncio.run(replay_check(agents, records))


def test_lone_results_and_retried_positions_replay_alike() -> None:
    """Lone results (quick index), a result after a failure and a list result (full
    index) all come back as recorded; the replay then carries on."""
    records = _memory(_done(0, "a", 1), _failed(1, "b"), _done(1, "b", [2, 3]),
                      _done(2, "c", {"k": 4}))
    seen: list[Any] = []
    report = _replay(records, ["a", "b", "c", "d"], seen)
    assert report.verdict == "compatible", report
    assert seen == [1, [2, 3], {"k": 4}]


def test_a_renamed_step_at_a_lone_result_diverges() -> None:
    """Code asking for another step where memory holds a lone result is caught."""
    seen: list[Any] = []
    report = _replay(_memory(_done(0, "a", 1), _done(1, "b", 2)), ["a", "x"], seen)
    assert (report.verdict, report.position) == ("diverges", 1)
    assert "step('b')" in report.detail and "step('x')" in report.detail
    assert seen == [1]


def test_returning_before_a_lone_result_diverges() -> None:
    """Code that ends while memory still holds a step's lone result is caught, naming it."""
    seen: list[Any] = []
    report = _replay(_memory(_done(0, "a", 1), _done(1, "b", 2)), ["a"], seen)
    assert report.verdict == "diverges"
    assert "step('b') at #1" in report.detail


def test_a_record_after_a_lone_result_moves_the_position_to_the_full_index() -> None:
    """A second record at a position that held only a result: the position is replayed
    from both records (the first result wins, as it always did)."""
    records = _memory(_done(0, "a", 1), _done(0, "a", 99), _done(1, "b", 2))
    seen: list[Any] = []
    assert _replay(records, ["a", "b"], seen).verdict == "compatible"
    assert seen == [1, 2]
