"""Replay checking: run today's code against recorded memory without running any step.

The same ``Run`` the node loop uses replays the memory; a command with a record
returns it, and the first command past the recorded history ends the check (the
object would carry on from there). A command that does not match what its
position recorded is the divergence a deploy would cause: reported with the
position, what was recorded and what the code asks for. Nothing is written.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from perdure.core.chain import Signer
from perdure.core.cycle import read_memory
from perdure.core.records import Record, RecordDraft
from perdure.engine.context import StepInfo
from perdure.engine.journal import Committer, Journal
from perdure.engine.run import DeadlineExceeded, Park, Run, Suspend, SyncRun
from perdure.errors import CancelRequestedError, NonDeterminismError, PerdureSignal
from perdure.stores.base import Event

__all__ = ["ReplayReport", "replay_check"]


class _ReplayEnd(PerdureSignal):
    """The replay reached the end of the recorded history."""


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """What replaying one object's memory against the current code found.

    ``verdict`` is ``compatible`` (the code reproduces the memory and would carry on),
    ``diverges`` (it asks for something else at ``position``), ``not-served`` (this
    code has no such agent/version) or ``error`` (the agent raised while replaying).
    """

    object_id: str
    agent: str
    version: str
    verdict: str
    detail: str
    position: int | str | None = None

    @property
    def ok(self) -> bool:
        """True unless the code diverges from memory or raised."""
        return self.verdict in ("compatible", "not-served")

    def __str__(self) -> str:
        return f"{self.object_id} ({self.agent}@{self.version}): {self.verdict}: {self.detail}"


class _ReplayJournal(Journal):
    """A journal that never writes: anything that would append ends the replay."""

    def defer(self, draft: RecordDraft, *, consume_event_ids: Sequence[int] = (),
              volatile: bool = True) -> None:
        """Deferred records are dropped: a replay writes nothing."""

    async def commit(self, drafts: Sequence[RecordDraft] = (), **_: Any) -> list[Record]:
        """The code went past recorded history: stop here."""
        raise _ReplayEnd


async def _no_events() -> list[Event]:
    return []


async def _never_run(info: StepInfo, fn: Any, args: Any, kwargs: Any) -> Any:
    raise _ReplayEnd


async def replay_check(agents: Mapping[str, Any], records: Sequence[Record]) -> ReplayReport:
    """Replay ``records`` (one object's memory) against ``agents`` (name -> AgentDef)."""
    facts = read_memory(records)
    intent = facts.intent
    oid = facts.context.object_id
    agent = agents.get(intent.agent)
    if agent is None or agent.version != intent.version:
        have = "not loaded" if agent is None else f"loaded at version {agent.version}"
        return ReplayReport(oid, intent.agent, intent.version, "not-served",
                            f"this code has agent {intent.agent!r} {have}")
    signer = Signer("replay-check", Ed25519PrivateKey.generate())
    head = records[-1]
    pool = concurrent.futures.ThreadPoolExecutor(1)
    journal = _ReplayJournal(
        object_id=oid, epoch=0, head_seq=head.seq, head_hash=head.hash, trace_id=head.trace_id,
        signer=signer, policy_ref="replay-check",
        committer=Committer(store=None, executor=pool),  # type: ignore[arg-type]
        clock=time.time, claimed_at=time.time(),
    )
    run = Run(journal=journal, intent=intent, context=facts.context, records=records,
              load_events=_no_events, step_executor=_never_run, clock=time.time)
    loop = asyncio.get_running_loop()
    try:
        if agent.is_async:
            await agent.fn(run, *intent.args, **intent.kwargs)
        else:
            sync = SyncRun(run, loop)
            await loop.run_in_executor(pool, lambda: agent.fn(sync, *intent.args,
                                                              **intent.kwargs))
        run.check_finished()
    except Park as park:
        err = park.error
        if not isinstance(err, NonDeterminismError):
            return ReplayReport(oid, intent.agent, intent.version, "compatible",
                                f"replays every recorded command; then it would park: {err}")
        return ReplayReport(oid, intent.agent, intent.version, "diverges",
                            f"at command #{err.position}: recorded {err.recorded}, "
                            f"code asks for {err.found}", err.position)
    except (_ReplayEnd, Suspend, DeadlineExceeded, CancelRequestedError):
        return ReplayReport(oid, intent.agent, intent.version, "compatible",
                            "replays every recorded command and would carry on from there")
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        return ReplayReport(oid, intent.agent, intent.version, "error",
                            f"the agent raised {type(exc).__name__}: {exc} while replaying")
    finally:
        pool.shutdown(wait=False)
    return ReplayReport(oid, intent.agent, intent.version, "compatible",
                        "replays to its recorded end")
