"""perdure: durable agents as persistent executable objects.

Each agent run is an object that carries its intent, context and a signed,
hash-chained memory. Any node sharing the store can pick it up and carry it
forward from exactly where it was.
"""

from __future__ import annotations

from perdure import _interrupt  # noqa: F401 - first: a Ctrl-C while the rest loads is one line
from perdure.app import App, step
from perdure.core.approvals import PendingApproval
from perdure.core.backoff import ErrorClass, RetryPolicy
from perdure.core.chain import Signer, VerifyReport
from perdure.core.constraints import Constraint, OneOf, PathPrefix, Range, UrlHost
from perdure.core.cycle import Action, Decision, LocalPolicy, ObjectView, ReasonCode, evaluate
from perdure.core.gate import Allow, GateDecision, Policy, Proposal, ToolInfo
from perdure.core.intent import Context, Intent
from perdure.core.lifecycle import Phase, Status
from perdure.core.questions import Question
from perdure.core.records import Kind, Record
from perdure.core.secret import Secret
from perdure.core.trust import Certificate, KeyRing, Revocation
from perdure.core.usage import UsageTotals
from perdure.engine.commands.agent_loop import AgentResult
from perdure.engine.commands.tools import ToolOutcome
from perdure.engine.context import StepInfo, current_step
from perdure.engine.replay import ReplayReport
from perdure.engine.run import ChildHandle, ChildStarter, Run, SyncChildHandle, SyncRun
from perdure.engine.sync_run import SyncChildStarter
from perdure.engine.worker import AgentDef, Worker
from perdure.errors import (
    AgentCancelledError,
    AgentFailedError,
    AgentParkedError,
    ApprovalError,
    ApprovalExpiredError,
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
    ResourceError,
    ResourceStaleError,
    ResultTimeoutError,
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
)
from perdure.follow import StreamEvent
from perdure.handle import Handle
from perdure.info import ObjectInfo
from perdure.keys.anchors import HeadAnchors
from perdure.keys.data_keys import DataKeys
from perdure.keys.folder import KeyFolder
from perdure.keys.identity import NodeIdentity
from perdure.keys.verifier import Verifier
from perdure.queries import MemoryView
from perdure.starting import Starter
from perdure.stores.base import Store
from perdure.tools import Tool, tool

__version__ = "0.1.0"

__all__ = [
    "Action",
    "AgentCancelledError",
    "AgentDef",
    "AgentFailedError",
    "AgentParkedError",
    "AgentResult",
    "Allow",
    "App",
    "ApprovalError",
    "ApprovalExpiredError",
    "CancelRequestedError",
    "CannotDo",
    "CannotRestoreError",
    "Certificate",
    "ChildFailedError",
    "ChildHandle",
    "ChildStarter",
    "ConfigurationError",
    "Constraint",
    "Context",
    "DataKeyError",
    "DataKeys",
    "Decision",
    "DescriptorVersionError",
    "ErrorClass",
    "ForkError",
    "GateDecision",
    "Handle",
    "HeadAnchors",
    "IntegrityError",
    "Intent",
    "KeyFolder",
    "KeyRing",
    "Kind",
    "LeaseLostError",
    "LocalPolicy",
    "MemoryView",
    "NodeIdentity",
    "NodeIdentityError",
    "NodeLacksError",
    "NonDeterminismError",
    "NotParkedError",
    "ObjectConflictError",
    "ObjectInfo",
    "ObjectNotFoundError",
    "ObjectTerminatedError",
    "ObjectView",
    "OneOf",
    "PathPrefix",
    "PendingApproval",
    "PerdureError",
    "PerdureSignal",
    "Phase",
    "Policy",
    "Proposal",
    "QueryFailedError",
    "Question",
    "Range",
    "ReasonCode",
    "Record",
    "RecordDecodeError",
    "ReplayReport",
    "ResourceError",
    "ResourceStaleError",
    "ResultTimeoutError",
    "RetryPolicy",
    "Revocation",
    "Run",
    "SealBrokenError",
    "Secret",
    "SerializationError",
    "Signer",
    "Starter",
    "Status",
    "StepFailedError",
    "StepInDoubtError",
    "StepInfo",
    "StepTimeoutError",
    "Store",
    "StoreCorruptError",
    "StoreError",
    "StreamEvent",
    "SyncChildHandle",
    "SyncChildStarter",
    "SyncRun",
    "Tool",
    "ToolCallError",
    "ToolInfo",
    "ToolOutcome",
    "UnknownAgentError",
    "UnknownQueryError",
    "UrlHost",
    "UsageTotals",
    "Verifier",
    "VerifyReport",
    "Worker",
    "__version__",
    "current_step",
    "evaluate",
    "step",
    "tool",
]
