"""``App``: the one object a program builds to register agents, start them and run a node."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import dataclasses
import logging
import signal
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, overload

from perdure.aio import AsyncApp
from perdure.approvals import approvals as approvals_of
from perdure.approvals import decide as decide_on
from perdure.core.approvals import PendingApproval
from perdure.core.arguments import check_arguments, start_differences
from perdure.core.backoff import RetryPolicy
from perdure.core.chain import Signer, VerifyReport, check_links
from perdure.core.codec import MAX_DEPTH, encode
from perdure.core.cycle import LocalPolicy
from perdure.core.events import DEBOUNCED_START, REFINE_EVENT, is_reserved
from perdure.core.flow import Queue, debounce_column
from perdure.core.intent import Intent, budget_body
from perdure.core.lifecycle import Status
from perdure.core.names import check_labels, check_name, check_object_id
from perdure.core.questions import Question
from perdure.core.quotas import ModelQuota
from perdure.core.records import Kind, Record
from perdure.core.schedules import SCHEDULE_AGENT, ScheduleInfo, schedule_id
from perdure.core.sealing import check_reserved, marked
from perdure.core.trust import Certificate, Revocation
from perdure.core.usage import UsageTotals, usage_totals
from perdure.describe import waiting_note
from perdure.engine.instantiate import instantiate
from perdure.engine.replay import ReplayReport, replay_check
from perdure.engine.run import is_async
from perdure.engine.schedules import definition as schedule_definition
from perdure.engine.settings import DRAIN_SECONDS
from perdure.engine.worker import AgentDef, Worker, WorkerSettings
from perdure.errors import (
    ConfigurationError,
    IntegrityError,
    NotParkedError,
    ObjectConflictError,
    ObjectNotFoundError,
    StoreCorruptError,
    StoreError,
    UnknownAgentError,
)
from perdure.fork import fork as fork_object
from perdure.handle import Handle
from perdure.hooks import Hooks
from perdure.info import ObjectInfo, info_from_row
from perdure.keys.anchors import HeadAnchors
from perdure.keys.at_rest import (
    differences,
    opened_body,
    sealed_goal,
    sealed_payload,
    start_arguments,
)
from perdure.keys.client import Client, lookup_id, row_against_memory
from perdure.keys.data_keys import DataKeys
from perdure.keys.folder import default_key_dir
from perdure.keys.identity import NodeIdentity, TrustSpec, publish
from perdure.keys.sealer import Sealer, needs_sealing
from perdure.keys.verifier import Verifier
from perdure.memory_notes import MemoryNotes
from perdure.queries import QueryRegistry, run_query
from perdure.schedules import ScheduleHandle, create_schedule, list_schedules
from perdure.starting import Starter, starter
from perdure.stores import Store, open_store, redact_url
from perdure.stores.base import NodeInfo
from perdure.tools import Tool
from perdure.updates import declare as update_declare
from perdure.updates import send_update, wait_reply

if TYPE_CHECKING:
    from perdure.llm import PriceTable

__all__ = ["CORRUPT_RETRY_SECONDS", "App", "step"]

CORRUPT_RETRY_SECONDS = 30.0  # a worker on a damaged store checks it again this often

F = TypeVar("F", bound=Callable[..., Any])

log = logging.getLogger("perdure")


def step(
    *,
    name: str | None = None,
    idempotent: bool = True,
    retry: RetryPolicy | None = None,
    timeout: float | None = None,
) -> Callable[[F], F]:
    """Set a step function's defaults for ``run.step``: name, idempotency, retry policy,
    timeout of each attempt (seconds)."""

    def mark(fn: F) -> F:
        fn.__perdure_step__ = {"name": name, "idempotent": idempotent, "retry": retry,  # type: ignore[attr-defined]
                               "timeout": timeout}
        return fn

    return mark


class App:
    """A perdure application: a store, this node's identity, and registered agents.

    ``store`` is a URL (``sqlite:///agents.db``) or an open ``Store``. ``key_dir``
    holds the node's Ed25519 key pair (created on first use); by default ``keys``
    beside a SQLite store's database file, else ``~/.perdure/keys``. ``node_id`` is
    the name this node acts under; it must be one a trusted root certified its key
    under (by default the name in the folder's ``node.cert``, else
    ``hostname-keyfingerprint``, which a root kept in the folder certifies).

    ``trust`` names the root public keys whose certificates this node believes (keys,
    roots files or key folders; see ``docs/howto/keys-and-trust.md``); by default, the
    key folder's ``roots`` file, which on one machine is made on first use with a root
    of its own. ``key_passphrase`` opens a passphrase-protected node key.

    ``prices`` (a ``perdure.llm.PriceTable``) costs the model calls of this node's
    agents (``run.model``), unless a call brings its own table.

    ``data_keys`` (a ``perdure.DataKeys``, or a spec such as ``"env:PERDURE_DATA_KEY"``)
    holds the key-encryption keys that keep ``perdure.Secret`` values encrypted at
    rest; by default the ``data-keys`` folder in the key folder, whose first key is
    made on first use (see ``docs/howto/secrets.md``).

    ``clock`` is what this App and its workers read the time from (seconds since the
    epoch; default ``time.time``): timers, deadlines, approval deadlines, records'
    timestamps and ``run.now()`` all follow it. ``perdure.testing.Environment`` gives one
    it can skip ahead; certificates and credentials keep to the real time.

    ``open_sealed`` (an attribute, default ``True``): whether what this App reads back
    for its caller (results, queries, questions, followers) comes opened with its data
    keys. The command line sets it ``False`` (the CLI never opens, it prints
    ``<sealed>``); its dashboard (``perdure ui``) leaves it ``True``.
    """

    def __init__(
        self,
        store: str | Store = "sqlite:///perdure.db",
        *,
        node_id: str | None = None,
        key_dir: str | Path | None = None,
        policy: LocalPolicy | None = None,
        lease_seconds: float = 30.0,
        poll_interval: float = 0.1,
        capabilities: set[str] | frozenset[str] | None = None,
        trust: TrustSpec | None = None,
        key_passphrase: str | bytes | None = None,
        prices: PriceTable | None = None,
        data_keys: DataKeys | str | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if node_id is not None:
            check_object_id(node_id, "node id")
        self._trust = trust
        self._passphrase = (key_passphrase.encode() if isinstance(key_passphrase, str)
                            else key_passphrase)
        self._store_arg = store
        self._store: Store | None = None if isinstance(store, str) else store
        self._key_dir_arg = key_dir  # None: the default, which follows the store
        self._key_dir = (Path(key_dir) if key_dir is not None
                         else default_key_dir(store if isinstance(store, str) else store.url))
        self._data_keys_arg = data_keys
        #: The key-encryption keys of this node (secrets at rest; ``perdure.DataKeys``).
        if data_keys is not None and not isinstance(data_keys, str | DataKeys):
            raise ConfigurationError(
                f"data_keys is a perdure.DataKeys or a spec such as 'env:NAME', not "
                f"{type(data_keys).__name__}")
        self.data_keys = (DataKeys.parse(data_keys) if isinstance(data_keys, str)
                          else data_keys if data_keys is not None
                          else DataKeys.folder(self._key_dir / "data-keys"))
        self._node_id = node_id
        self._identity = NodeIdentity(self._key_dir, node_id=node_id, trust=trust,
                                      passphrase=self._passphrase)
        self._client: Client | None = None
        self.policy = policy or LocalPolicy()
        self.lease_seconds = lease_seconds
        self.poll_interval = poll_interval
        self.capabilities = frozenset(capabilities or ())
        self.prices = prices
        #: What this App and its workers take for the time now (seconds since the epoch):
        #: ``time.time`` unless given (``perdure.testing.Environment`` gives a clock it
        #: can skip ahead).
        self.clock: Callable[[], float] = clock if clock is not None else time.time
        self._agents: dict[str, AgentDef] = {}
        self._queries = QueryRegistry()  # queries declared for each agent (``define_query``)
        self._notes = MemoryNotes(self)  # what memory adds to ObjectInfo (questions, origin)
        self._tools: dict[str, Tool] = {}  # ``@app.tool``
        self._queues: dict[str, Queue] = {}  # ``app.queue``
        self._model_quotas: dict[tuple[str, str], ModelQuota] = {}  # ``app.model_quota``
        self._declared: set[str] = set()  # queues this App put in its store
        #: What this App's workers tell listeners: objects claimed, steps recorded,
        #: dormancy, wake-ups, ends, commits, lost leases, integrity failures (see
        #: ``perdure.hooks``). Nothing is built for them while nobody listens.
        self.hooks = Hooks()
        #: Whether readers open sealed values for the caller (see the class docstring).
        self.open_sealed = True
        self._lock = threading.RLock()
        self._aio: AsyncApp | None = None

    # -- wiring ---------------------------------------------------------------------

    @property
    def store(self) -> Store:
        """The open store (opened on first use)."""
        with self._lock:
            if self._store is None:
                assert isinstance(self._store_arg, str)
                self._store = open_store(self._store_arg)
            return self._store

    @property
    def store_url(self) -> str:
        """The store's URL with any password masked; does not open the store."""
        if self._store is not None:
            return self._store.url
        return redact_url(self._store_arg) if isinstance(self._store_arg, str) else "store"

    @property
    def aio(self) -> AsyncApp:
        """This App's awaitable caller side, for asyncio programs: ``await
        app.aio.start(...)``, ``await handle.result(...)`` (see ``perdure.aio``)."""
        with self._lock:
            if self._aio is None:
                self._aio = AsyncApp(self)
            return self._aio

    @property
    def signer(self) -> Signer:
        """This node's id and signing key (created on first use)."""
        return self._identity.signer()

    @property
    def trust_setting(self) -> TrustSpec | None:
        """The ``trust`` this App was given (``None``: its key folder's roots file)."""
        return self._trust

    @property
    def identity(self) -> NodeIdentity:
        """This node's key folder, trusted roots and certificate."""
        return self._identity

    @property
    def client(self) -> Client:
        """This node's side of objects it does not run: the store, its identity and data
        keys, signing events and checking memory (``perdure.keys.client``)."""
        with self._lock:
            if self._client is None:
                self._client = Client(self.store, self._identity, self.data_keys,
                                      clock=self.clock)
            return self._client

    @property
    def anchors(self) -> HeadAnchors:
        """The heads this node saw (its key folder's ``heads.db``), shared by its worker
        and ``verify``."""
        return self.client.anchors

    @property
    def verifier(self) -> Verifier:
        """What this node believes of the store (its trusted roots, cached keys)."""
        return self.client.verifier

    @property
    def node_id(self) -> str:
        """This node's id."""
        return self.signer.node_id

    @property
    def key_dir_setting(self) -> Path | None:
        """The ``key_dir`` this App was given (``None``: the default, following the
        store)."""
        return None if self._key_dir_arg is None else Path(self._key_dir_arg)

    def with_settings(self, *, store: str | Store | None = None,
                      key_dir: str | Path | None = None,
                      node_id: str | None = None, trust: TrustSpec | None = None,
                      key_passphrase: str | bytes | None = None,
                      lease_seconds: float | None = None, poll_interval: float | None = None,
                      capabilities: set[str] | frozenset[str] | None = None,
                      data_keys: DataKeys | str | None = None,
                      clock: Callable[[], float] | None = None) -> App:
        """A new App with the same agents and settings but another store, key directory,
        node id, trusted roots, key passphrase, lease, poll interval, extra
        capabilities or clock (``None`` keeps this App's; ``capabilities`` adds to them).
        An App built on an open ``Store`` shares it with its clones."""
        clone = App(
            store=store if store is not None else self._store_arg,
            key_dir=key_dir or self._key_dir_arg,  # a default follows the new store
            node_id=node_id or self._node_id,
            trust=trust if trust is not None else self._trust,
            key_passphrase=key_passphrase if key_passphrase is not None else self._passphrase,
            policy=self.policy,
            lease_seconds=lease_seconds if lease_seconds is not None else self.lease_seconds,
            poll_interval=poll_interval if poll_interval is not None else self.poll_interval,
            capabilities=self.capabilities | frozenset(capabilities or ()),
            prices=self.prices,
            # Keys given carry over; the default folder follows the key folder.
            data_keys=data_keys if data_keys is not None else self._data_keys_arg,
            clock=clock if clock is not None else self.clock,
        )
        clone._adopt(self)
        return clone

    def _adopt(self, other: App) -> None:
        """Take ``other``'s agents, queries, tools and queues, its hooks (its listeners hear this
        App's workers too) and its ``open_sealed``."""
        self._agents = dict(other._agents)
        self._queries = other._queries.copy()
        self._tools = dict(other._tools)
        self._queues = dict(other._queues)
        self._model_quotas = dict(other._model_quotas)
        self.hooks = other.hooks
        self.open_sealed = other.open_sealed

    def publish(self, item: Certificate | Revocation) -> None:
        """Put a certificate or a revocation into the store (once), where every node
        that trusts the root that signed it finds it (``perdure keys issue --publish``,
        ``perdure keys revoke``)."""
        publish(self.store, item)

    def close(self) -> None:
        """Close the store if this App opened it, the seen-heads file, and stop the
        threads of ``app.aio`` (each starts again on next use)."""
        if self._aio is not None:
            self._aio.close()
        if self._client is not None:
            self._client.close()
        if self._store is not None and isinstance(self._store_arg, str):
            self._store.close()
            self._store = None

    # -- agents -------------------------------------------------------------------

    @overload
    def agent(self, fn: F, /) -> F: ...

    @overload
    def agent(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        version: str = "1",
        requires: set[str] | frozenset[str] | None = None,
        encrypt: bool = False,
    ) -> Callable[[F], F]: ...

    def agent(
        self,
        fn: F | None = None,
        /,
        *,
        name: str | None = None,
        version: str = "1",
        requires: set[str] | frozenset[str] | None = None,
        encrypt: bool = False,
    ) -> F | Callable[[F], F]:
        """Register an agent: ``@app.agent()`` or ``@app.agent(name=..., version=...)``.

        The function takes a ``Run`` (``async def``) or ``SyncRun`` (``def``) first,
        then the JSON-encodable arguments given to ``start``. The decorated
        function is returned unchanged, its signature intact.

        ``encrypt=True`` seals every payload of its objects at rest (arguments, step
        results, events, progress notes, its result), not only the ``perdure.Secret``
        values in them (see ``docs/howto/secrets.md``).
        """

        def register(func: F) -> F:
            agent_name = check_name(func.__qualname__ if name is None else name, "agent name")
            check_name(version, "agent version")
            for need in requires or ():
                check_name(need, "required capability")
            if agent_name in self._agents and self._agents[agent_name].fn is not func:
                raise ConfigurationError(f"agent {agent_name!r} is registered twice")
            self._agents[agent_name] = AgentDef(
                name=agent_name,
                version=version,
                fn=func,
                is_async=is_async(func),
                requires=frozenset(requires or ()),
                encrypt=bool(encrypt),
            )
            func.__perdure_agent__ = agent_name  # type: ignore[attr-defined]
            return func

        if fn is not None:
            return register(fn)
        return register

    @property
    def agents(self) -> Mapping[str, AgentDef]:
        """Registered agents by name."""
        return dict(self._agents)

    def queue(self, queue: str | Queue, /, *, concurrency: int | None = None,
              per_key: int | None = None, worker_concurrency: int | None = None,
              limiter: Mapping[str, float] | None = None, priority: bool = False) -> Queue:
        """Declare a named queue and its limits (see ``perdure.core.flow``) and return it:
        ``app.queue("emails", concurrency=5, per_key=1, worker_concurrency=2,
        limiter={"limit": 50, "period": 30}, priority=True)``, or
        ``app.queue(perdure.Queue("emails", ...))``. Start objects on it with
        ``app.options(queue="emails", key=..., priority=..., dedupe_key=...)``.

        ``concurrency``: objects of the queue held at once over every node;
        ``per_key``: held at once per key; ``worker_concurrency``: held at once by one
        worker process; ``limiter``: at most ``limit`` starts per ``period`` seconds;
        ``priority``: whether starts may give a priority (lower first). A slot is held
        only while a worker holds the object's lease: a dormant object holds none.

        The limits go into the store (as this App's workers start, or its first start
        on the queue) and every node claims by them; a later declaration with other
        limits replaces them there (its worker logs the change). Declaring a name twice
        on one App with other limits is a ``ConfigurationError``, as is a limit that
        makes no sense (zero, negative, not a whole number).
        """
        if isinstance(queue, Queue):
            if (concurrency, per_key, worker_concurrency, limiter, priority) != (
                    None, None, None, None, False):
                raise ConfigurationError("app.queue(Queue(...)) takes the queue's limits "
                                         "from the Queue; give them there")
            made = queue
        else:
            made = Queue(queue, concurrency=concurrency, per_key=per_key,
                         worker_concurrency=worker_concurrency, limiter=limiter,
                         priority=priority)
        with self._lock:
            known = self._queues.get(made.name)
            if known is not None and not known.same_limits(made):
                raise ConfigurationError(
                    f"queue {made.name!r} is declared twice with other limits "
                    f"({known.limits()} and {made.limits()}); declare it once")
            self._queues.setdefault(made.name, made)
            return self._queues[made.name]

    def model_quota(self, provider: str | ModelQuota, model: str | None = None, /, *,
                    tokens_per_minute: int | None = None,
                    requests_per_minute: int | None = None,
                    window: float = 60.0) -> ModelQuota:
        """Declare what a provider lets this account ask of a model (see
        ``perdure.core.quotas``) and return it: ``app.model_quota("openai", "gpt-4o-mini",
        tokens_per_minute=200_000, requests_per_minute=500)``, or
        ``app.model_quota(perdure.ModelQuota(...))``.

        ``provider`` is the client's API family (``"openai"`` for the Chat Completions and
        Responses clients, ``"anthropic"``), ``model`` the model a request names. Before
        each ``run.model`` call of that model, every node reserves the call's tokens (its
        prompt counted offline plus its ``max_tokens``, else 4096) and one request
        against the usage of the last ``window`` seconds, shared through the store; after
        the call the reservation is settled to the tokens the provider reported. A call
        that does not fit leaves its object dormant until the window has room. A 429 from
        the provider halves the rate in force (growing back by a tenth per window) and
        holds every call until its ``retry-after``.

        The quota goes into the store as this App's workers start, and every node
        reserves by what the store holds; a later declaration with other limits replaces
        them there. Declaring one twice on one App with other limits, a limit that makes
        no sense (zero, negative, not a whole number) or neither limit is a
        ``ConfigurationError``, and nothing is stored.
        """
        if isinstance(provider, ModelQuota):
            if (model, tokens_per_minute, requests_per_minute, window) != (
                    None, None, None, 60.0):
                raise ConfigurationError("app.model_quota(ModelQuota(...)) takes the "
                                         "quota's limits from the ModelQuota; give them there")
            made = provider
        else:
            made = ModelQuota(provider, model,  # type: ignore[arg-type]
                              tokens_per_minute=tokens_per_minute,
                              requests_per_minute=requests_per_minute, window=window)
        with self._lock:
            known = self._model_quotas.get(made.key)
            if known is not None and not known.same_limits(made):
                raise ConfigurationError(
                    f"the quota of {made.provider}/{made.model} is declared twice with "
                    f"other limits ({known.limits()} and {made.limits()}); declare it once")
            self._model_quotas.setdefault(made.key, made)
            return self._model_quotas[made.key]

    @property
    def model_quotas(self) -> Mapping[tuple[str, str], ModelQuota]:
        """Declared model quotas by ``(provider, model)``."""
        return dict(self._model_quotas)

    @property
    def queues(self) -> Mapping[str, Queue]:
        """Declared queues by name."""
        return dict(self._queues)

    def _declare(self, queue: Queue) -> None:
        """Put ``queue``'s limits in the store before this App's first start on it."""
        with self._lock:
            if queue.name in self._declared:
                return
        before = self.store.declare_queue(queue, self.clock())
        if before is not None:
            log.warning("queue %r: limits changed from %s to %s (this App's declaration)",
                        queue.name, before.limits(), queue.limits(),
                        extra={"action": "queue_limits_changed", "queue": queue.name})
        with self._lock:
            self._declared.add(queue.name)

    @overload
    def tool(self, fn: Callable[..., Any], /) -> Tool: ...

    @overload
    def tool(self, fn: None = None, /, **options: Any) -> Callable[[Callable[..., Any]], Tool]:
        ...

    def tool(self, fn: Callable[..., Any] | None = None, /, **options: Any
             ) -> Tool | Callable[[Callable[..., Any]], Tool]:
        """Register a tool: ``@app.tool`` or ``@app.tool(risk=..., idempotent=...,
        capabilities=..., constraints=..., name=..., description=..., schema=...)``.
        Returns the ``perdure.Tool`` (still callable as the function); pass it to
        ``run.agent(tools=...)``. See ``perdure.tools``."""
        def register(func: Callable[..., Any]) -> Tool:
            made = func if isinstance(func, Tool) else Tool.of(func, **options)
            with self._lock:
                known = self._tools.get(made.name)
                if known is not None and known.fn is not made.fn:
                    raise ConfigurationError(
                        f"tool name {made.name!r} is taken by {known.fn!r}; register this "
                        "one under another name (name=...)")
                self._tools[made.name] = made
            return made
        return register(fn) if fn is not None else register

    @property
    def tools(self) -> Mapping[str, Tool]:
        """Registered tools by name."""
        return dict(self._tools)

    def approvals(self) -> builtins.list[PendingApproval]:
        """Tool calls waiting for a person, across objects (see ``perdure.approvals``)."""
        return approvals_of(self)

    def approve(self, object_id: str, proposal_id: str, *,
                edit: Mapping[str, Any] | None = None) -> PendingApproval:
        """Approve proposal ``proposal_id`` of ``object_id``, signed with this client's key;
        with ``edit`` (new arguments, same tool) the edit goes through the gate again.
        ``ApprovalError`` if no such proposal waits."""
        return decide_on(self, object_id, proposal_id, "approve" if edit is None else "edit",
                         edit=edit)

    def reject(self, object_id: str, proposal_id: str, *, reason: str) -> PendingApproval:
        """Reject proposal ``proposal_id`` of ``object_id``; the model is told ``reason``."""
        return decide_on(self, object_id, proposal_id, "reject", reason=reason)

    def _resolve(self, agent: Callable[..., Any] | str) -> AgentDef:
        agent_name = agent if isinstance(agent, str) else getattr(agent, "__perdure_agent__", None)
        if agent_name is None or agent_name not in self._agents:
            known = ", ".join(sorted(self._agents)) or "none"
            shown = agent if isinstance(agent, str) else getattr(agent, "__qualname__", agent)
            raise UnknownAgentError(
                f"agent {shown!r} is not registered with this App (registered: {known}); "
                "decorate it with @app.agent()"
            )
        return self._agents[agent_name]

    # -- starting and talking to objects -------------------------------------------

    def start(self, agent: Callable[..., Any] | str, /, *args: Any, **kwargs: Any) -> Handle:
        """Create an object running ``agent(*args, **kwargs)``, with a generated id.

        Every argument goes to the agent, whatever its name (``deadline``, ``labels``,
        ``object_id`` ... included); how the object is started (its id, deadline,
        failure budget, labels, model-call budget) is set with ``options``:
        ``app.options(object_id="r-1", deadline=60).start(agent, *args, **kwargs)``.
        Names, ids and arguments are checked before the store is touched
        (``ConfigurationError``, ``SerializationError``).
        """
        return self._start(agent, args, kwargs, None)

    def options(self, *, object_id: str | None = None, deadline: float | None = None,
                max_failures: int | None = None, labels: Mapping[str, str] | None = None,
                budget: Any = None, queue: str | Queue | None = None, key: str | None = None,
                priority: int | None = None, dedupe_key: str | None = None,
                start_at: float | datetime | None = None,
                delay: float | timedelta | None = None, debounce_key: str | None = None,
                debounce: float | timedelta | None = None) -> Starter:
        """How to start objects: a frozen ``Starter`` whose ``start(agent, *args,
        **kwargs)`` starts one with these options (see ``perdure.starting``).

        ``object_id`` names the object (``None``: generated); starting is idempotent on
        it: with an id that already exists, ``start`` returns a handle to that object with
        ``created=False``, and its ``differs`` says how the object was started otherwise
        (arguments, labels, deadline, failure budget), if it was; an id taken by an
        object of another agent raises ``ObjectConflictError``. ``deadline`` is seconds
        from now after which the object is terminated; ``max_failures`` its failure
        budget (``None``: the node policy's); ``labels`` strings by name. ``budget`` (a
        ``perdure.llm.Budget`` or a mapping of ``tokens`` and ``cost``) caps what its
        model calls may use; ``refine(id, budget=...)`` changes it (see "Budgets" in
        docs/howto/model-calls.md). ``start_at`` (seconds since the epoch, or a
        ``datetime`` with a time zone) or ``delay`` (seconds, or a ``timedelta``, from the
        ``start`` call) starts the object later: it is created at once (its id is taken,
        ``created``/``differs`` work as always) but no node runs it before then; it
        lists as dormant, ``waits to start at ...``; a ``deadline`` counts from then. A
        bad value is a ``ConfigurationError`` here, an unknown option a ``TypeError``.

        ``queue`` (a queue this App declared with ``queue``, or its name) puts the object
        on it: it is claimed only while the queue's limits let. ``key`` is its key there
        (what ``per_key`` counts), ``priority`` its priority (lower first, 0 by default;
        the queue must take priorities). With ``dedupe_key``, while an object of the queue
        started with that key has not ended, the start returns a handle to that object
        (``created=False``, ``differs`` as for an id) and creates nothing; a live holder
        of another agent is an ``ObjectConflictError``. A queue not declared on this App
        is an ``UnknownQueueError``; see docs/howto/queues.md.

        ``debounce_key`` with ``debounce`` (seconds, or a ``timedelta``: the quiet
        period), on a ``queue``: the first start creates the object, dormant for the
        period; each later start with the same key before it runs sends it its
        arguments (a signed event) and puts its start off by the period again, and
        returns its handle (``created=False``). It runs once, a period after the last
        start, with the last start's arguments and deadline (its labels, key, priority
        and failure budget are the first start's). A start after it began makes a new
        object. Without a queue, with only one of the two, with a period of 0 or less,
        or with ``object_id``, ``dedupe_key``, ``start_at`` or ``delay``: a
        ``ConfigurationError``.
        """
        return starter(self, object_id=object_id, deadline=deadline,
                       max_failures=max_failures, labels=labels, budget=budget,
                       queue=queue, key=key, priority=priority, dedupe_key=dedupe_key,
                       start_at=start_at, delay=delay, debounce_key=debounce_key,
                       debounce=debounce)

    def _start(self, agent: Callable[..., Any] | str, args: tuple[Any, ...],
               kwargs: dict[str, Any], options: Starter | None) -> Handle:
        """``start`` with ``options`` (``None``: the defaults)."""
        object_id = options.object_id if options else None
        deadline = options.deadline if options else None
        max_failures = options.max_failures if options else None
        labels = options.labels if options else None
        budget = options.budget if options else None
        begins = options.begins(self.clock()) if options else None
        definition = self._resolve(agent)
        oid = uuid.uuid4().hex if object_id is None else check_object_id(object_id)
        labels = check_labels(labels)
        check_arguments(definition.fn, args, kwargs, agent=definition.name)
        sealing = needs_sealing(args, kwargs, seal_all=definition.encrypt)
        if not sealing:
            what = f"arguments of agent {definition.name!r}"
            plain = {"args": list(args), "kwargs": kwargs}
            if marked(encode(plain, max_depth=MAX_DEPTH + 2, what=what)):
                check_reserved(plain, what)  # a value that would be opened as sealed
        signer = self.client.certified()
        queue = options.queue if options else None
        quiet = options.debounce if options else None
        dedupe = options.dedupe_key if options else None
        if quiet is not None and options is not None and options.debounce_key is not None:
            dedupe = debounce_column(options.debounce_key)
        if queue is not None:
            self._declare(queue)
        row = self.store.get(oid)
        deduped = False
        for _ in range(3):  # a dedupe key's holder may end between the looks below
            if row is not None:
                break
            if queue is not None and dedupe is not None:
                holder = self.store.queue_holder(queue.name, dedupe)
                if holder is not None and quiet is not None:
                    if self._debounced(holder, dedupe, definition, args, kwargs, quiet,
                                       deadline):
                        return Handle(self, holder)
                    continue  # it began already and gave its key up: a new object
                if holder is not None and (row := self.store.get(holder)) is not None:
                    oid, deduped = holder, True
                    break
            now = self.clock()
            stored_args, stored_kwargs = start_arguments(
                self.store, self.data_keys, definition.name, definition.encrypt, oid, args,
                kwargs)
            new = instantiate(definition, stored_args, stored_kwargs, object_id=oid,
                              signer=signer,
                              policy_ref=self.policy.ref, now=now, deadline=deadline,
                              max_failures=max_failures, labels=labels, budget=budget,
                              start_at=begins)
            if queue is not None and options is not None:
                new = dataclasses.replace(new, queue=queue.name, queue_key=options.key,
                                          priority=options.priority, dedupe_key=dedupe)
            if self.store.create(new, now):
                # This node wrote the first record: a worker of this App need not check it.
                self.anchors.note(oid, new.first.hash, new.first.seq, new.first.hash)
                return Handle(self, oid, created=True)
            row = self.store.get(oid)  # another start took the id (or the dedupe key) first
        if row is None:
            raise ObjectConflictError(
                f"dedupe key {dedupe!r} of queue {queue.name if queue else None!r} changed "
                "hands three times while this start looked; start again")
        if row.agent != definition.name:
            what = (f"dedupe key {dedupe!r} of queue {queue.name if queue else None!r} is "
                    f"held by object {oid!r}" if deduped else f"object {oid!r} already exists")
            raise ObjectConflictError(
                f"{what} and runs agent {row.agent!r}, not {definition.name!r}; start "
                f"{definition.name!r} under another "
                f"{'dedupe key' if deduped else 'object id'}")
        first = next((r for r in self.store.records(oid) if r.kind == Kind.INSTANTIATED), None)
        if first is not None and (sealing or marked(first.body_bytes)):
            return Handle(self, oid, differs=differences(
                self.store, self.data_keys, oid, first, args=args, kwargs=kwargs,
                labels=labels, max_failures=max_failures, deadline=deadline))
        differs = None if first is None else start_differences(
            oid, first.body, args=args, kwargs=kwargs, labels=labels,
            max_failures=max_failures, deadline=deadline)
        return Handle(self, oid, differs=differs)

    def _debounced(self, holder: str, key: str, definition: AgentDef, args: tuple[Any, ...],
                   kwargs: dict[str, Any], quiet: float, deadline: float | None) -> bool:
        """Collapse a start into ``holder``, the debounced object holding ``key``, if it
        has not begun: a signed refinement carrying these arguments, which its node
        takes before it first runs, and its start put off by ``quiet`` seconds. ``False``
        when it began (the store then took the key from it)."""
        row = self.store.get(holder)
        if row is not None and row.agent != definition.name:
            raise ObjectConflictError(
                f"the debounce key is held by object {holder!r}, which runs agent "
                f"{row.agent!r}, not {definition.name!r}; use another debounce key")
        now = self.clock()
        begins = now + quiet
        stored_args, stored_kwargs = start_arguments(
            self.store, self.data_keys, definition.name, definition.encrypt, holder, args,
            kwargs)
        later: dict[str, Any] = {"args": list(stored_args), "kwargs": stored_kwargs,
                                 "start_at": begins}
        if deadline is not None:
            later["deadline"] = begins + deadline
        data = encode({DEBOUNCED_START: later}, what=f"arguments of agent {definition.name!r}",
                      max_depth=MAX_DEPTH + 2)
        seal = self.client.seal_event(holder, REFINE_EVENT, data, None)
        return self.store.debounce_start(holder, key, REFINE_EVENT, data, seal, begins, now)

    # -- schedules ------------------------------------------------------------------

    def schedule(self, name: str, agent: Callable[..., Any] | str, /, *args: Any,
                 cron: str | None = None, timezone: str | None = None,
                 interval: float | timedelta | None = None, overlap: str = "skip",
                 catch_up_window: float | timedelta | None = None,
                 jitter: float | timedelta = 0.0, **kwargs: Any) -> ScheduleHandle:
        """Create the schedule ``name`` (once: idempotent on the name), which starts
        ``agent(*args, **kwargs)`` at every fire of ``cron`` (five fields, read in
        ``timezone``, an IANA name, UTC by default) or every ``interval`` seconds (at the
        multiples of it since the epoch), and return its ``ScheduleHandle``.

        The schedule is an object of its own (id ``schedule:<name>``), carried by any
        worker: dormant until its next fire, it then starts one run, a child object
        named ``<name>@<fire time>`` (so a fire never starts two runs, even across a
        crash). ``overlap`` says what a fire does while an earlier run is live:
        ``skip`` (the default), ``buffer_one`` (start it when the live one ends; at most
        one waits), ``allow_all``, ``cancel_previous``. After downtime only the most
        recent missed fire runs, unless ``catch_up_window`` (seconds) lets every fire
        missed by less than that run. ``jitter`` delays each run by up to that many
        seconds (the same delay on every node). See docs/howto/schedules.md.

        ``ScheduleError`` for a bad spec, ``UnknownAgentError``, ``ConfigurationError``
        for arguments the agent does not take; nothing is stored then. An existing
        schedule of that name is returned as it is, with ``differs`` saying how its spec
        differs.
        """
        options = {"cron": cron, "timezone": timezone, "interval": interval,
                   "overlap": overlap, "catch_up_window": catch_up_window, "jitter": jitter}
        return create_schedule(self, name, agent, args, kwargs, options)

    def schedules(self) -> builtins.list[ScheduleInfo]:
        """Every schedule in the store (deleted ones too), by name, as its memory says:
        spec, state (active, paused, deleted), next and last fire, runs started."""
        return list_schedules(self)

    def schedule_handle(self, name: str) -> ScheduleHandle:
        """The schedule ``name``, to pause, resume, trigger, backfill, update or delete
        it; ``ObjectNotFoundError`` if there is none."""
        check_name(name, "schedule name")
        row = self.store.get(schedule_id(name))
        if row is None or row.agent != SCHEDULE_AGENT:
            raise ObjectNotFoundError(f"no schedule {name!r} in {self.store_url}")
        return ScheduleHandle(self, name)

    def _served(self) -> dict[str, AgentDef]:
        """The agents this node's workers run: the registered ones and perdure's own
        schedule agent."""
        return {**self._agents, SCHEDULE_AGENT: schedule_definition()}

    def handle(self, object_id: str) -> Handle:
        """A handle to an existing object; ``ObjectNotFoundError`` if there is none."""
        self.get(object_id)
        return Handle(self, object_id)

    def send(self, object_id: str, event: str, payload: Any = None, *,
             dedupe_key: str | None = None) -> bool:
        """Send ``event`` with a JSON ``payload``; kept until the object waits for it.

        Returns ``False`` when ``dedupe_key`` was already used for this object (the
        event is then delivered once). Raises ``ObjectNotFoundError`` or
        ``ObjectTerminatedError``.
        """
        lookup_id(object_id)
        check_name(event, "event name")
        if is_reserved(event):
            raise ConfigurationError(
                f"event name {event!r} is reserved (the prefix perdure: is perdure's own); "
                "use another name"
            )
        if dedupe_key is not None:
            check_name(dedupe_key, "dedupe key")
        data = sealed_payload(self.store, self.data_keys, object_id, event, payload)
        return self.store.send(object_id, event, data, dedupe_key, self.clock(),
                               self.client.seal_event(object_id, event, data, dedupe_key))

    def refine(self, object_id: str, **changes: Any) -> None:
        """Refine an object's intent (deadline, max_failures, goal, requires, budget)
        from outside; a ``budget`` (a ``perdure.llm.Budget``, a mapping of ``tokens`` and
        ``cost``, or ``None`` for none) wakes an object dormant on an exhausted one.

        Appended as an intent-refinement record with a new intent version on the
        object's next cycle. A ``goal`` is sealed under the object's data key when its
        agent encrypts all (its ``perdure.Secret`` values are, for any agent).
        """
        check_object_id(object_id)
        try:
            Intent("x", "1").refined(changes)  # validate the field names and values now
        except ValueError as exc:
            raise ConfigurationError(f"cannot refine object {object_id!r}: {exc}") from None
        except TypeError:  # requires that is no collection at all (5, None)
            raise ConfigurationError(
                f"cannot refine object {object_id!r}: requires must be a collection of "
                "capability names") from None
        for need in changes.get("requires", ()):
            check_name(need, "required capability")
        if "budget" in changes:
            changes["budget"] = budget_body(changes["budget"])
        if "goal" in changes:  # sealed for an agent that encrypts all, or with secrets
            changes["goal"] = sealed_goal(self.store, self.data_keys, object_id,
                                          changes["goal"])
        data = encode(changes, what="refinement", max_depth=MAX_DEPTH + 1)
        self.store.send(object_id, REFINE_EVENT, data, None, self.clock(),
                        self.client.seal_event(object_id, REFINE_EVENT, data, None))

    def pause(self, object_id: str) -> ObjectInfo:
        """Hold the object: it stops at its next command boundary and is not claimed."""
        row = self.store.control(lookup_id(object_id), self.clock(), paused=True)
        return info_from_row(row, self.clock())

    def resume(self, object_id: str) -> ObjectInfo:
        """Release a paused object, or retry a parked one (after its code was fixed)."""
        row = self.store.control(lookup_id(object_id), self.clock(), paused=False,
                                 unpark=True)
        return info_from_row(row, self.clock())

    def cancel(self, object_id: str) -> ObjectInfo:
        """Ask the object to stop; it terminates as cancelled at its next command boundary."""
        row = self.store.control(lookup_id(object_id), self.clock(), cancel=True)
        return info_from_row(row, self.clock())

    def get(self, object_id: str, *, explain: bool = True) -> ObjectInfo:
        """What the store says about an object; ``ObjectNotFoundError`` if unknown.

        A runnable object that no live node can take gets a note saying why (see
        ``perdure.describe.waiting_note``); ``explain=False`` leaves that out and spares
        the store the query of live nodes (``Handle.result`` polls this way).
        """
        row = self.store.get(lookup_id(object_id))
        if row is None:
            raise ObjectNotFoundError(f"no object {object_id!r} in {self.store.url}")
        info = info_from_row(row, self.clock())
        return self._notes.annotate(self._explain(info)) if explain else info

    def list(self, *, status: str | None = None, phase: str | None = None,
             agent: str | None = None, parent: str | None = None,
             limit: int = 100) -> list[ObjectInfo]:
        """Objects matching the filters, newest first."""
        if status is not None and status not in set(Status):
            raise ConfigurationError(
                f"unknown status {status!r}; one of {', '.join(s.value for s in Status)}"
            )
        now = self.clock()
        rows = self.store.list(status=status, phase=phase, agent=agent, parent=parent,
                               limit=limit)
        live = self._live_nodes(now)
        return [self._notes.asking(self._explain(info_from_row(row, now), live))
                for row in rows]

    def _live_nodes(self, now: float) -> builtins.list[NodeInfo]:
        return self.store.live_nodes(now)

    def _explain(self, info: ObjectInfo, live: builtins.list[NodeInfo] | None = None
                 ) -> ObjectInfo:
        """Say why a runnable object waits when no live node can take it."""
        if info.status is not Status.READY or (info.note and not info.avoid):
            return info  # nothing to explain: no need to ask for the live nodes
        note = waiting_note(info, self._live_nodes(self.clock()) if live is None else live)
        return info if note is None else dataclasses.replace(info, note=note)

    # -- watching and steering: questions, queries, retry, fork ------------------------

    def questions(self, *, agent: str | None = None, limit: int = 100
                  ) -> builtins.list[Question]:
        """The questions waiting objects ask (``run.wait_for(event, prompt=...)``) across
        the store, newest first, at most ``limit`` (of ``agent``'s objects only, if
        given). Answer one with ``send(question.object_id, question.event, payload)``.

        Reads the end of the memory of each dormant object whose note says it asks
        something (of up to 100,000 dormant objects).
        """
        return self._notes.questions(agent, limit)

    def define_update(self, agent: Callable[..., Any] | str, *, name: str,
                      validator: Callable[..., Any] | None = None) -> Callable[[F], F]:
        """Declare update ``name`` of ``agent``'s objects, with an optional pure
        ``validator(*args)`` that raises to refuse a request (callers run it before
        sending; the object runs it again). Used as a decorator, it declares the
        function it decorates as the validator: ``@app.define_update(cart,
        name="add_item")``. The agent sets the handler with ``run.on_update``. See
        ``perdure.updates``."""
        updates = self._resolve(agent).updates
        update_declare(updates, name, validator)

        def declare(fn: F) -> F:
            update_declare(updates, name, fn)
            return fn

        return declare

    def update(self, object_id: str, name: str, /, *args: Any,
               timeout: float | None = 30.0) -> Any:
        """Send update ``name`` with ``args`` to a running object and return its reply:
        what the handler the agent set with ``run.on_update`` returned. The declared
        validator runs here first: ``UpdateRefusedError`` (with the reason) and nothing
        written when it refuses. The object takes the update while it waits in
        ``run.wait_for``; the reply is waited for on the store's pushes, up to
        ``timeout`` seconds (``ResultTimeoutError``; the request stays queued and is
        applied when the object next waits). ``UnknownUpdateError``,
        ``UpdateFailedError`` (the handler raised, or the object ended first),
        ``ObjectNotFoundError``, ``ObjectTerminatedError``."""
        sent = send_update(self, object_id, name, args)
        return wait_reply(self, object_id, sent, timeout)

    def define_query(self, agent: Callable[..., Any] | str, *, name: str | None = None
                     ) -> Callable[[F], F]:
        """Declare a query of ``agent``'s objects: ``@app.define_query(agent=research)``
        over ``def sources(view: MemoryView, *args)``. Its name is the function's, or
        ``name``. See ``perdure.queries``."""
        agent_name = (check_name(agent, "agent name") if isinstance(agent, str)
                      else self._resolve(agent).name)

        def declare(fn: F) -> F:
            self._queries.add(agent_name, name or str(getattr(fn, "__name__", "")), fn)
            return fn

        return declare

    @overload
    def query(self, object_id: str, name: str, /, *args: Any) -> Any: ...

    @overload
    def query(self, object_id: str, /, *args: Any, name: str) -> Any: ...

    @overload
    def query(self, *, agent: Callable[..., Any] | str, name: str | None = None
              ) -> Callable[[F], F]: ...

    def query(self, *args: Any, agent: Callable[..., Any] | str | None = None,
              name: str | None = None) -> Any:
        """Answer query ``name`` (declared with ``define_query`` for the object's agent)
        over the object's checked memory: ``app.query(object_id, name, *args)``; running,
        dormant or ended, the object is not woken, no lease is taken and nothing is
        written. ``ObjectNotFoundError``, ``UnknownQueryError``, ``IntegrityError``
        (memory does not verify), ``QueryFailedError`` (the query raised).

        ``@app.query(agent=..., name=None)`` is ``define_query``: it declares one.
        """
        if agent is not None:
            if args:
                raise ConfigurationError(
                    "app.query(agent=..., name=...) declares a query and takes nothing else; "
                    "to ask one, call app.query(object_id, name, *args)")
            return self.define_query(agent, name=name)
        if name is None:
            if len(args) < 2:
                raise ConfigurationError("app.query takes an object id and a query name: "
                                         "app.query(object_id, name, *args)")
            object_id, name, rest = args[0], args[1], args[2:]
        else:
            if not args:
                raise ConfigurationError("app.query takes an object id: "
                                         "app.query(object_id, name, *args)")
            object_id, rest = args[0], args[1:]
        if not isinstance(object_id, str):
            raise ConfigurationError(f"an object id is a string, not {type(object_id).__name__}")
        return run_query(self, self._queries, object_id, name, rest)

    def retry(self, object_id: str) -> ObjectInfo:
        """Retry a parked object (after fixing what parked it): it becomes runnable and
        its next worker replays it with the code that worker runs. ``NotParkedError`` if
        the object is not parked (``resume`` also releases a paused one)."""
        info = self.get(object_id, explain=False)
        if info.status is not Status.PARKED:
            raise NotParkedError(f"object {object_id!r} is {info.status}, not parked; "
                                 "nothing to retry")
        return self.resume(object_id)

    def fork(self, object_id: str, *, at: int, new_id: str | None = None) -> Handle:
        """A new object whose memory is the object's verified memory up to record ``at``,
        re-signed by this node, with ``forked_from`` pointing at it; it runs from there
        with current code (recorded steps are not run again). ``new_id`` names it (the
        call is then idempotent), else an id is generated.

        ``ForkError`` for a record the object cannot be forked at (inside a step pair or
        a gather, after a child it still waits for, its end: see ``perdure.fork``),
        ``IntegrityError`` if its memory does not verify, ``ObjectConflictError`` if
        ``new_id`` is another object's.
        """
        return fork_object(self, object_id, at, new_id)

    def history(self, object_id: str, *, after: int = 0, opened: bool = False
                ) -> builtins.list[Record]:
        """The object's memory, in order (only its records after seq ``after``, if
        given); ``RecordDecodeError`` if a record is damaged. Bodies are as stored,
        sealed values sealed; ``opened=True`` opens them with this App's data keys where
        it may (``perdure.llm.recorded_calls`` then rebuilds an encrypt-all agent's
        conversation)."""
        self.get(object_id, explain=False)
        records = self.store.records(object_id, after_seq=after)
        if not opened:
            return records

        return self.client.opener(self.open_sealed).records(records)

    def usage(self, object_id: str, *, lineage: bool = False) -> UsageTotals:
        """What the object's model calls (``run.model``) used and cost, from its memory;
        with ``lineage=True``, rolled up over the object and all its descendants."""
        totals = usage_totals(self.history(object_id))
        if lineage:
            for child in self.list(parent=object_id, limit=10_000):
                totals = totals + self.usage(child.object_id, lineage=True)
        return totals

    def verify(self, object_id: str, *,
               anchors: Mapping[str, tuple[int, str]] | None = None) -> VerifyReport:
        """Walk the object's chain and every record's signature; the report names the
        first bad record.

        A signature counts only under a key certified by a root this node trusts.
        The chain must also reach every head this node saw of the object (its
        ``heads.db``) and, with ``anchors`` (object id -> ``(seq, hash)``, as
        ``export_heads`` gives), the head given there: a store rolled back or rewritten
        is reported, naming the record.
        """
        return self.client.verify(object_id, anchors=anchors)

    def export_heads(self, object_ids: Sequence[str] | None = None
                     ) -> builtins.list[dict[str, Any]]:
        """The heads of objects whose memory verifies now, to keep outside the store
        and check later with ``verify(anchors=...)`` / ``perdure verify --anchors``.

        Each is ``{"object_id", "seq", "hash"}``; objects that do not verify are left
        out (and named by ``verify``).
        """
        ids = object_ids if object_ids is not None else [
            info.object_id for info in self.list(limit=10_000_000)]
        heads = []
        for object_id in ids:
            report = self.verify(object_id)
            if report.ok and report.head_hash is not None:
                heads.append({"object_id": object_id, "seq": report.records,
                              "hash": report.head_hash})
        return heads

    def replay_check(self, object_ids: Sequence[str] | None = None) -> builtins.list[ReplayReport]:
        """Replay recorded memory against this App's code without running any step.

        Checks the given objects, or every object not yet terminated, and reports
        for each whether the code reproduces its memory (``compatible``), where it
        would diverge (``diverges``: position, recorded vs found), or that this code
        does not serve its agent version (``not-served``). Nothing is written.
        """
        if object_ids is None:
            object_ids = [
                info.object_id for info in self.list(limit=1_000_000) if not info.terminal
            ]
        reports = []
        for object_id in object_ids:
            records = self.history(object_id)
            sealer = Sealer(self.store, self.data_keys, object_id)
            reports.append(asyncio.run(replay_check(self._served(), records, sealer)))
        return reports

    def result_of(self, object_id: str) -> Any:
        """A completed object's result, as its verified terminal record holds it
        (``None`` if it has not completed). ``IntegrityError`` if the terminal record
        does not verify or the store's result column says otherwise."""
        row = self.store.get(object_id)
        if row is None or row.status != Status.COMPLETED:
            return None
        return self.outcome(object_id).get("result")

    def outcome(self, object_id: str) -> dict[str, Any]:
        """The body of the object's terminal record, after checking it: its hash, its
        signature under a trusted key, and that the store's row agrees with it.

        ``IntegrityError`` (naming the record) for anything that does not hold: an
        edited result column is reported, never served.
        """
        row = self.store.get(lookup_id(object_id))
        if row is None:
            raise ObjectNotFoundError(f"no object {object_id!r} in {self.store.url}")
        last = self.store.records(object_id, max(0, row.head_seq - 1))
        if not last or last[-1].seq != row.head_seq or last[-1].kind != Kind.TERMINATED:
            raise IntegrityError(object_id, row.head_seq,
                                 f"the object's row says {row.status} but its memory holds no "
                                 f"terminal record at #{row.head_seq}")
        rec = last[-1]
        check_links(object_id, [rec], start_hash=rec.prev_hash, start_seq=rec.seq)
        if rec.hash != row.head_hash:
            raise IntegrityError(object_id, rec.seq, "the terminal record's hash differs from "
                                 "the object's recorded head")
        problem = self.verifier.record_problem(rec) or row_against_memory(row, rec)
        if problem is not None:
            raise IntegrityError(object_id, rec.seq, problem)
        if not self.open_sealed:
            return dict(rec.body)
        return opened_body(self.store, self.data_keys, rec)

    # -- running a node -------------------------------------------------------------

    def worker(self, *, concurrency: int = 16, drain_seconds: float = DRAIN_SECONDS,
               held_records: int = 50_000, warn_stalls: float | None = None) -> Worker:
        """Build this node's worker (``run_worker`` runs one until stopped).

        ``warn_stalls`` (seconds) logs a WARNING, with the stack, whenever the worker's
        event loop is blocked longer (``perdure.engine.stalls``).

        ``held_records`` bounds the records the node keeps of objects it ran, so that
        claiming one again reads only what was appended since (0: always read all).
        """
        settings = WorkerSettings(
            data_keys=self.data_keys,
            concurrency=concurrency,
            lease_seconds=self.lease_seconds,
            poll_interval=self.poll_interval,
            drain_seconds=drain_seconds,
            held_records=held_records,
            warn_stalls=warn_stalls,
            model_prices=self.prices,
            queues=tuple(self._queues.values()),
            model_quotas=tuple(self._model_quotas.values()),
        )
        signer = self.client.certified()
        return Worker(store=self.store, signer=signer, policy=self.policy,
                      agents=self._served(), settings=settings,
                      capabilities=self.capabilities,
                      verifier=self._identity.verifier(self.store),
                      anchors=self.anchors, hooks=self.hooks, clock=self.clock)

    async def serve(self, stop: asyncio.Event | None = None, *, concurrency: int = 16,
                    corrupt_retry: float = CORRUPT_RETRY_SECONDS,
                    drain_seconds: float = DRAIN_SECONDS,
                    abandon: asyncio.Event | None = None,
                    warn_stalls: float | None = None) -> int:
        """Run a worker on the current event loop until ``stop`` is set.

        Then the node claims nothing more and drains: steps already running may finish,
        and are recorded, for up to ``drain_seconds`` (or until ``abandon`` is set); the
        objects are let go. Returns how many steps it abandoned still running on code
        threads (0 when every object was let go at a command boundary).

        If the store cannot be reached when the node starts, it says so once and
        keeps trying (backing off up to 5 s) instead of exiting. A damaged store
        (``StoreCorruptError``: checked before the node claims anything, with
        ``Store.check_damage``, or met while it runs) is said once too, with what to do,
        and checked again every ``corrupt_retry`` seconds (say, after a restore from a
        backup): a supervised worker does not crash-loop on it. A wrong setting fails at
        once.
        """
        stop = stop or asyncio.Event()
        delay, said, damaged = 0.25, False, ""

        def build() -> Worker:
            self.store.check_damage()
            return self.worker(concurrency=concurrency, drain_seconds=drain_seconds,
                               warn_stalls=warn_stalls)

        async def wait_out(exc: StoreCorruptError) -> None:
            nonlocal damaged
            if str(exc) != damaged:
                log.error("%s; this node waits, checking the store again every %.0f s",
                          exc, corrupt_retry, extra={"action": "store_corrupt"})
                damaged = str(exc)
            self.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=corrupt_retry)

        while not stop.is_set():
            try:
                worker = await asyncio.to_thread(build)
            except StoreCorruptError as exc:
                await wait_out(exc)
                continue
            except StoreError as exc:
                if not said:
                    log.error("store unavailable at start, retrying: %s", exc,
                              extra={"action": "store_down"})
                    said = True
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=delay)
                delay = min(delay * 2, 5.0)
                continue
            if said or damaged:
                log.warning("store reachable; node starting", extra={"action": "store_up"})
                said, damaged = False, ""
            try:
                return await worker.run(stop, abandon)
            except StoreCorruptError as exc:  # met while running: said once, checked again
                await wait_out(exc)
        return 0

    def run_worker(self, *, concurrency: int = 16, until: Callable[[], bool] | None = None,
                   install_signals: bool = True, drain_seconds: float = DRAIN_SECONDS,
                   warn_stalls: float | None = None,
                   also: Sequence[Callable[[asyncio.Event], Awaitable[object]]] = ()) -> int:
        """Run this node until SIGINT/SIGTERM (or ``until()`` turns true). Blocks.

        On the first signal the node claims nothing more, says what it waits for, and
        lets the steps already running finish and be recorded, for up to
        ``drain_seconds``; then it lets the objects go and returns. A second signal lets
        them go at once. Returns how many steps were abandoned still running on code
        threads: the interpreter waits for those threads at exit unless the caller
        exits at once (``os._exit``), as ``perdure worker`` does.

        ``also``: coroutine functions run beside the worker on its event loop, each given
        the stop event the first signal sets (``perdure.triggers.Triggers.runner``
        makes one: ``perdure worker --triggers``). The worker returns once they have
        returned too; one that raises stops the worker, and its exception is raised.
        """

        async def main() -> int:
            stop = asyncio.Event()
            abandon = asyncio.Event()
            loop = asyncio.get_running_loop()

            def signalled() -> None:
                (abandon if stop.is_set() else stop).set()

            if install_signals and threading.current_thread() is threading.main_thread():
                for sig in (signal.SIGINT, signal.SIGTERM):
                    with contextlib.suppress(NotImplementedError, RuntimeError):
                        loop.add_signal_handler(sig, signalled)
            watcher = None
            if until is not None:

                async def watch() -> None:
                    while not until():
                        await asyncio.sleep(0.05)
                    stop.set()

                watcher = asyncio.create_task(watch())
            companions = [asyncio.create_task(_companion(fn, stop)) for fn in also]
            try:
                abandoned = await self.serve(stop, concurrency=concurrency,
                                             drain_seconds=drain_seconds, abandon=abandon,
                                             warn_stalls=warn_stalls)
                stop.set()
                await asyncio.gather(*companions)
                return abandoned
            finally:
                if watcher is not None:
                    watcher.cancel()
                for task in companions:
                    task.cancel()

        return asyncio.run(main())

    @contextlib.contextmanager
    def background_worker(self, *, concurrency: int = 16) -> Iterator[None]:
        """Run a worker in a background thread for the ``with`` block (tests, notebooks)."""
        stopped = threading.Event()
        thread = threading.Thread(
            target=self.run_worker,
            kwargs={"concurrency": concurrency, "until": stopped.is_set,
                    "install_signals": False},
            daemon=True,
        )
        thread.start()
        try:
            yield
        finally:
            stopped.set()
            thread.join(timeout=30)


async def _companion(fn: Callable[[asyncio.Event], Awaitable[object]],
                     stop: asyncio.Event) -> None:
    """Run ``fn(stop)`` beside a worker; if it fails, stop the worker (the failure is
    raised where the companions are gathered)."""
    try:
        await fn(stop)
    except BaseException:
        stop.set()
        raise
