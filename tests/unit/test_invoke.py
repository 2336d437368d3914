"""One way to run an agent against memory: ``invoke``, through a journal that may be read-only.

A read-only journal (what the replay checker runs through) writes nothing by design: it
has no committer, queues what a run defers, and refuses a commit with ``HistoryEnd``.
``invoke`` runs ``async def`` and plain ``def`` agents alike, for the node and the
checker. No store is involved.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from perdure.core.intent import Context, Intent
from perdure.core.lifecycle import Status
from perdure.core.records import Kind, Record, RecordDraft
from perdure.engine import replay
from perdure.engine.code_threads import CodeThreads
from perdure.engine.context import StepInfo
from perdure.engine.invoke import invoke, served
from perdure.engine.journal import HistoryEnd, Journal
from perdure.engine.run import Run, SyncRun
from perdure.engine.settings import AgentDef
from perdure.stores.base import Event
from tests.unit.builders import OBJECT_ID, chain, instantiated, signer

INTENT = Intent(agent="probe", version="1", args=(2,))


def _memory(*drafts: tuple[Kind, dict[str, Any]]) -> list[Record]:
    return chain(list(drafts), first=instantiated(INTENT))


def _read_only(records: list[Record]) -> Journal:
    return Journal.read_only(records, object_id=OBJECT_ID, signer=signer(),
                             policy_ref="test", clock=lambda: 1.0)


async def _no_events() -> list[Event]:
    return []


async def _never(info: StepInfo, fn: Any, args: Any, kwargs: Any) -> Any:
    raise AssertionError("no step runs here")


def _run(records: list[Record]) -> Run:
    return Run(journal=_read_only(records), intent=INTENT,
               context=Context(object_id=OBJECT_ID, trace_id="trace-1"), records=records,
               load_events=_no_events, step_executor=_never)


def test_a_read_only_journal_stands_on_the_head() -> None:
    """It starts where the memory ends, with no committer and nothing queued."""
    records = _memory((Kind.PROGRESS, {"fields": {"n": 1}}))
    journal = _read_only(records)
    assert (journal.head_seq, journal.head_hash) == (2, records[-1].hash)
    assert journal.committer is None
    assert journal.trace_id == records[-1].trace_id
    assert journal.buffer == []


def test_a_read_only_journal_refuses_to_commit() -> None:
    """A commit raises ``HistoryEnd`` and leaves the head and the queue as they were."""
    records = _memory()
    journal = _read_only(records)
    journal.defer(RecordDraft(Kind.VALUE, {"pos": 0, "cmd": "now", "value": 1.0}))
    with pytest.raises(HistoryEnd):
        asyncio.run(journal.commit([RecordDraft(Kind.PROGRESS, {"fields": {}})],
                                   status=Status.DORMANT))
    assert (journal.head_seq, journal.head_hash) == (1, records[-1].hash)
    assert len(journal.buffer) == 1


def test_history_end_is_not_an_exception() -> None:
    """An agent's ``except Exception`` cannot swallow the end of the history."""
    assert not issubclass(HistoryEnd, Exception)


def test_served_needs_the_name_and_the_version() -> None:
    """An agent serves an intent only at the intent's version."""
    agent = AgentDef("probe", "1", lambda run: None, False)
    assert served({"probe": agent}, INTENT) is agent
    assert served({"probe": AgentDef("probe", "2", agent.fn, False)}, INTENT) is None
    assert served({}, INTENT) is None


@pytest.mark.parametrize("is_async", [True, False])
def test_invoke_runs_either_kind_of_agent_with_the_intent_arguments(is_async: bool) -> None:
    """``async def`` agents get the ``Run``, plain ``def`` ones a ``SyncRun``, both the
    intent's arguments; the result comes back as the agent returned it."""
    handed: list[Any] = []

    async def agent_async(run: Run, n: int) -> int:
        handed.append(run)
        return n * 21

    def agent_sync(run: SyncRun, n: int) -> int:
        handed.append(run)
        return n * 21

    agent = AgentDef("probe", "1", agent_async if is_async else agent_sync, is_async)
    run = _run(_memory())

    async def main() -> Any:
        threads = CodeThreads(1, "test-code")
        try:
            return await invoke(agent, run, threads)
        finally:
            threads.shutdown()

    assert asyncio.run(main()) == 42
    assert isinstance(handed[0], Run if is_async else SyncRun)


def test_the_checker_invokes_agents_as_the_node_does() -> None:
    """``replay_check`` runs the agent through ``invoke``, the node's own path."""
    assert replay.invoke is invoke
    calls: list[str] = []

    async def probe(run: Run, n: int) -> int:
        calls.append("ran")
        return await run.step(lambda: n, name="first")

    records = _memory((Kind.STEP_DONE, {"pos": 0, "cmd": "step", "name": "first",
                                        "attempt": 1, "latency": 0.0, "result": 2}))
    report = asyncio.run(replay.replay_check({"probe": AgentDef("probe", "1", probe, True)},
                                             records))
    assert (report.verdict, report.detail) == ("compatible", "replays to its recorded end")
    assert calls == ["ran"]
