"""What a node is configured with: the agents it serves and how it works.

``AgentDef`` is one registered agent; ``WorkerSettings`` the node's knobs, checked as
they are built (a wrong one raises ``ConfigurationError`` at once).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from perdure.core.flow import Queue
from perdure.core.quotas import ModelQuota
from perdure.errors import ConfigurationError

if TYPE_CHECKING:
    from perdure.keys.data_keys import DataKeys
    from perdure.llm import PriceTable

__all__ = ["DRAIN_SECONDS", "AgentDef", "WorkerSettings"]

DRAIN_SECONDS = 20.0
"""How long a stopping node lets running steps finish and be recorded (``--drain``)."""


@dataclass(frozen=True, slots=True)
class AgentDef:
    """A registered agent: its name, code version, function and whether it is async."""

    name: str
    version: str
    fn: Callable[..., Any]
    is_async: bool
    requires: frozenset[str] = frozenset()
    #: Seal every payload of its objects (arguments, results, events, notes), not only
    #: the ``perdure.Secret`` values in them (``@app.agent(encrypt=True)``).
    encrypt: bool = False
    #: The updates its objects take (``App.define_update``): name -> validator (or None).
    updates: dict[str, Callable[..., Any] | None] = field(default_factory=dict, compare=False,
                                                          hash=False)


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """How a node works: objects at once, lease length, idle poll interval, drain time."""

    concurrency: int = 16
    lease_seconds: float = 30.0
    # How often an idle node looks for work where the store cannot push wake-ups here
    # (a folder beside a SQLite file that cannot be written, say); with pushes, its idle
    # safety look comes every max(idle_seconds, poll_interval).
    poll_interval: float = 0.1
    drain_seconds: float = DRAIN_SECONDS
    control_interval: float = 0.25
    idle_seconds: float = 2.0  # longest idle sleep when the store pushes wake-ups
    unknown_agent_retry: float = 5.0
    # Records this node keeps of the objects it ran, so that claiming one again reads
    # and checks only what was appended since (0 turns it off). Roughly 1 KB each.
    held_records: int = 50_000
    # The price table ``run.model`` costs calls with, unless a call brings its own.
    model_prices: PriceTable | None = None
    # The key-encryption keys that open and make objects' data keys (secrets at rest).
    data_keys: DataKeys | None = None
    # Log a WARNING when the event loop stalls longer than this (seconds; None: off).
    warn_stalls: float | None = None
    # The queues this node's App declares (perdure.core.flow): declared in the store as
    # the node starts; with any, an object's end wakes the node (a slot may be free).
    queues: tuple[Queue, ...] = ()
    # The model quotas this node's App declares (perdure.core.quotas): declared in the
    # store as the node starts; every node reserves by those the store holds.
    model_quotas: tuple[ModelQuota, ...] = ()

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ConfigurationError("concurrency must be at least 1")
        if self.held_records < 0:
            raise ConfigurationError("held_records must be 0 or more")
        if self.lease_seconds <= 0.2:
            raise ConfigurationError("lease_seconds must be more than 0.2")
        if not self.drain_seconds >= 0:
            raise ConfigurationError("drain_seconds must be 0 or more")
        if self.poll_interval <= 0:
            raise ConfigurationError("poll_interval must be positive")
