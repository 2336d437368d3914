"""Appending to one object's memory under one lease: seal, fence, group-commit."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from perdure.core.chain import CommitSeal, Signer, seal, seal_parts, signed
from perdure.core.records import Record, RecordDraft
from perdure.errors import StoreError
from perdure.stores.base import Append, Signal, Store

__all__ = ["Committer", "Journal", "StoreUnavailable"]


class StoreUnavailable(BaseException):
    """The store failed mid-run; the node abandons the object and its lease lapses."""

    def __init__(self, cause: StoreError) -> None:
        super().__init__(str(cause))
        self.cause = cause


class Committer:
    """Group commit: appends submitted while a commit runs go together in the next one.

    Records arrive hashed but not signed: the write thread signs them (Ed25519 runs
    outside the GIL) just before the store writes them, so the event loop spends
    none of its time on signatures. A commit of one record gets a signature of its
    own; a commit of several gets one commit seal, a single signature over all
    their hashes stored beside them, so many objects sharing a commit also share
    its signature while every record stays verifiable on its own.
    """

    def __init__(
        self,
        store: Store,
        executor: concurrent.futures.Executor,
        clock: Callable[[], float] = time.time,
        signer: Signer | None = None,
    ) -> None:
        self._store = store
        self._executor = executor
        self._clock = clock
        self._signer = signer
        self._pending: list[tuple[Append, asyncio.Future[list[Record]]]] = []
        self._flushing = False  # a commit is with the write thread
        self._deferred = False  # a start is scheduled for the loop's next turn
        self._target = 1  # appends to wait for before an idle committer starts a commit
        self.commits = 0
        self.appends = 0

    @property
    def signs(self) -> bool:
        """Whether this committer signs records on its write thread."""
        return self._signer is not None

    async def submit(self, op: Append) -> list[Record]:
        """Apply ``op`` durably; its records as stored (signed).

        Raises ``LeaseLostError`` or ``StoreError`` if refused.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Record]] = loop.create_future()
        self._pending.append((op, future))
        if not self._flushing:
            if len(self._pending) >= self._target:
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
        """Hand every pending append to the write thread as one commit.

        When a commit settles, the appends waiting and the submitters it woke are two
        cohorts; the next commit starts once it holds half of them both (at the
        latest at the end of the loop's turn), and the rest go in the one after, while
        it runs. So the loop runs the steps of one cohort while the write thread
        commits the other's, and the cohorts stay even. Starting at the first append
        instead keeps commits of one append alternating with commits of all the rest;
        waiting for everyone leaves one thread idle while the other works.

        The write thread signs and applies the batch, then schedules ``_settle`` on the
        loop, which wakes the submitters and starts the next batch if appends queued up
        meanwhile. No task and no intermediate future: this is paid on every step.
        """
        batch, self._pending = self._pending, []
        self._flushing = True
        ops, to_sign = self._sealed([op for op, _ in batch])
        now = self._clock()

        def work() -> None:
            try:
                ready, seals = self._signed(ops, to_sign)
                results = self._store.apply(ready, now, seals)
                outcome = (results, [list(op.records) for op in ready])
            except BaseException as exc:  # noqa: BLE001 - handed to the loop, raised there
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    loop.call_soon_threadsafe(self._settle, loop, batch, None, exc)
                return
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._settle, loop, batch, outcome, None)

        try:
            self._executor.submit(work)
        except RuntimeError as exc:  # the executor shut down: the node is stopping
            self._settle(loop, batch, None, exc)

    def _settle(
        self,
        loop: asyncio.AbstractEventLoop,
        batch: list[tuple[Append, asyncio.Future[list[Record]]]],
        outcome: tuple[list[BaseException | None], list[list[Record]]] | None,
        error: BaseException | None,
    ) -> None:
        if outcome is None:
            # StoreError for the expected failures; anything else is a bug that must
            # still reach each submitter instead of leaving it waiting.
            for _, future in batch:
                if not future.done():
                    future.set_exception(error or RuntimeError("commit failed"))
        else:
            self.commits += 1
            self.appends += len(batch)
            results, stored = outcome
            for (_, future), failure, records in zip(batch, results, stored, strict=True):
                if future.done():
                    continue
                if failure is None:
                    future.set_result(records)
                else:
                    future.set_exception(failure)
        self._flushing = False
        self._target = max(1, (len(self._pending) + len(batch)) // 2)
        if len(self._pending) >= self._target:
            self._start(loop)
        elif self._pending and not self._deferred:
            self._deferred = True
            loop.call_soon(self._start_deferred, loop)

    def _sealed(self, ops: list[Append]) -> tuple[list[Append], tuple[bytes, bytes] | None]:
        """On the loop: a batch of several unsigned records is put under one commit seal
        (the records get its reference); the seal's digest and hash list, left for the
        write thread to sign, or ``None`` when there is no seal to sign."""
        signer = self._signer
        if signer is None:
            return ops, None
        unsigned = [rec for op in ops for rec in op.records if not rec.signature]
        if len(unsigned) < 2:
            return ops, None
        digest, hashes, refs = seal_parts(unsigned, signer.node_id)
        done = iter(refs)
        return [_with_records(op, [rec if rec.signature else next(done) for rec in op.records])
                if any(not rec.signature for rec in op.records) else op
                for op in ops], (digest, hashes)

    def _signed(self, ops: list[Append], to_sign: tuple[bytes, bytes] | None
                ) -> tuple[list[Append], list[CommitSeal]]:
        """On the write thread: sign the commit seal, or the one unsigned record."""
        signer = self._signer
        if signer is None:
            return ops, []
        if to_sign is not None:
            digest, hashes = to_sign
            return ops, [CommitSeal(digest, signer.node_id, hashes, signer.sign(digest))]
        ready = []
        for op in ops:
            if any(not rec.signature for rec in op.records):
                op = _with_records(op, [rec if rec.signature else signed(rec, signer)
                                        for rec in op.records])
            ready.append(op)
        return ready, []


_APPEND_FIELDS = tuple(f.name for f in dataclasses.fields(Append))


def _with_records(op: Append, records: list[Record]) -> Append:
    """``op`` with other ``records`` (``dataclasses.replace`` costs twice as much, per
    append of every commit)."""
    new = object.__new__(Append)
    for name in _APPEND_FIELDS:
        object.__setattr__(new, name, getattr(op, name))
    object.__setattr__(new, "records", records)
    return new


@dataclass
class Journal:
    """The head of one object's chain as this node holds it, and the way to extend it."""

    object_id: str
    epoch: int
    head_seq: int
    head_hash: str
    trace_id: str
    signer: Signer
    policy_ref: str
    committer: Committer
    clock: Callable[[], float]
    claimed_at: float

    def __post_init__(self) -> None:
        self.buffer: list[RecordDraft] = []

    def defer(self, draft: RecordDraft) -> None:
        """Queue a record that may be lost in a crash (it will be re-derived on replay)."""
        self.buffer.append(draft)

    def _seal(self, drafts: Sequence[RecordDraft]) -> list[Record]:
        records: list[Record] = []
        seq, prev = self.head_seq, self.head_hash
        ts_us = int(self.clock() * 1_000_000)
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
                sign=not self.committer.signs,  # else the write thread signs
            )
            records.append(rec)
            prev = rec.hash
        return records

    async def commit(
        self,
        drafts: Sequence[RecordDraft] = (),
        *,
        status: str = "running",
        phase: str = "execution",
        ready_at: float | None = None,
        running: bool = True,
        waiting_event: str | None = None,
        release: bool = False,
        result: bytes | None = None,
        consume_event_ids: Sequence[int] = (),
        parked: bool = False,
        note: str | None = None,
        signal: Signal | None = None,
        requires: tuple[str, ...] | None = None,
        avoid_node: str | None = None,
        clear_avoid: bool = False,
    ) -> list[Record]:
        """Durably append deferred records plus ``drafts`` and update the row, fenced.

        Records are sealed onto the head at once, so concurrent commits of one
        object (parallel branches) chain in submission order and the group commit
        applies them in that order; if one is refused, the run stops.
        """
        records = self._seal([*self.buffer, *drafts])
        self.buffer.clear()
        if records:
            self.head_seq = records[-1].seq
            self.head_hash = records[-1].hash
        op = Append(
            object_id=self.object_id,
            epoch=self.epoch,
            records=records,
            status=status,
            phase=phase,
            ready_at=self.claimed_at if running else ready_at,
            waiting_event=waiting_event,
            release=release,
            result=result,
            consume_event_ids=tuple(consume_event_ids),
            parked=parked,
            note=note,
            signal=signal,
            requires=requires,
            avoid_node=avoid_node,
            clear_avoid=clear_avoid,
        )
        try:
            return await self.committer.submit(op)
        except StoreError as exc:
            raise StoreUnavailable(exc) from exc
