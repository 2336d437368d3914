"""Replay checking: run today's code against recorded memory without running any step.

The same ``Run`` the node loop uses replays the memory, and the agent is invoked the
same way (``engine.invoke.invoke``), through a read-only ``Journal``: a command with a
record returns it, and the first command past the recorded history (the first write,
or a step with no result recorded) ends the check with ``HistoryEnd`` (the object
would carry on from there). A command that does not match what its
position recorded is the divergence a deploy would cause: reported with the
position, what was recorded and what the code asks for. Nothing is written.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from perdure.core.chain import Signer
from perdure.core.cycle import read_memory
from perdure.core.records import Record
from perdure.core.sealing import marked
from perdure.engine.code_threads import CodeThreads
from perdure.engine.context import StepInfo
from perdure.engine.invoke import invoke, served
from perdure.engine.journal import HistoryEnd, Journal
from perdure.engine.run import DeadlineExceeded, Park, Run, Suspend
from perdure.engine.settings import AgentDef
from perdure.errors import (
    CancelRequestedError,
    DataKeyError,
    NonDeterminismError,
    SealBrokenError,
)
from perdure.keys.sealer import Sealer
from perdure.stores.base import Event

__all__ = ["ReplayReport", "replay_check"]


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """What replaying one object's memory against the current code found.

    ``verdict`` is ``compatible`` (the code reproduces the memory and would carry on),
    ``diverges`` (it asks for something else at ``position``), ``not-served`` (this
    code has no such agent/version) or ``error`` (the agent raised while replaying).
    A divergence also says what memory ``recorded`` at ``position`` and what the code
    asks for there (``found``).
    """

    object_id: str
    agent: str
    version: str
    verdict: str
    detail: str
    position: int | str | None = None
    recorded: str | None = None
    found: str | None = None

    @property
    def ok(self) -> bool:
        """True unless the code diverges from memory or raised."""
        return self.verdict in ("compatible", "not-served")

    def __str__(self) -> str:
        return f"{self.object_id} ({self.agent}@{self.version}): {self.verdict}: {self.detail}"


async def _no_events() -> list[Event]:
    return []


async def _never_run(info: StepInfo, fn: Any, args: Any, kwargs: Any) -> Any:
    raise HistoryEnd(info.object_id)  # a step with no result recorded: past the history


async def replay_check(agents: Mapping[str, AgentDef], records: Sequence[Record],
                       sealer: Sealer | None = None) -> ReplayReport:
    """Replay ``records`` (one object's memory) against ``agents`` (name -> AgentDef);
    ``sealer`` opens sealed values first (without it they stay sealed)."""
    facts = read_memory(records)
    intent = facts.intent
    oid = facts.context.object_id
    agent = served(agents, intent)
    if agent is None:
        loaded = agents.get(intent.agent)
        have = "not loaded" if loaded is None else f"loaded at version {loaded.version}"
        return ReplayReport(oid, intent.agent, intent.version, "not-served",
                            f"this code has agent {intent.agent!r} {have}")
    if sealer is not None and any(marked(rec.body_bytes) for rec in records):
        try:
            records = sealer.open_records(records)
            intent = dataclasses.replace(intent, args=tuple(sealer.open(list(intent.args))),
                                         kwargs=sealer.open(intent.kwargs))
        except (DataKeyError, SealBrokenError) as exc:
            return ReplayReport(oid, intent.agent, intent.version, "not-served",
                                f"its sealed values cannot be opened here: {exc}")
    signer = Signer("replay-check", Ed25519PrivateKey.generate())
    journal = Journal.read_only(records, object_id=oid, signer=signer, policy_ref="replay-check")
    run = Run(journal=journal, intent=intent, context=facts.context, records=records,
              load_events=_no_events, step_executor=_never_run, clock=time.time)
    pool = CodeThreads(1, "perdure-replay")
    try:
        await invoke(agent, run, pool)
    except Park as park:
        err = park.error
        if not isinstance(err, NonDeterminismError):
            return ReplayReport(oid, intent.agent, intent.version, "compatible",
                                f"replays every recorded command; then it would park: {err}")
        return ReplayReport(oid, intent.agent, intent.version, "diverges",
                            f"at command #{err.position}: recorded {err.recorded}, "
                            f"code asks for {err.found}", err.position, err.recorded,
                            err.found)
    except (HistoryEnd, Suspend, DeadlineExceeded, CancelRequestedError):
        return ReplayReport(oid, intent.agent, intent.version, "compatible",
                            "replays every recorded command and would carry on from there")
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        said = str(exc) if sealer is None else str(sealer.redact(str(exc)))
        return ReplayReport(oid, intent.agent, intent.version, "error",
                            f"the agent raised {type(exc).__name__}: {said} while replaying")
    finally:
        pool.shutdown()
    return ReplayReport(oid, intent.agent, intent.version, "compatible",
                        "replays to its recorded end")
