"""The engine: the only layer that runs agents' code.

A worker claims runnable objects, checks their memory, evaluates them and carries out
the action (``worker``, ``actions``); ``Run`` is what an agent is handed, one command
family per module under ``commands``; ``replay`` checks recorded memory against current
code through the same path. What an agent or an operator holds is exported here and,
most of it, from ``perdure`` itself.
"""

from __future__ import annotations

from perdure.engine.commands.agent_loop import AgentResult
from perdure.engine.commands.tools import ToolOutcome
from perdure.engine.context import StepInfo, current_step
from perdure.engine.replay import ReplayReport
from perdure.engine.run import ChildHandle, ChildStarter, Run, SyncChildHandle, SyncRun
from perdure.engine.settings import AgentDef
from perdure.engine.sync_run import SyncChildStarter
from perdure.engine.worker import Worker

__all__ = [
    "AgentDef",
    "AgentResult",
    "ChildHandle",
    "ChildStarter",
    "ReplayReport",
    "Run",
    "StepInfo",
    "SyncChildHandle",
    "SyncChildStarter",
    "SyncRun",
    "ToolOutcome",
    "Worker",
    "current_step",
]
