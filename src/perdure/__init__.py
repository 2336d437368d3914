"""perdure: durable agents as persistent executable objects.

Each agent run is an object that carries its intent, context and a signed,
hash-chained memory. Any node sharing the store can pick it up and carry it
forward from exactly where it was.
"""

from __future__ import annotations

from perdure import _interrupt  # noqa: F401 - first: a Ctrl-C while the rest loads is one line
from perdure.aio import AsyncApp, AsyncHandle, AsyncStarter
from perdure.app import App, step
from perdure.core.approvals import PendingApproval
from perdure.core.backoff import ErrorClass, RetryPolicy
from perdure.core.chain import VerifyReport
from perdure.core.constraints import Constraint, OneOf, PathPrefix, Range, UrlHost
from perdure.core.cycle import LocalPolicy
from perdure.core.flow import Queue
from perdure.core.gate import Allow, Policy
from perdure.core.intent import Context, Intent
from perdure.core.lifecycle import Phase, Status
from perdure.core.questions import Question
from perdure.core.quotas import ModelQuota
from perdure.core.records import Kind, Record
from perdure.core.schedules import ScheduleInfo, ScheduleSpec
from perdure.core.secret import Secret
from perdure.core.usage import UsageTotals
from perdure.engine import (
    AgentResult,
    ChildHandle,
    ChildStarter,
    ReplayReport,
    Run,
    StepInfo,
    SyncChildHandle,
    SyncChildStarter,
    SyncRun,
    ToolOutcome,
    current_step,
)
from perdure.errors import (
    AgentCancelledError,
    AgentFailedError,
    AgentParkedError,
    ApprovalError,
    ApprovalExpiredError,
    BlockedError,
    CancelRequestedError,
    CannotDo,
    CannotRestoreError,
    ChildFailedError,
    ConfigurationError,
    DataKeyError,
    DescriptorVersionError,
    ForkError,
    IntegrityError,
    LeaseLostError,
    NodeIdentityError,
    NodeLacksError,
    NonDeterminismError,
    NotParkedError,
    ObjectConflictError,
    ObjectNotFoundError,
    ObjectTerminatedError,
    PerdureError,
    PerdureSignal,
    QueryFailedError,
    RecordDecodeError,
    ReplayFailedError,
    ResourceError,
    ResourceStaleError,
    ResultTimeoutError,
    ScheduleError,
    SealBrokenError,
    SerializationError,
    StepFailedError,
    StepInDoubtError,
    StepTimeoutError,
    StoreCorruptError,
    StoreError,
    ToolCallError,
    UnknownAgentError,
    UnknownQueryError,
    UnknownQueueError,
    UnknownUpdateError,
    UpdateFailedError,
    UpdateRefusedError,
    WebhookRefusedError,
)
from perdure.follow import StreamEvent
from perdure.handle import Handle
from perdure.info import ObjectInfo
from perdure.keys.data_keys import DataKeys
from perdure.keys.folder import KeyFolder
from perdure.queries import MemoryView
from perdure.schedules import ScheduleHandle
from perdure.starting import Starter
from perdure.tools import Tool, tool

__version__ = "0.1.0"

__all__ = [
    "AgentCancelledError",
    "AgentFailedError",
    "AgentParkedError",
    "AgentResult",
    "Allow",
    "App",
    "ApprovalError",
    "ApprovalExpiredError",
    "AsyncApp",
    "AsyncHandle",
    "AsyncStarter",
    "BlockedError",
    "CancelRequestedError",
    "CannotDo",
    "CannotRestoreError",
    "ChildFailedError",
    "ChildHandle",
    "ChildStarter",
    "ConfigurationError",
    "Constraint",
    "Context",
    "DataKeyError",
    "DataKeys",
    "DescriptorVersionError",
    "ErrorClass",
    "ForkError",
    "Handle",
    "IntegrityError",
    "Intent",
    "KeyFolder",
    "Kind",
    "LeaseLostError",
    "LocalPolicy",
    "MemoryView",
    "ModelQuota",
    "NodeIdentityError",
    "NodeLacksError",
    "NonDeterminismError",
    "NotParkedError",
    "ObjectConflictError",
    "ObjectInfo",
    "ObjectNotFoundError",
    "ObjectTerminatedError",
    "OneOf",
    "PathPrefix",
    "PendingApproval",
    "PerdureError",
    "PerdureSignal",
    "Phase",
    "Policy",
    "QueryFailedError",
    "Question",
    "Queue",
    "Range",
    "Record",
    "RecordDecodeError",
    "ReplayFailedError",
    "ReplayReport",
    "ResourceError",
    "ResourceStaleError",
    "ResultTimeoutError",
    "RetryPolicy",
    "Run",
    "ScheduleError",
    "ScheduleHandle",
    "ScheduleInfo",
    "ScheduleSpec",
    "SealBrokenError",
    "Secret",
    "SerializationError",
    "Starter",
    "Status",
    "StepFailedError",
    "StepInDoubtError",
    "StepInfo",
    "StepTimeoutError",
    "StoreCorruptError",
    "StoreError",
    "StreamEvent",
    "SyncChildHandle",
    "SyncChildStarter",
    "SyncRun",
    "Tool",
    "ToolCallError",
    "ToolOutcome",
    "UnknownAgentError",
    "UnknownQueryError",
    "UnknownQueueError",
    "UnknownUpdateError",
    "UpdateFailedError",
    "UpdateRefusedError",
    "UrlHost",
    "UsageTotals",
    "VerifyReport",
    "WebhookRefusedError",
    "__version__",
    "current_step",
    "step",
    "tool",
]
