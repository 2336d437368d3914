"""The ``Store`` protocol every backend implements, its roles, and the rows it trades in.

A store keeps rows, records, leases, timers and an inbox. It knows nothing of
agents: it never runs user code and never interprets a record body. Every write
a node makes while it holds an object is conditional on the fencing epoch it
claimed the object with; a store refuses it with ``LeaseLostError`` otherwise.

``Store`` is the union of small role protocols, one per concern: ``Nodes`` (trust
items, heartbeats), ``Objects`` (index rows), ``Records`` (memory and
commit seals), ``Leases`` (claims, timers, control flags, wake-ups), ``Queues``
(named queues' limits), ``ModelQuotas`` (model calls' tokens and requests per minute,
reserved and settled), ``Inbox`` (events), ``DataKeyRows`` (objects' wrapped data
keys, opaque bytes), ``Writes`` (fenced group commits), ``AlertRows`` (alerts and
notifications, each fired and resolved once whatever the number of nodes evaluating them)
and ``Browse`` (what people look at: objects found by any filter a page at a time, and
the figures of the last hour). How a node's event loop gets its commits made (on the
loop, awaited on it, or on a thread) is hidden behind the ``Writer`` a store hands out;
``perdure.stores.writers`` holds the ones a backend can opt into.
"""

from __future__ import annotations

import asyncio
import builtins
import concurrent.futures
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeAlias

from perdure.core.chain import CommitSeal
from perdure.core.flow import Queue
from perdure.core.quotas import ModelQuota, QuotaState
from perdure.core.records import GENESIS_HASH, Record

__all__ = [
    "AlertRow",
    "AlertRows",
    "Append",
    "Browse",
    "CheckpointRow",
    "Checkpoints",
    "Claim",
    "DataKeyRow",
    "DataKeyRows",
    "Done",
    "Event",
    "Inbox",
    "Leases",
    "ModelQuotas",
    "NewObject",
    "NodeInfo",
    "Nodes",
    "ObjectCount",
    "ObjectFilter",
    "ObjectRow",
    "Objects",
    "Outcomes",
    "QueueStats",
    "Queues",
    "QuotaGrant",
    "QuotaStats",
    "RecordBody",
    "Records",
    "Route",
    "Signal",
    "Store",
    "Writer",
    "Writes",
]


@dataclass(frozen=True, slots=True)
class ObjectRow:
    """The index row of an object. Memory is the truth; this is for finding work."""

    object_id: str
    agent: str
    agent_version: str
    status: str
    phase: str
    epoch: int
    lease_owner: str | None
    lease_expires: float | None
    ready_at: float | None
    waiting_event: str | None
    paused: bool
    cancel_requested: bool
    parked: bool
    note: str | None
    head_seq: int
    head_hash: str
    result: bytes | None
    parent_id: str | None
    created_at: float
    updated_at: float
    requires: tuple[str, ...] = ()
    #: The node processes (``node_id/pid``) that said they cannot do the object's next
    #: step; none of them claims it until that step is done elsewhere.
    avoid: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ObjectFilter:
    """What ``Browse.browse`` narrows the objects to; a field left ``None`` matches all.

    ``status`` is a stored status, or one a person sees derived from the flags:
    ``parked``, ``paused`` (and not parked), ``running`` (a lease live at ``now``); any
    other stored status matches only objects neither parked nor paused, unless it is a
    terminal one. ``version`` is the agent's version, ``label`` a ``(key, value)`` pair
    of the labels the object was started with, ``parent`` the parent's id, ``node`` a
    node holding the object's lease now, ``since``/``until`` bound ``created_at``
    (inclusive), ``prefix`` is the start of the object id (matched exactly, case and
    every character as given).
    """

    status: str | None = None
    phase: str | None = None
    agent: str | None = None
    version: str | None = None
    label: tuple[str, str] | None = None
    parent: str | None = None
    node: str | None = None
    since: float | None = None
    until: float | None = None
    prefix: str | None = None


@dataclass(frozen=True, slots=True)
class RecordBody:
    """A record's place, kind, time and body bytes, not decoded (figures that skip what
    they cannot read)."""

    object_id: str
    seq: int
    kind: str
    ts_us: int
    body: bytes


@dataclass(frozen=True, slots=True)
class NewObject:
    """What ``Store.create`` needs: the row's index fields and the first record."""

    object_id: str
    agent: str
    agent_version: str
    first: Record
    ready_at: float
    parent_id: str | None = None
    requires: tuple[str, ...] = ()
    #: The queue the object is claimed through (``perdure.core.flow``), its key there
    #: (``per_key``), its priority (lower first) and its dedupe key: while the object is
    #: not terminal, no other object of the queue may be created with that dedupe key.
    queue: str | None = None
    queue_key: str | None = None
    priority: int = 0
    dedupe_key: str | None = None


@dataclass(frozen=True, slots=True)
class QueueStats:
    """A declared queue and what it holds at a moment: ``held`` slots (objects of the
    queue under a live lease), ``ready`` (runnable now, not held: waiting for a slot or
    a worker), ``waiting`` (dormant: sleeping or waiting for an event; they hold no slot)
    and ``started`` (objects that started within the limiter's period, if it has one)."""

    queue: Queue
    held: int
    ready: int
    waiting: int
    started: int = 0


@dataclass(frozen=True, slots=True)
class ObjectCount:
    """How many objects of ``agent`` hold ``status`` (a stored status, or ``parked`` or
    ``paused`` when the flag is set, parked first), and how many of those wait for a
    person's decision on a tool call (``approvals``)."""

    agent: str
    status: str
    count: int
    approvals: int = 0


@dataclass(frozen=True, slots=True)
class QuotaGrant:
    """The answer to a reservation (``ModelQuotas.reserve_quota``): ``ticket`` names the
    reservation to settle when it was granted (``None`` with ``granted``: the model has no
    quota), else ``ready_at`` is when the call will fit."""

    granted: bool
    ticket: int | None = None
    ready_at: float | None = None


@dataclass(frozen=True, slots=True)
class QuotaStats:
    """A declared quota and its window at a moment: the tokens of settled calls
    (``used``: what providers reported), of calls in flight (``reserved``: estimates),
    the ``requests`` in the window, and what 429s taught (``state``; ``factor``: the share
    of the declared rate in force now)."""

    quota: ModelQuota
    state: QuotaState
    used: int
    reserved: int
    requests: int
    factor: float


@dataclass(frozen=True, slots=True)
class Route:
    """What a claiming node can serve: ``agent@version`` names (``None``: anything),
    its capabilities, and its node id (objects that said this node cannot do their
    next step are skipped). Objects asked to cancel are claimable by any node."""

    node_id: str | None = None
    serves: tuple[str, ...] | None = None
    capabilities: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DataKeyRow:
    """An object's data key as the store keeps it: wrapped (opaque bytes) under the
    key-encryption key ``key_id``; ``seal_all``: every payload sent to the object is
    sealed whole (its agent encrypts all payloads)."""

    object_id: str
    key_id: str
    wrapped: bytes
    seal_all: bool = False


@dataclass(frozen=True, slots=True)
class CheckpointRow:
    """The latest superseding state of one slot of an object (a resource's descriptor, a
    step's progress marker), kept outside the hash chain: ``body`` (bytes the engine
    encodes), signed by ``signer`` over the object, the slot, the chain head it follows
    (``after_seq``, ``after_hash``) and the body; ``epoch``: the lease it was written
    under."""

    object_id: str
    slot: str
    epoch: int
    after_seq: int
    after_hash: str
    body: bytes
    signer: str
    signature: bytes
    written_at: float = 0.0


@dataclass(frozen=True, slots=True)
class AlertRow:
    """An alert (or a notification) as the store keeps it: ``rule`` and ``subject`` name
    it (one row each), ``state`` is ``firing`` or ``resolved``, ``summary`` what it says,
    ``node_id`` the node whose write fired it, ``fired_at`` and ``resolved_at`` when."""

    rule: str
    subject: str
    state: str
    summary: str
    node_id: str
    fired_at: float
    resolved_at: float | None = None


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A node as its last heartbeat described it."""

    node_id: str
    serves: tuple[str, ...]
    capabilities: tuple[str, ...]
    seen_at: float
    live_until: float


@dataclass(frozen=True, slots=True)
class Claim:
    """A lease a node holds: the object, its fencing epoch, and control flags seen."""

    object_id: str
    epoch: int
    lease_expires: float
    cancel_requested: bool = False
    paused: bool = False
    #: How many workers in a row held the object at its current head and let their lease
    #: lapse instead of letting go (they died, or lost the store); 0 after a clean release.
    crashes: int = 0


@dataclass(frozen=True, slots=True)
class Event:
    """An event in an object's inbox."""

    event_id: int
    object_id: str
    name: str
    payload: bytes
    dedupe_key: str | None
    sent_at: float
    seal: bytes = b""  # who accepted the event and their signature (opaque to the store)


@dataclass(frozen=True, slots=True)
class Signal:
    """An event for another object, queued in the same transaction as an append.

    A child's terminal append signals its parent this way, so the parent can never
    miss it: either both are written or neither.
    """

    object_id: str
    name: str
    payload: bytes
    dedupe_key: str
    seal: bytes = b""


@dataclass(slots=True)
class Append:
    """One fenced write: append ``records`` and update the row, all or nothing.

    Refused (``LeaseLostError``) unless the row still has ``epoch`` and its head
    is the record just before ``records[0]``. ``ready_at``/``waiting_event``
    describe when the object is runnable next; when ``waiting_event`` already has
    an unconsumed event in the inbox, the store makes it runnable at once.

    A cancel requested for the object is reported back as a ``CancelRequestedError``
    in the append's outcome: for an append that keeps the object running (status
    ``running``, not released) the records were written and the node must stop at
    once; an append with ``unless_cancelled`` (a completion) is refused instead and
    nothing was written.

    Treat it as a value: a store never changes one. It is not frozen because a node
    builds one per step (a frozen dataclass sets each of its 16 fields through
    ``object.__setattr__``), and the committer that owns a submitted append fills in
    its records' signatures just before the store sees it.
    """

    object_id: str
    epoch: int
    records: Sequence[Record]
    status: str
    phase: str
    ready_at: float | None
    waiting_event: str | None = None
    release: bool = False
    result: bytes | None = None
    consume_event_ids: Sequence[int] = field(default_factory=tuple)
    parked: bool = False
    note: str | None = None
    signal: Signal | None = None
    requires: tuple[str, ...] | None = None  # capabilities a node needs now; None: unchanged
    avoid_node: str | None = None  # a node that said it cannot do this object's next step
    clear_avoid: bool = False  # the step got done: every node may take the object again
    unless_cancelled: bool = False  # refuse (write nothing) if a cancel is pending
    cancel_children: bool = False  # ask the object's live children to cancel, atomically


#: One outcome per append of a commit: ``None`` (written) or the error refusing it
#: (``LeaseLostError``; ``CancelRequestedError``, see ``Append``).
Outcomes: TypeAlias = builtins.list[BaseException | None]
#: How a ``Writer`` reports a commit: ``done(outcomes, None)``, or ``done(None, error)``
#: when the commit failed as a whole (``StoreError``: nothing of it can be trusted written).
Done: TypeAlias = Callable[[Outcomes | None, BaseException | None], None]


class Nodes(Protocol):
    """What nodes publish: trust items (certificates, revocations) and heartbeats (the
    ``nodes`` rows people read; nothing trusts a key for them)."""

    def publish_trust(self, item_id: str, kind: str, body: bytes, now: float) -> None:
        """Keep a trust item (a certificate or revocation: opaque bytes) under ``item_id``;
        a second publication of the same id is a no-op."""

    def trust_items(self) -> builtins.list[tuple[str, bytes]]:
        """Every trust item as ``(kind, body)``, oldest first."""

    def heartbeat(self, node_id: str, public_key: bytes, serves: Sequence[str],
                  capabilities: Sequence[str], now: float, live_until: float) -> None:
        """Note that ``node_id`` (signing with ``public_key``, for people to read: who a key
        speaks for comes from its certificate, never from this row) is alive at ``now`` and
        counts as live until ``live_until`` unless it beats again, and what it serves."""

    def node_gone(self, node_id: str, now: float) -> None:
        """Note that ``node_id`` stopped at ``now``: it no longer counts as live."""

    def live_nodes(self, now: float) -> builtins.list[NodeInfo]:
        """Nodes live at ``now``: their last heartbeat holds until then and they did not
        stop since."""


class Objects(Protocol):
    """Index rows: creating objects and finding them."""

    def create(self, new: NewObject, now: float) -> bool:
        """Insert an object and its first record; ``False`` if the id already exists, or
        if ``new`` has a dedupe key that a live object of its queue holds."""

    def get(self, object_id: str) -> ObjectRow | None:
        """The object's row, or ``None``."""

    def list(
        self,
        *,
        status: str | None = None,
        phase: str | None = None,
        agent: str | None = None,
        parent: str | None = None,
        limit: int = 100,
    ) -> builtins.list[ObjectRow]:
        """Rows matching the filters, newest first."""


class Records(Protocol):
    """Memory: an object's records, and the commit seals that sign shared commits."""

    def records(self, object_id: str, after_seq: int = 0) -> builtins.list[Record]:
        """The object's records with ``seq > after_seq`` in order, decoded fail-closed."""

    def record(self, object_id: str, seq: int) -> Record | None:
        """The object's record ``seq``, decoded fail-closed, or ``None``."""

    def chain(self, object_id: str, after_seq: int = 0, start_hash: str = GENESIS_HASH
              ) -> builtins.list[Record]:
        """``records``, with sequence, links and hashes checked from ``start_hash`` (the
        hash of record ``after_seq``); ``IntegrityError`` or ``RecordDecodeError`` on
        damage. What a node reads when it claims an object."""

    def seals(self, digests: Sequence[bytes]) -> dict[bytes, CommitSeal]:
        """The stored commit seals among ``digests``, by digest (missing ones left out)."""


class Leases(Protocol):
    """Claims and leases, timers, control flags, and wake-ups of idle nodes."""

    def claim(self, owner: str, now: float, lease_until: float, limit: int,
              route: Route | None = None) -> builtins.list[Claim]:
        """Lease up to ``limit`` runnable objects that ``route`` can serve, bumping epochs;
        objects of a queue only as far as its limits let (``Queues``)."""

    def renew(self, object_id: str, epoch: int, lease_until: float) -> Claim | None:
        """Extend a lease still held at ``epoch``; ``None`` if it was lost."""

    def leases_held(self, owner_prefix: str, now: float) -> builtins.list[tuple[str, str, int]]:
        """Live leases whose owner starts with ``owner_prefix``: ``(object_id, owner, epoch)``."""

    def expire_lease(self, object_id: str, owner: str, epoch: int, now: float) -> bool:
        """End a lease now if ``owner`` still holds it at ``epoch`` (its process is gone)."""

    def next_ready_at(self) -> float | None:
        """Earliest ``ready_at`` among runnable objects, for idle workers to sleep until."""

    def control(
        self,
        object_id: str,
        now: float,
        *,
        paused: bool | None = None,
        cancel: bool = False,
        unpark: bool = False,
    ) -> ObjectRow:
        """Set pause/cancel flags or unpark; returns the updated row."""

    def control_flags(self, object_ids: Sequence[str]) -> dict[str, tuple[int, bool, bool]]:
        """``{object_id: (epoch, cancel_requested, paused)}`` for the ids that exist."""

    def subscribe(self, callback: Callable[[str], None]) -> Callable[[], None] | None:
        """Push wake-ups: call ``callback(object_id)`` when an object may have become
        runnable (created, sent an event, let go runnable or with a new due time, asked to
        cancel, resumed or unparked, its dead holder's lease ended); returns a function
        that stops it, or ``None`` if the store cannot push here (nodes then poll).

        ``object_id`` is ``""`` when anything may have changed (the store's channel was
        down and notifications may have been missed): look at everything again. A
        callback runs on the store's thread (a commit's or its listener's); it must be
        quick and never block. Pushes say "look", never what is there: a listener reads
        the store, and a notification too many costs it only a read. PostgreSQL pushes
        with ``LISTEN``/``NOTIFY``; SQLite through a folder of Unix sockets beside the
        file (``FILE.wake/``, every process on the machine); the memory store calls back
        in process.
        """

    def subscribe_results(self, callback: Callable[[str], None], *,
                          object_id: str | None = None, changes: bool = False
                          ) -> Callable[[], None] | None:
        """Push what callers wait for: call ``callback(object_id)`` when an object
        (``object_id`` only, if given) ended (its terminal record committed) or was
        parked, and with ``changes`` also whenever records were committed to it (what a
        follower reads). Returns a function that stops it, or ``None`` if the store cannot
        push that here (callers then poll): PostgreSQL pushes ends but not changes.
        ``""`` and the callback's thread as for ``subscribe``. A result learned this way
        is still read from the object's signed terminal record."""


class Queues(Protocol):
    """Named queues (``perdure.core.flow``): their limits, shared by every node through
    the store, and what each holds. ``Leases.claim`` respects them: it counts a queue's
    slots (its objects under a live lease) in the claim itself, one claim per queue at
    a time, and takes only what ``flow.admit`` lets it; objects without a queue are
    claimed as before, never waiting for a queue's lock."""

    def declare_queue(self, queue: Queue, now: float) -> Queue | None:
        """Keep ``queue``'s limits (a later declaration of the same name replaces them);
        the limits it replaced, if they differed, else ``None``."""

    def queues(self) -> builtins.list[Queue]:
        """Every declared queue, by name."""

    def queue_stats(self, now: float) -> builtins.list[QueueStats]:
        """Every declared queue and what it holds at ``now`` (leases judged as a claim
        judges them), by name."""

    def queue_holder(self, queue: str, dedupe_key: str) -> str | None:
        """The id of the object of ``queue`` that is not terminal and holds ``dedupe_key``,
        if there is one."""

    def debounce_start(self, object_id: str, dedupe_key: str, name: str, payload: bytes,
                       seal: bytes, ready_at: float, now: float) -> bool:
        """Collapse a start into ``object_id``, the live object holding ``dedupe_key``
        (a debounce key), if no node ever claimed it: queue the event ``name`` (with its
        ``seal``, no dedupe key, waking nothing) and put its first claim off to
        ``ready_at`` (unless it was asked to cancel), in one transaction; ``True``.
        ``False`` when the object is gone, ended, holds another key, or started already:
        then the key is taken from a started holder (it goes on; the next start with the
        key makes a new object). A claim and this exclude each other: an object is
        claimed with the event in its inbox, or the event is refused."""


class ModelQuotas(Protocol):
    """Model quotas (``perdure.core.quotas``): tokens and requests per minute per
    provider and model, shared by every node. A call reserves its estimate before it is
    sent and settles it to what the provider reported; reservations of one quota are
    serialised (PostgreSQL: the quota's row locked; SQLite: the write lock), so calls
    from every node together stay within it. A settled reservation counts for the
    quota's window from when it was settled; one in flight counts from when it was made,
    and past that while its object's lease is live: one whose worker died is never
    settled and leaves the window once the lease lapsed."""

    def declare_model_quota(self, quota: ModelQuota, now: float) -> ModelQuota | None:
        """Keep ``quota``'s limits (a later declaration of the same provider and model
        replaces them; what 429s taught is kept); those it replaced, if they differed."""

    def model_quotas(self) -> builtins.list[ModelQuota]:
        """Every declared quota, by provider and model."""

    def reserve_quota(self, provider: str, model: str, tokens: int, object_id: str,
                      holder: str, now: float) -> QuotaGrant:
        """Reserve ``tokens`` and one request of the quota of ``provider``'s ``model`` for
        a call of ``object_id`` (``holder`` names the call, for people) if they fit its
        window at ``now`` (``quotas.admit``); granted with no ticket when the model has no
        quota. A reservation not settled yet stays in the window past its time while the
        object's lease is live (the call may still be at the provider)."""

    def settle_quota(self, ticket: int, tokens: int, now: float) -> None:
        """Settle reservation ``ticket`` to ``tokens`` (what the provider reported) at
        ``now``; a reservation that left the window already is not there to settle."""

    def quota_throttled(self, provider: str, model: str, retry_after: float | None,
                        now: float) -> QuotaState | None:
        """The provider answered 429 for ``model``: adapt its quota (``quotas.throttled``)
        and return the new state (``None``: no quota declared)."""

    def quota_stats(self, now: float) -> builtins.list[QuotaStats]:
        """Every declared quota and its window at ``now``, by provider and model."""


class Inbox(Protocol):
    """Events waiting to be folded into an object's memory."""

    def send(
        self, object_id: str, name: str, payload: bytes, dedupe_key: str | None, now: float,
        seal: bytes = b"",
    ) -> bool:
        """Queue an event (with its ``seal``, kept as given); ``False`` if ``dedupe_key``
        was seen before for this object.

        A released object waiting for ``name`` becomes runnable now; so does any released
        object for a control event (a name starting with ``perdure:``).
        """

    def pending_events(self, object_id: str) -> builtins.list[Event]:
        """Unconsumed events in arrival order."""


class Writer(Protocol):
    """What commits one node's batches of appends from its event loop.

    The node's committer hands it one batch at a time, on the event loop's thread, and
    learns the outcome through ``done``. Whether the commit runs on the loop itself, is
    awaited on it, or goes to the node's write thread is the writer's business; the
    committer only asks whether the next commit will hold the loop (``holds_loop``).
    """

    @property
    def holds_loop(self) -> bool:
        """Whether the next commit runs on the event loop and holds it until done: the
        committer then starts it at the end of the loop's turn, so that every append
        submitted during the turn shares it; otherwise a commit starts as soon as it has
        its share of the waiting appends."""

    @property
    def loop_commits(self) -> int:
        """How many commits this writer made on the event loop, or awaited there."""

    def write(self, loop: asyncio.AbstractEventLoop, ops: Sequence[Append], now: float,
              seals: Sequence[CommitSeal], done: Done) -> None:
        """Commit ``ops`` and ``seals`` as ``Writes.apply`` does, and call ``done`` once,
        on ``loop``'s thread, with the outcome; possibly before returning. Every failure
        goes to ``done`` (``StoreError`` for the expected ones); a ``BaseException`` that
        is not an ``Exception`` goes to ``done`` and is raised too."""


class Writes(Protocol):
    """Fenced group commits: every write a node makes to an object it holds."""

    def apply(self, ops: Sequence[Append], now: float, seals: Sequence[CommitSeal] = ()
              ) -> Outcomes:
        """Apply fenced appends in one commit, on the calling thread (waiting for locks as
        need be); per op ``None`` or the error refusing it.

        ``seals`` are stored in the same commit, whether or not every append goes
        through (a commit seal only vouches for the hashes it lists).
        """

    def writer(self, executor: concurrent.futures.Executor) -> Writer:
        """The writer of a node's event loop. ``executor`` is the node's write thread,
        where whatever must block can run; ``ThreadWriter(self.apply, executor)`` is the
        writer of a store with nothing better."""

    async def open_async(self) -> None:
        """Make ready what the running event loop's commits need (a connection of its
        own, say), so that the first commit does not wait for it; a worker calls this as
        it starts. ``StoreError`` if the store cannot be reached."""

    async def close_async(self) -> None:
        """Release what the running event loop's commits held."""

    def check_damage(self) -> None:
        """``StoreCorruptError`` if the store's own bytes are damaged, found by checking
        what the backend can check at once (every page of a SQLite file); a worker calls
        this before it claims anything. ``StoreError`` if the store cannot be reached."""


class DataKeyRows(Protocol):
    """Objects' wrapped data keys (``perdure.core.sealing``): opaque bytes to the store,
    kept outside the hash chain so that re-wrapping rewrites no record."""

    def data_key(self, object_id: str) -> DataKeyRow | None:
        """The object's wrapped data key, if it has one."""

    def put_data_key(self, row: DataKeyRow, now: float) -> DataKeyRow:
        """Keep ``row`` unless the object has a data key already; the row kept."""

    def data_keys_not_under(self, key_id: str, after: str, limit: int
                            ) -> builtins.list[DataKeyRow]:
        """Up to ``limit`` data keys wrapped under another key than ``key_id``, of
        objects whose ids sort after ``after``, in id order."""

    def rewrap_data_key(self, old: DataKeyRow, key_id: str, wrapped: bytes,
                        now: float) -> bool:
        """Replace ``old`` (only if the row is still exactly it) by ``wrapped`` under
        ``key_id``; whether it was replaced."""

    def data_key_counts(self) -> dict[str, int]:
        """How many data keys each key-encryption key id wraps."""


class Checkpoints(Protocol):
    """Slots of superseding state (``CheckpointRow``): one row per ``(object_id, slot)``,
    upserted, so only the latest value is kept. Writes are fenced like appends: only
    while the object's row still has the writer's ``epoch`` and a lease owner."""

    def put_checkpoint(self, row: CheckpointRow) -> bool:
        """Upsert ``row`` if the object's lease is still at ``row.epoch``; whether it was
        written (``False``: the lease moved on, nothing changed)."""

    def checkpoints(self, object_id: str) -> builtins.list[CheckpointRow]:
        """Every slot row of ``object_id``, by slot."""

    def delete_checkpoints(self, object_id: str, slots: Sequence[str] | None,
                           epoch: int | None) -> bool:
        """Delete ``slots`` of ``object_id`` (``None``: all of them), fenced on ``epoch``
        as ``put_checkpoint`` is (``None``: unfenced, for an object that ended); whether
        the fence held."""


class AlertRows(Protocol):
    """Alerts and notifications that many nodes evaluate: each write is conditional, so
    of the nodes seeing the same condition exactly one fires it (or resolves it), and
    only that node delivers."""

    def fire_alert(self, rule: str, subject: str, summary: str, node_id: str,
                   now: float) -> bool:
        """Mark ``(rule, subject)`` firing unless it is firing already; whether this call
        did (a resolved alert fires again)."""

    def resolve_alert(self, rule: str, subject: str, now: float) -> AlertRow | None:
        """Mark ``(rule, subject)`` resolved if it is firing; the row as it was firing
        when this call resolved it, else ``None``."""

    def alerts(self, *, state: str | None = None, rule_prefix: str = "",
               limit: int = 100) -> builtins.list[AlertRow]:
        """Up to ``limit`` alerts (only ``state`` ones if given, only rules starting with
        ``rule_prefix``), latest fired or resolved first."""


class Browse(Protocol):
    """What people look at (the dashboard): read-only, and no node needs any of it."""

    def browse(self, where: ObjectFilter, *, after: tuple[float, str] | None = None,
               limit: int = 50, now: float) -> builtins.list[ObjectRow]:
        """Up to ``limit`` rows matching ``where`` (derived statuses judged at ``now``),
        newest first by ``(created_at, object_id)`` with ids ascending among equal times,
        only those after the key ``after`` in that order (paging by key, never offset)."""

    def records_of_kinds(self, object_id: str, kinds: Sequence[str], limit: int
                         ) -> builtins.list[Record]:
        """The object's records whose kind is among ``kinds``, oldest first, at most
        ``limit``, decoded fail-closed."""

    def status_counts(self) -> dict[str, int]:
        """How many objects hold each stored status (statuses no object holds left out)."""

    def object_counts(self) -> builtins.list[ObjectCount]:
        """How many objects each agent has in each status (``ObjectCount``), groups of
        none left out: one grouped read of the index, whatever the number of objects
        (what a metrics scrape asks)."""

    def awaiting_outside(self, limit: int) -> builtins.list[ObjectRow]:
        """Up to ``limit`` dormant objects no node holds that wait for an event someone
        outside may send (a name not starting with ``perdure:``), most recently updated
        first."""

    def lease_holders(self, now: float, limit: int) -> builtins.list[tuple[str, str]]:
        """``(object_id, lease_owner)`` of up to ``limit`` leases live at ``now``, by id."""

    def queue_key_holders(self, queue: str, now: float, limit: int
                          ) -> builtins.list[tuple[str | None, int]]:
        """``(queue_key, slots)`` of the keys of ``queue`` whose objects hold slots (live
        leases) at ``now``, most slots first (then by key), at most ``limit``; objects
        started without a key count under ``None``."""

    def ended_since(self, since: float) -> builtins.list[tuple[str, float]]:
        """``(status, updated_at)`` of every object that completed, failed or was
        cancelled, last updated at or after ``since``."""

    def updated_since(self, since: float, limit: int) -> builtins.list[str]:
        """Ids of up to ``limit`` objects updated at or after ``since``, latest first."""

    def bodies_since(self, object_ids: Sequence[str], kinds: Sequence[str], since_us: int
                     ) -> builtins.list[RecordBody]:
        """The records of ``object_ids`` whose kind is among ``kinds``, written at or after
        ``since_us`` (microseconds since the epoch), by object id then seq."""

    def sent_at(self, event_ids: Sequence[int]) -> dict[int, float]:
        """When each of ``event_ids`` was sent to an inbox (ids not found left out)."""


class Store(Nodes, Objects, Records, Leases, Queues, ModelQuotas, Inbox, DataKeyRows,
            Checkpoints, Writes, AlertRows, Browse, Protocol):
    """Narrow storage interface: rows, records, leases, timers, inbox, node keys, and
    the read-only ``Browse`` role people look through.

    Every role above, plus ``url`` (shown in banners and errors, password masked) and
    ``close``.
    """

    url: str

    def close(self) -> None:
        """Release connections."""
