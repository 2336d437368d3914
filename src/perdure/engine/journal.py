"""Appending to one object's memory under one lease: seal, fence, group-commit."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from perdure.core.chain import CommitSeal, Signer, seal, seal_parts, seal_unsigned, signed
from perdure.core.lifecycle import Phase, Status
from perdure.core.records import Kind, Record, RecordDraft
from perdure.core.sealing import redact
from perdure.errors import CancelRequestedError, LeaseLostError, PerdureSignal, StoreError
from perdure.hooks import CommitBatch, Hooks, RecordsWritten
from perdure.stores.base import Append, Outcomes, Signal, Store, Writer

if TYPE_CHECKING:
    from perdure.engine.slots import Slots

__all__ = ["Committer", "HistoryEnd", "Journal", "StoreUnavailable"]


class StoreUnavailable(PerdureSignal):
    """The store failed mid-run; the node abandons the object and its lease lapses."""

    def __init__(self, cause: StoreError) -> None:
        super().__init__(str(cause))
        self.cause = cause


class Committer:
    """Group commit: appends submitted while a commit runs go together in the next one.

    Records arrive hashed but not signed; the committer signs them as it starts a
    commit. A commit of one record gets a signature of its own; a
    commit of several gets one commit seal, a single signature over all their hashes
    stored beside them, so many objects sharing a commit also share its signature
    while every record stays verifiable on its own.

    How a commit is made is the store's business: its writer (``Store.writer``, given
    the node's write thread for whatever must block) commits on the event loop itself,
    awaits the commit on the loop, or hands it to the thread (``perdure.stores.writers``
    has the ways). The committer only asks the writer whether its next commit will hold
    the loop: such a commit starts at the end of the loop's turn, so that every append
    submitted during the turn shares it (see ``_start`` for the others).

    Signing is done on the event loop whatever the writer: it is one signature per
    commit, and work handed to the write thread should be the store's alone.
    """

    def __init__(
        self,
        store: Store,
        executor: concurrent.futures.Executor,
        clock: Callable[[], float] = time.time,
        signer: Signer | None = None,
        *,
        hooks: Hooks | None = None,
    ) -> None:
        self._writer: Writer = store.writer(executor)
        self._clock = clock
        self._signer = signer
        self._pending: list[tuple[Append, asyncio.Future[list[Record]]]] = []
        self._flushing = False  # a commit is in flight
        self._deferred = False  # a start is scheduled for the loop's next turn
        self._target = 1  # appends to wait for before an idle committer starts a commit
        self._batch: list[tuple[Append, asyncio.Future[list[Record]]]] = []  # in flight
        self._loop: asyncio.AbstractEventLoop | None = None  # of the commit in flight
        self._done = self._settle  # what the writer calls back (bound once, not per commit)
        self._hooks = hooks if hooks is not None else Hooks()
        self._node_id = signer.node_id if signer is not None else ""
        self._began = 0.0  # when the commit in flight started (timed only for listeners)

    @property
    def signs(self) -> bool:
        """Whether this committer signs records (as it starts each commit)."""
        return self._signer is not None

    @property
    def loop_commits(self) -> int:
        """Commits made or awaited on the event loop (the others went to the thread)."""
        return self._writer.loop_commits

    async def submit(self, op: Append) -> list[Record]:
        """Apply ``op`` durably; its records as stored (signed).

        Raises ``LeaseLostError`` or ``StoreError`` if refused.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Record]] = loop.create_future()
        self._pending.append((op, future))
        if not self._flushing:
            if len(self._pending) >= self._target and not self._writer.holds_loop:
                self._start(loop)
            elif not self._deferred:
                self._deferred = True
                loop.call_soon(self._start_deferred, loop)
        # No shield needed: a cancelled submitter cancels only its own future; the
        # append stays queued and ``_settle`` skips a future that is done.
        return await future

    def _start_deferred(self, loop: asyncio.AbstractEventLoop) -> None:
        self._deferred = False
        if self._pending and not self._flushing:
            self._start(loop)

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Commit every pending append as one, through the store's writer.

        When a commit settles, the appends waiting and the submitters it woke are two
        cohorts; the next commit starts once it holds half of them both (at the
        latest at the end of the loop's turn), and the rest go in the one after, while
        it runs. So the loop runs the steps of one cohort while the store commits the
        other's, and the cohorts stay even. Starting at the first append instead keeps
        commits of one append alternating with commits of all the rest; waiting for
        everyone leaves one side idle while the other works. A commit that holds the
        loop starts at the end of the loop's turn instead, with everything submitted
        during it.

        When the commit is done, the writer calls ``_settle``, which wakes the
        submitters and starts the next batch if appends queued up meanwhile. No task per
        append and no intermediate future: this is paid on every step.
        """
        batch, self._pending = self._pending, []
        self._flushing = True
        self._batch, self._loop = batch, loop
        ops = [op for op, _ in batch]
        seals = self._signed(ops)
        if self._hooks.active:
            self._began = time.perf_counter()
        self._writer.write(loop, ops, self._clock(), seals, self._done)

    def _settle(self, results: Outcomes | None, error: BaseException | None) -> None:
        """The writer's report of the batch in flight: wake its submitters."""
        batch, loop = self._batch, self._loop
        assert loop is not None, "a commit settles on the loop that started it"
        if results is None:
            # StoreError for the expected failures; anything else is a bug that must
            # still reach each submitter instead of leaving it waiting.
            for _, future in batch:
                if not future.done():
                    future.set_exception(error or RuntimeError("commit failed"))
        else:
            if self._hooks.active:
                self._hooks.emit(CommitBatch(
                    self._node_id, len(batch), sum(len(op.records) for op, _ in batch),
                    sum(failure is not None for failure in results),
                    time.perf_counter() - self._began))
                if self._hooks.listens(RecordsWritten):
                    written = tuple(rec for (op, _), failure in zip(batch, results, strict=True)
                                    if failure is None for rec in op.records)
                    if written:
                        self._hooks.emit(RecordsWritten(self._node_id, written))
            for (op, future), failure in zip(batch, results, strict=True):
                if future.done():
                    continue
                if failure is None:
                    future.set_result(list(op.records))
                else:
                    future.set_exception(failure)
        self._flushing = False
        self._target = max(1, (len(self._pending) + len(batch)) // 2)
        if len(self._pending) >= self._target and not self._writer.holds_loop:
            self._start(loop)
        elif self._pending and not self._deferred:
            self._deferred = True
            loop.call_soon(self._start_deferred, loop)

    def _signed(self, ops: list[Append]) -> list[CommitSeal]:
        """Sign the batch in place: several unsigned records under one commit seal (each
        gets its reference; the seal is returned), a lone one with its own signature."""
        signer = self._signer
        if signer is None:
            return []
        unsigned = [rec for op in ops for rec in op.records if not rec.signature]
        if not unsigned:
            return []
        if len(unsigned) == 1:
            done = iter([signed(unsigned[0], signer)])
            seals = []
        else:
            digest, hashes, refs = seal_parts(unsigned, signer.node_id)
            done = iter(refs)
            seals = [CommitSeal(digest, signer.node_id, hashes, signer.sign(digest))]
        for op in ops:
            if any(not rec.signature for rec in op.records):
                # A submitted append belongs to the committer alone (``Journal.commit``
                # builds it and only awaits the outcome): sign its records in place.
                op.records = [rec if rec.signature else next(done) for rec in op.records]
        return seals


#: Record kinds whose bodies quote exception messages, reasons or free text.
_QUOTING = frozenset((Kind.STEP_FAILED, Kind.TERMINATED, Kind.PARKED, Kind.NONDETERMINISM,
                      Kind.MODEL_FAILED, Kind.CAPABILITY_MISSING, Kind.CHILD_FINISHED))


@dataclass
class Journal:
    """The head of one object's chain as this node holds it, and the way to extend it.

    A journal without a committer (``Journal.read_only``) is read-only by design: it
    seals nothing and writes nothing, and ``commit`` raises ``HistoryEnd``. A replay
    checker runs the agent against memory through one: the run ends where it would
    first write, past the recorded history.
    """

    object_id: str
    epoch: int
    head_seq: int
    head_hash: str
    trace_id: str
    signer: Signer
    policy_ref: str
    committer: Committer | None  # None: read-only
    clock: Callable[[], float]
    claimed_at: float
    #: Told ``(seq, hash)`` of the head the node leaves the object at (its seen heads).
    anchor: Callable[[int, str], None] | None = None
    #: The node's hooks: commands tell them what they record (when anyone listens).
    hooks: Hooks | None = None
    #: The node's checkpoint slots (``engine.slots``); ``None`` for a read-only journal.
    slots: Slots | None = None

    def __post_init__(self) -> None:
        self.buffer: list[RecordDraft] = []
        self.consumed: list[int] = []
        self.volatile = False
        # When the object's cancel flag was last known (``time.monotonic``): at the claim,
        # then at every commit, whose store reports a pending cancel back.
        self.flags_at = time.monotonic()
        self.cancel_seen = False  # a commit reported a pending cancel: no step starts now
        self.delegated: list[str] = []  # children ``run.delegate`` recorded through it
        #: Texts of the secrets the run met (its sealer's set): error records and notes
        #: that quote one are written with ``[secret]`` in its place.
        self.secrets: set[str] = set()
        #: ``(seq, hash)`` of the newest record known durable (what a slot follows).
        self.durable_head = (self.head_seq, self.head_hash)
        #: Whether the object may have checkpoint slot rows (``engine.slots``): ``None``
        #: unknown, ``False`` none were read at the claim and none written since (its
        #: end then has none to delete).
        self.slot_rows: bool | None = None

    @classmethod
    def read_only(cls, records: Sequence[Record], *, object_id: str, signer: Signer,
                  policy_ref: str, clock: Callable[[], float] = time.time) -> Journal:
        """A journal on the head of ``records`` that never writes (see the class).

        ``signer`` only names a node to the run (nothing is signed).
        """
        head = records[-1]
        return cls(object_id=object_id, epoch=0, head_seq=head.seq, head_hash=head.hash,
                   trace_id=head.trace_id, signer=signer, policy_ref=policy_ref,
                   committer=None, clock=clock, claimed_at=clock())

    def defer(self, draft: RecordDraft, *, consume_event_ids: Sequence[int] = (),
              volatile: bool = True) -> None:
        """Queue a record that may be lost in a crash (it will be re-derived on replay).

        ``consume_event_ids`` are inbox events the record stands for: the next commit
        marks them consumed with it, in the same transaction. Until then they stay in
        the inbox, so a crash before that commit delivers the same events again on
        replay. Any other deferred record (a drawn value, a timeout) makes the buffer
        ``volatile``: replay could derive it differently, so it must be committed
        before a step's side effect can depend on it. A record nothing replays from (a
        progress note) passes ``volatile=False``: it simply goes with the next commit.
        A read-only journal queues too, and never writes what it queued.
        """
        self.buffer.append(draft)
        if consume_event_ids:
            self.consumed.extend(consume_event_ids)
        elif volatile:
            self.volatile = True

    def _seal(self, drafts: Sequence[RecordDraft], signs: bool) -> list[Record]:
        """``drafts`` chained onto the head; unsigned when the committer ``signs``."""
        seq, prev = self.head_seq, self.head_hash
        ts_us = int(self.clock() * 1_000_000)
        if signs:  # the committer signs as the commit starts
            quick = seal_unsigned(drafts, object_id=self.object_id, seq=seq, prev_hash=prev,
                                  trace_id=self.trace_id, ts_us=ts_us,
                                  node_id=self.signer.node_id, policy_ref=self.policy_ref)
            if quick is not None:
                return quick
        records: list[Record] = []
        for draft in drafts:
            seq += 1
            rec = seal(
                draft,
                object_id=self.object_id,
                seq=seq,
                prev_hash=prev,
                trace_id=self.trace_id,
                ts_us=ts_us,
                policy_ref=self.policy_ref,
                signer=self.signer,
                sign=not signs,  # else the committer signs
            )
            records.append(rec)
            prev = rec.hash
        return records

    def redacted(self, draft: RecordDraft) -> RecordDraft:
        """``draft`` with the secrets' texts replaced in the bodies that quote errors or
        reasons (a step's or the agent's failure, a park, a note); others as they are."""
        if (draft.kind not in _QUOTING or not self.secrets
                or draft.body.get("outcome") == "completed"):  # a result: sealed as it must be
            return draft
        return RecordDraft(draft.kind, redact(draft.body, self.secrets))

    async def commit(
        self,
        drafts: Sequence[RecordDraft] = (),
        *,
        status: Status = Status.RUNNING,
        phase: Phase = Phase.EXECUTION,
        ready_at: float | None = None,
        running: bool = True,
        waiting_event: str | None = None,
        release: bool = False,
        result: bytes | None = None,
        unless_cancelled: bool = False,
        consume_event_ids: Sequence[int] = (),
        parked: bool = False,
        note: str | None = None,
        signal: Signal | None = None,
        cancel_children: bool = False,
        requires: tuple[str, ...] | None = None,
        avoid_node: str | None = None,
        clear_avoid: bool = False,
    ) -> list[Record]:
        """Durably append deferred records plus ``drafts`` and update the row, fenced;
        mark the deferred records' events and ``consume_event_ids`` consumed.

        Records are sealed onto the head at once, so concurrent commits of one
        object (parallel branches) chain in submission order and the group commit
        applies them in that order; if one is refused, the run stops. A read-only
        journal raises ``HistoryEnd`` instead, having written nothing.
        """
        committer = self.committer
        if committer is None:
            raise HistoryEnd(self.object_id)
        if self.secrets:
            drafts = [self.redacted(d) for d in drafts]
            note = None if note is None else redact(note, self.secrets)
        records = self._seal([*self.buffer, *drafts], committer.signs)
        before = self.head_seq, self.head_hash
        self.buffer.clear()
        self.volatile = False
        if self.consumed:
            consume_event_ids = [*self.consumed, *consume_event_ids]
            self.consumed.clear()
        if records:
            self.head_seq = records[-1].seq
            self.head_hash = records[-1].hash
        op = Append(
            object_id=self.object_id, epoch=self.epoch, records=records,
            # Plain strings to the store: its drivers take a ``str`` without a lookup.
            status=status._value_, phase=phase._value_,
            ready_at=self.claimed_at if running else ready_at, waiting_event=waiting_event,
            release=release, result=result, consume_event_ids=tuple(consume_event_ids),
            parked=parked, note=note, signal=signal, requires=requires, avoid_node=avoid_node,
            clear_avoid=clear_avoid, unless_cancelled=unless_cancelled,
            cancel_children=cancel_children,
        )
        try:
            stored = await committer.submit(op)
        except LeaseLostError:
            self.head_seq, self.head_hash = before  # refused: nothing was written
            raise
        except StoreError as exc:
            raise StoreUnavailable(exc) from exc
        except CancelRequestedError:
            # Written, with a cancel pending; a refused completion wrote nothing.
            self.cancel_seen = True
            if unless_cancelled:
                self.head_seq, self.head_hash = before
            self.flags_at = time.monotonic()
            raise
        if records and records[-1].seq > self.durable_head[0]:
            self.durable_head = (records[-1].seq, records[-1].hash)
        if release and self.anchor is not None:
            # The head this node leaves the object at is the one it must find again:
            # noted as it lets go (the heads of a run in progress are its own to know).
            self.anchor(self.head_seq, self.head_hash)
        self.flags_at = time.monotonic()
        return stored


class HistoryEnd(PerdureSignal):
    """A read-only journal was asked to write: the run went past the memory it was given.

    Replay checking ends there (the object would carry on from that point); nothing
    was written.
    """
