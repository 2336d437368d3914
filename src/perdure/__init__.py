"""perdure: durable agents as persistent executable objects.

Each agent run is an object that carries its intent, context and a signed,
hash-chained memory. Any node sharing the store can pick it up and carry it
forward from exactly where it was.
"""

from __future__ import annotations

from perdure._keys import KeyFolder
from perdure.app import App, step
from perdure.core.backoff import ErrorClass, RetryPolicy
from perdure.core.chain import VerifyReport
from perdure.core.cycle import Action, Decision, LocalPolicy, ObjectView, evaluate
from perdure.core.intent import Context, Intent
from perdure.core.lifecycle import Phase, Status
from perdure.core.records import Kind, Record
from perdure.engine.context import StepInfo, current_step
from perdure.engine.run import ChildHandle, Run, SyncChildHandle, SyncRun
from perdure.errors import (
    AgentCancelledError,
    AgentFailedError,
    AgentParkedError,
    CancelRequestedError,
    CannotDo,
    ChildFailedError,
    ConfigurationError,
    IntegrityError,
    LeaseLostError,
    NodeIdentityError,
    NonDeterminismError,
    ObjectConflictError,
    ObjectNotFoundError,
    ObjectTerminatedError,
    PerdureError,
    PerdureSignal,
    RecordDecodeError,
    ResultTimeoutError,
    SerializationError,
    StepFailedError,
    StepInDoubtError,
    StoreCorruptError,
    StoreError,
    UnknownAgentError,
)
from perdure.handle import Handle, ObjectInfo

__version__ = "0.1.0"

__all__ = [
    "Action",
    "AgentCancelledError",
    "AgentFailedError",
    "AgentParkedError",
    "App",
    "CancelRequestedError",
    "CannotDo",
    "ChildFailedError",
    "ChildHandle",
    "ConfigurationError",
    "Context",
    "Decision",
    "ErrorClass",
    "Handle",
    "IntegrityError",
    "Intent",
    "KeyFolder",
    "Kind",
    "LeaseLostError",
    "LocalPolicy",
    "NodeIdentityError",
    "NonDeterminismError",
    "ObjectConflictError",
    "ObjectInfo",
    "ObjectNotFoundError",
    "ObjectTerminatedError",
    "ObjectView",
    "PerdureError",
    "PerdureSignal",
    "Phase",
    "Record",
    "RecordDecodeError",
    "ResultTimeoutError",
    "RetryPolicy",
    "Run",
    "SerializationError",
    "Status",
    "StepFailedError",
    "StepInDoubtError",
    "StepInfo",
    "StoreCorruptError",
    "StoreError",
    "SyncChildHandle",
    "SyncRun",
    "UnknownAgentError",
    "VerifyReport",
    "__version__",
    "current_step",
    "evaluate",
    "step",
]
