"""A LangGraph checkpointer on perdure's stores: ``pip install 'perdure[langgraph]'``.

Keep the graph, swap the checkpointer::

    app = App(store="sqlite:///agents.db")
    graph = builder.compile(checkpointer=PerdureSaver(app))

``PerdureSaver(app)`` is a ``BaseCheckpointSaver`` (sync and async). Each LangGraph
thread, in each checkpoint namespace, is a perdure object (id ``langgraph/<thread>`` or
``langgraph/<thread>/<namespace>``, percent-quoted; agent ``langgraph.thread``) whose
memory holds the thread's checkpoints and pending writes as signed, hash-chained
``emitted`` records: ``perdure verify``, ``perdure show`` and the dashboard work over
threads as over any object.

Storage grows with what changed: a checkpoint record holds the checkpoint without its
channel values, plus the value of each channel whose version changed at that step (what
``new_versions`` names), as LangGraph's own savers keep one blob per channel version.
Values are the bytes of the saver's ``serde`` (LangGraph's ``JsonPlusSerializer``),
base64 in the record body.

Reads check what they read as a worker checks a claimed object's memory: links and
hashes, and the newest record's signature under a key certified by a root the App's node
trusts (``IntegrityError`` otherwise); each saver reads only the records after those it
holds. ``perdure verify`` checks every signature.

The saver is the thread object's only writer: every append is fenced on the object's
head, so two savers writing one thread at once cannot fork its chain (the one refused
reads the new head and appends after it). No worker runs a thread object: it waits for an
event nobody sends. ``delete_thread`` appends a record saying so: memory is append-only
and keeps what was written before, but reads no longer see it.
"""

from __future__ import annotations

import asyncio
import base64
import random
import threading
import urllib.parse
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from perdure.core.bodies import Emitted, Instantiated
from perdure.core.chain import seal
from perdure.core.intent import Context, Intent
from perdure.core.lifecycle import HELD_BACK_UNTIL, Phase, Status
from perdure.core.records import GENESIS_HASH, Kind, Record
from perdure.errors import ConfigurationError, IntegrityError, LeaseLostError, StoreError
from perdure.stores.base import Append, NewObject, ObjectFilter

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

    from perdure.app import App

__all__ = ["AGENT", "PerdureSaver", "thread_object_id"]

#: The agent name of every thread object (no worker runs it).
AGENT = "langgraph.thread"
_VERSION = "1"
_PREFIX = "langgraph/"
#: What a thread object waits for: an event of perdure's own nobody sends, so no worker
#: claims it and an update request does not wake it.
_NEVER = "perdure:langgraph"
_CHECKPOINT = "langgraph.checkpoint"
_WRITES = "langgraph.writes"
_DELETED = "langgraph.deleted"
_TRIES = 20


def thread_object_id(thread_id: str, checkpoint_ns: str = "") -> str:
    """The perdure object id holding LangGraph thread ``thread_id``'s checkpoints in
    namespace ``checkpoint_ns`` (``""``: the graph's own, others: its subgraphs')."""
    oid = _PREFIX + urllib.parse.quote(str(thread_id), safe="")
    if checkpoint_ns:
        oid += "/" + urllib.parse.quote(checkpoint_ns, safe="")
    return oid


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)


@dataclass(slots=True)
class _Saved:
    """One checkpoint as its record holds it."""

    checkpoint_id: str
    parent_id: str | None
    checkpoint: tuple[str, bytes]
    metadata: tuple[str, bytes]


#: A checkpoint's pending writes: ``task_id, idx`` -> ``task_path, channel, (type, bytes)``
_Writes = dict[tuple[str, int], tuple[str, str, tuple[str, bytes]]]


@dataclass(slots=True)
class _Thread:
    """What a thread object's memory says, read up to ``seq``."""

    thread_id: str
    ns: str
    seq: int = 0
    head: str = GENESIS_HASH
    first: str = GENESIS_HASH
    epoch: int = 0
    trace_id: str = ""
    checkpoints: dict[str, _Saved] = field(default_factory=dict)
    #: ``(channel, version)`` -> the value's ``(type, bytes)``
    blobs: dict[tuple[str, str], tuple[str, bytes]] = field(default_factory=dict)
    #: checkpoint id -> its pending writes (LangGraph may store a checkpoint's writes
    #: before the checkpoint itself: the saver's calls run in the background)
    writes: dict[str, _Writes] = field(default_factory=dict)

    def fold(self, rec: Record) -> None:
        """Take one more record of the thread's memory in."""
        self.seq, self.head = rec.seq, rec.hash
        if rec.kind == Kind.INSTANTIATED:
            self.trace_id, self.first = rec.trace_id, rec.hash
            return
        if rec.kind != Kind.EMITTED:
            return
        body = rec.body
        name, data = body.get("name"), body.get("data")
        if not isinstance(data, dict):
            return
        if name == _DELETED:
            self.checkpoints.clear()
            self.blobs.clear()
            self.writes.clear()
        elif name == _CHECKPOINT:
            for channel, (version, kind, value) in data["blobs"].items():
                self.blobs[(channel, _version_key(version))] = (kind, _unb64(value))
            cp, md = data["checkpoint"], data["metadata"]
            self.checkpoints[data["id"]] = _Saved(
                data["id"], data.get("parent"), (cp[0], _unb64(cp[1])), (md[0], _unb64(md[1])))
        elif name == _WRITES:
            writes = self.writes.setdefault(data["checkpoint"], {})
            for idx, channel, kind, value in data["writes"]:
                key = (data["task"], idx)
                if idx >= 0 and key in writes:
                    continue  # a regular write is kept as first written
                writes[key] = (data.get("path", ""), channel, (kind, _unb64(value)))


def _version_key(version: object) -> str:
    """A channel version as a key (LangGraph's are str, int or float)."""
    return repr(version)


class PerdureSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer keeping each thread as a perdure object (see the module).

    ``app``: the perdure ``App`` whose store and key folder the threads use (its node
    key signs every record). ``serde``: LangGraph's serializer (its default, the
    ``JsonPlusSerializer``, when ``None``). Thread-safe; the async methods run the same
    work on a thread.
    """

    def __init__(self, app: App, *, serde: SerializerProtocol | None = None) -> None:
        super().__init__(serde=serde)
        self.app = app
        self._lock = threading.RLock()
        self._threads: dict[str, _Thread] = {}

    # -- reading ----------------------------------------------------------------------

    def _read(self, thread_id: str, ns: str) -> _Thread | None:
        """The thread's memory folded, brought up to the object's head (``None``: no
        such thread object)."""
        oid = thread_object_id(thread_id, ns)
        store = self.app.store
        row = store.get(oid)
        if row is None:
            with self._lock:
                self._threads.pop(oid, None)
            return None
        if row.agent != AGENT:
            raise ConfigurationError(
                f"object {oid!r} runs agent {row.agent!r}, not a LangGraph thread")
        with self._lock:
            known = self._threads.get(oid)
            if known is not None and known.seq == row.head_seq and known.head == row.head_hash:
                known.epoch = row.epoch
                return known
            if known is None or known.seq > row.head_seq:
                known = _Thread(thread_id, ns)
            try:
                tail = store.chain(oid, after_seq=known.seq, start_hash=known.head)
            except IntegrityError:
                if not known.seq:
                    raise
                known = _Thread(thread_id, ns)  # what was held is not this memory's past
                tail = store.chain(oid)
            if tail:
                # links and hashes are checked: the newest record's signature, under a
                # key a root this node trusts certified, vouches for every one before it
                self.app.client.verifier.check_head(oid, tail)
            for rec in tail:
                known.fold(rec)
            known.epoch = row.epoch
            self._threads[oid] = known
            return known

    def _tuple(self, thread: _Thread, saved: _Saved) -> CheckpointTuple:
        checkpoint: Checkpoint = self.serde.loads_typed(saved.checkpoint)
        values: dict[str, Any] = {}
        for channel, version in checkpoint["channel_versions"].items():
            blob = thread.blobs.get((channel, _version_key(version)))
            if blob is not None and blob[0] != "empty":
                values[channel] = self.serde.loads_typed(blob)
        checkpoint = {**checkpoint, "channel_values": values}
        writes = sorted(thread.writes.get(saved.checkpoint_id, {}).items(),
                        key=lambda kv: writes_sort_key(kv[1][0], kv[0][0], kv[0][1]))
        configurable = {"thread_id": thread.thread_id, "checkpoint_ns": thread.ns}
        return CheckpointTuple(
            config={"configurable": {**configurable, "checkpoint_id": saved.checkpoint_id}},
            checkpoint=checkpoint,
            metadata=self.serde.loads_typed(saved.metadata),
            parent_config=({"configurable": {**configurable,
                                             "checkpoint_id": saved.parent_id}}
                           if saved.parent_id else None),
            pending_writes=[(task_id, channel, self.serde.loads_typed(value))
                            for (task_id, _), (_, channel, value) in writes],
        )

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names (its ``checkpoint_id``), or the thread's
        latest in its namespace; ``None`` when there is none."""
        configurable = config.get("configurable", {})
        thread = self._read(str(configurable["thread_id"]),
                            configurable.get("checkpoint_ns", ""))
        if thread is None:
            return None
        with self._lock:
            checkpoint_id = get_checkpoint_id(config)
            if checkpoint_id:
                saved = thread.checkpoints.get(checkpoint_id)
            else:
                saved = (thread.checkpoints[max(thread.checkpoints)]
                         if thread.checkpoints else None)
            return None if saved is None else self._tuple(thread, saved)

    def _thread_keys(self, config: RunnableConfig | None) -> list[tuple[str, str]]:
        """``(thread_id, ns)`` of the thread objects ``config`` asks about."""
        configurable = (config or {}).get("configurable", {})
        thread_id = configurable.get("thread_id")
        ns = configurable.get("checkpoint_ns")
        if thread_id is not None and ns is not None:
            return [(str(thread_id), ns)]
        prefix = _PREFIX if thread_id is None else thread_object_id(str(thread_id))
        keys = []
        for oid in self._object_ids(prefix):
            parts = oid[len(_PREFIX):].split("/")
            if len(parts) > 2 or (thread_id is not None and oid != prefix
                                  and not oid.startswith(prefix + "/")):
                continue
            keys.append((urllib.parse.unquote(parts[0]),
                         urllib.parse.unquote(parts[1]) if len(parts) == 2 else ""))
        return keys

    def _object_ids(self, prefix: str) -> list[str]:
        """Ids of the thread objects whose ids start with ``prefix``."""
        store, ids = self.app.store, []
        after: tuple[float, str] | None = None
        while True:
            rows = store.browse(ObjectFilter(agent=AGENT, prefix=prefix), after=after,
                                limit=500, now=self.app.clock())
            ids += [row.object_id for row in rows]
            if len(rows) < 500:
                return ids
            after = (rows[-1].created_at, rows[-1].object_id)

    def list(self, config: RunnableConfig | None, *,
             filter: dict[str, Any] | None = None,  # noqa: A002
             before: RunnableConfig | None = None, limit: int | None = None
             ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first: of the thread (and namespace, and checkpoint id)
        ``config`` names, or of every thread with ``None``; only those whose metadata
        holds every ``filter`` item, older than ``before``'s checkpoint, at most
        ``limit``."""
        before_id = get_checkpoint_id(before) if before else None
        wanted_id = get_checkpoint_id(config) if config else None
        found: list[tuple[str, _Thread, _Saved]] = []
        for thread_id, ns in self._thread_keys(config):
            thread = self._read(thread_id, ns)
            if thread is None:
                continue
            with self._lock:
                for saved in thread.checkpoints.values():
                    if wanted_id and saved.checkpoint_id != wanted_id:
                        continue
                    if before_id and saved.checkpoint_id >= before_id:
                        continue
                    found.append((saved.checkpoint_id, thread, saved))
        found.sort(key=lambda item: item[0], reverse=True)
        count = 0
        for _, thread, saved in found:
            if limit is not None and count >= limit:
                return
            if filter:
                metadata = self.serde.loads_typed(saved.metadata)
                if not all(metadata.get(k) == v for k, v in filter.items()):
                    continue
            with self._lock:
                item = self._tuple(thread, saved)
            count += 1
            yield item

    # -- writing ----------------------------------------------------------------------

    def _append(self, thread_id: str, ns: str, name: str, data: dict[str, Any]) -> None:
        """Append one ``emitted`` record to the thread object (made if need be), fenced
        on its head: refused because another writer moved it, read on and try again."""
        oid = thread_object_id(thread_id, ns)
        signer = self.app.client.certified()
        store = self.app.store
        for _ in range(_TRIES):
            thread = self._read(thread_id, ns)
            now = self.app.clock()
            if thread is None:
                self._create(oid, thread_id, ns, now)
                continue
            with self._lock:
                seq, head, epoch, trace_id = (thread.seq, thread.head, thread.epoch,
                                              thread.trace_id)
            rec = seal(Emitted(seq + 1, name, data).draft(), object_id=oid, seq=seq + 1,
                       prev_hash=head, trace_id=trace_id, ts_us=int(now * 1_000_000),
                       policy_ref=self.app.policy.ref, signer=signer)
            outcome = store.apply([Append(
                object_id=oid, epoch=epoch, records=[rec], status=Status.DORMANT.value,
                phase=Phase.DORMANCY.value, ready_at=None, waiting_event=_NEVER)], now)
            if outcome[0] is None:
                with self._lock:
                    if thread.seq == seq:
                        thread.fold(rec)
                self.app.anchors.note(oid, thread.first, rec.seq, rec.hash)
                return
            if not isinstance(outcome[0], LeaseLostError):
                raise outcome[0]
        raise StoreError(f"thread object {oid!r} kept moving under {_TRIES} tries to append")

    def _create(self, oid: str, thread_id: str, ns: str, now: float) -> None:
        """Make the thread object: its first record names the thread; it is held back
        from workers (its next append makes it wait for an event nobody sends)."""
        intent = Intent(agent=AGENT, version=_VERSION,
                        kwargs={"thread_id": thread_id, "checkpoint_ns": ns})
        context = Context(object_id=oid, trace_id=random.randbytes(16).hex(), root_id=oid)
        first = seal(Instantiated(intent, context).draft(), object_id=oid, seq=1,
                     prev_hash=GENESIS_HASH, trace_id=context.trace_id,
                     ts_us=int(now * 1_000_000), policy_ref=self.app.policy.ref,
                     signer=self.app.client.certified())
        if self.app.store.create(NewObject(object_id=oid, agent=AGENT, agent_version=_VERSION,
                                           first=first, ready_at=HELD_BACK_UNTIL), now):
            self.app.anchors.note(oid, first.hash, first.seq, first.hash)

    def put(self, config: RunnableConfig, checkpoint: Checkpoint,
            metadata: CheckpointMetadata, new_versions: ChannelVersions) -> RunnableConfig:
        """Store ``checkpoint`` with ``metadata``, and the values of the channels
        ``new_versions`` names; the config naming it."""
        configurable = config["configurable"]
        thread_id = str(configurable["thread_id"])
        ns = configurable.get("checkpoint_ns", "")
        values = checkpoint["channel_values"]
        blobs: dict[str, list[Any]] = {}
        for channel, version in new_versions.items():
            kind, value = (self.serde.dumps_typed(values[channel]) if channel in values
                           else ("empty", b""))
            blobs[channel] = [version, kind, _b64(value)]
        bare = {k: v for k, v in checkpoint.items() if k != "channel_values"}
        cp_kind, cp_bytes = self.serde.dumps_typed(bare)
        md_kind, md_bytes = self.serde.dumps_typed(get_checkpoint_metadata(config, metadata))
        self._append(thread_id, ns, _CHECKPOINT, {
            "id": checkpoint["id"], "parent": configurable.get("checkpoint_id"),
            "checkpoint": [cp_kind, _b64(cp_bytes)], "metadata": [md_kind, _b64(md_bytes)],
            "blobs": blobs})
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns,
                                 "checkpoint_id": checkpoint["id"]}}

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                   task_id: str, task_path: str = "") -> None:
        """Store a task's writes pending on the checkpoint ``config`` names."""
        configurable = config["configurable"]
        rows = []
        for i, (channel, value) in enumerate(writes):
            kind, data = self.serde.dumps_typed(value)
            rows.append([WRITES_IDX_MAP.get(channel, i), channel, kind, _b64(data)])
        self._append(str(configurable["thread_id"]), configurable.get("checkpoint_ns", ""),
                     _WRITES, {"checkpoint": configurable["checkpoint_id"], "task": task_id,
                               "path": task_path, "writes": rows})

    def delete_thread(self, thread_id: str) -> None:
        """Forget the thread's checkpoints and writes in every namespace (memory keeps
        them, signed; reads no longer see them)."""
        for tid, ns in self._thread_keys({"configurable": {"thread_id": thread_id}}):
            thread = self._read(tid, ns)
            if thread is not None and thread.checkpoints:
                self._append(tid, ns, _DELETED, {})

    def get_next_version(self, current: str | None, channel: None) -> str:
        """A version above ``current``: a zero-padded count and a random tail (two
        branches of a thread do not reuse one)."""
        if current is None:
            count = 0
        elif isinstance(current, int):
            count = current
        else:
            count = int(current.split(".")[0])
        return f"{count + 1:032}.{random.random():.16f}"

    # -- async ------------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """``get_tuple``, on a thread."""
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(self, config: RunnableConfig | None, *,
                    filter: dict[str, Any] | None = None,  # noqa: A002
                    before: RunnableConfig | None = None, limit: int | None = None
                    ) -> AsyncIterator[CheckpointTuple]:
        """``list``, on a thread."""
        items = await asyncio.to_thread(
            lambda: list(self.list(config, filter=filter, before=before, limit=limit)))
        for item in items:
            yield item

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions
                   ) -> RunnableConfig:
        """``put``, on a thread."""
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        """``put_writes``, on a thread."""
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        """``delete_thread``, on a thread."""
        await asyncio.to_thread(self.delete_thread, thread_id)

