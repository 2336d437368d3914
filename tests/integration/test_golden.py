"""Golden memory logs: memory recorded by earlier code must replay under today's code.

``tests/golden/*.json`` hold real memory (written by ``tests/golden/record.py`` on
a SQLite store) of the agents in ``tests/golden/agents.py``: completed objects and
objects left dormant mid-way, children included. Every log is rebuilt into
``Record`` objects and replayed with ``replay_check`` against the current code;
a change that would park a live object with such memory fails here first.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import perdure
from perdure.core.chain import verify_chain
from perdure.engine.replay import ReplayReport, replay_check
from perdure.engine.worker import AgentDef
from tests.golden import agents
from tests.golden.logs import GoldenLog, golden_files, load_log
from tests.golden.record import SCENARIO, record

LOGS = [load_log(path) for path in golden_files()]


def _check(definitions: dict[str, AgentDef] | Any, log: GoldenLog) -> ReplayReport:
    return asyncio.run(replay_check(definitions, log.records))


def _log(object_id: str) -> GoldenLog:
    return next(log for log in LOGS if log.object_id == object_id)


def test_the_golden_set_covers_every_agent_and_command() -> None:
    """The logs are there, span every golden agent, and hold every kind of command record."""
    assert len(LOGS) >= len(SCENARIO)
    assert {log.agent for log in LOGS} == set(agents.app.agents)
    assert {log.status for log in LOGS} == {"completed", "dormant"}
    kinds = {str(rec.kind) for log in LOGS for rec in log.records}
    assert kinds >= {"instantiated", "step_done", "step_failed", "value", "dormant", "woke",
                     "event_received", "intent_refined", "patched", "delegated",
                     "child_finished", "progress", "terminated"}
    positions = {rec.body.get("pos") for log in LOGS for rec in log.records}
    assert any(isinstance(pos, str) for pos in positions), "no gather branch positions"


@pytest.mark.parametrize("log", LOGS, ids=[log.object_id for log in LOGS])
def test_golden_log_is_intact(log: GoldenLog) -> None:
    """The rebuilt records are exactly the recorded ones: chain and signatures verify."""
    report = verify_chain(log.object_id, log.records, log.public_keys)
    assert report.ok, report


@pytest.mark.parametrize("log", LOGS, ids=[log.object_id for log in LOGS])
def test_golden_log_replays_under_current_code(log: GoldenLog) -> None:
    """Today's agents reproduce every recorded command of every golden log."""
    report = _check(agents.app.agents, log)
    assert report.verdict == "compatible", str(report)
    assert (report.agent, report.version) == (log.agent, log.version)


def _changed_app() -> perdure.App:
    """The golden agents with deliberate, unversioned changes at recorded positions."""
    app = perdure.App(store="sqlite:///never-opened.db")
    for name, definition in agents.app.agents.items():
        if name not in ("steps", "composer", "sleeper", "refiner"):
            app.agent(name=name, version=definition.version)(definition.fn)

    @app.agent(name="steps", version="1")
    async def steps(run: perdure.Run, source: str) -> Any:
        await run.step(agents.fetch, source, name="fetch_pages")  # renamed at #0
        return None

    @app.agent(name="composer", version="1")
    async def composer(run: perdure.Run, n: int) -> Any:
        first = await run.delegate(agents.square_child, n)
        second = await run.delegate(agents.square_child, n + 1)
        await run.join(first, second)
        handle = await run.delegate(agents.square_child, n + 2)
        return await run.gather(run.step(agents.square, n, name="renamed_branch"), handle)

    @app.agent(name="sleeper", version="1")
    async def sleeper(run: perdure.Run) -> None:
        await run.step(agents.square, 3)
        await run.wait_for("wake")  # was run.sleep at #1

    @app.agent(name="refiner", version="1")
    async def refiner(run: perdure.Run, goal: str) -> int:
        return int(await run.step(agents.square, 2))  # returns with more in memory

    return app


@pytest.mark.parametrize(
    ("object_id", "position", "recorded", "found"),
    [
        ("steps-done", 0, "step('fetch')", "step('fetch_pages')"),
        ("steps-waiting", 0, "step('fetch')", "step('fetch_pages')"),
        ("composer", "4.0.0", "step('branch_step')", "step('renamed_branch')"),
        ("sleeper", 1, "sleep(None)", "wait('wake')"),
        ("refiner-done", 1, "wait('done') at #4", "the agent returning"),
    ],
)
def test_changed_code_is_reported_as_diverging(object_id: str, position: int | str,
                                              recorded: str, found: str) -> None:
    """A renamed step, a changed command or an early return: where, and recorded vs found."""
    report = _check(_changed_app().agents, _log(object_id))
    assert report.verdict == "diverges", str(report)
    assert not report.ok
    assert report.position == position
    assert f"recorded {recorded}" in report.detail
    assert f"code asks for {found}" in report.detail


def test_unchanged_agents_stay_compatible_next_to_changed_ones() -> None:
    """Only the logs of changed agents diverge; the rest still replay."""
    app = _changed_app()
    changed = {"steps", "composer", "sleeper", "refiner"}
    for log in LOGS:
        if log.agent not in changed:
            assert _check(app.agents, log).verdict == "compatible", log.object_id


def test_a_new_version_does_not_serve_old_memory() -> None:
    """Bumping the version is how an incompatible change ships: old memory is not-served."""
    app = perdure.App(store="sqlite:///never-opened.db")
    app.agent(name="steps", version="2")(agents.steps)
    report = _check(app.agents, _log("steps-done"))
    assert report.verdict == "not-served"
    assert report.ok
    assert "loaded at version 2" in report.detail


def test_recording_again_gives_the_same_objects_and_they_replay(tmp_path: Path) -> None:
    """``record.py`` still works, yields the committed set of objects, all compatible.

    Record kinds may differ between recordings (a child may finish before or after
    its parent waits for it), so only objects, statuses and verdicts are compared.
    """
    written = record(tmp_path)
    assert sorted(p.name for p in written) == sorted(log.path.name for log in LOGS)
    for path in written:
        fresh = load_log(path)
        assert fresh.status == _log(fresh.object_id).status
        assert _check(agents.app.agents, fresh).verdict == "compatible", fresh.object_id
