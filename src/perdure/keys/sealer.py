"""``Sealer``: one object's secrets on one node, and the payload path through it.

**For every command that writes a payload into memory** (a step's result, an agent's
arguments and result, an event, a progress note, a resource descriptor, a tool's
arguments, a progress marker): encode it through the run's sealer instead of
``codec.encode``::

    stored, data = run._stored(value, what="descriptor of resource 'db'")
    # put ``stored`` in the record body (its canonical bytes are ``data``) and give
    # the agent ``run._opened(stored)`` if it gets the value back on this run

(``Run._stored`` calls ``Sealer.store_value``, and falls back to ``codec.encode`` for a
run without a sealer; outside a run, build a ``Sealer`` and call ``store_value``). On
replay nothing more is needed: the records handed to a ``Run`` are opened already
(``open_records``), so a command reads its values as it always did.

That is all it takes for a payload kind to keep secrets out of the store: every
``perdure.Secret`` in the value is sealed on its own (or, for an agent registered with
``encrypt=True``, the whole value), and the texts of the
secrets it met are remembered (``secrets``) so that error messages and notes that
quote one are redacted before they are written. A value without secrets costs one
``encode`` as before (the secret search runs only when the encoder refuses a value).

The object's data key is made on first need (wrapped under the node's current
key-encryption key and kept in the store's ``data_keys`` table) and read, unwrapped
and cached after that. A node without the key-encryption key that wrapped it gets
``DataKeyError``; a wrapped key or a sealed value that does not decrypt,
``SealBrokenError``.
"""

from __future__ import annotations

import operator
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from perdure.core.codec import MAX_DEPTH, encode
from perdure.core.records import Record
from perdure.core.sealing import (
    check_reserved,
    has_secrets,
    marked,
    new_data_key,
    open_sealed,
    redact,
    revealed,
    seal,
    texts,
    unwrap_data_key,
    wrap_data_key,
)
from perdure.errors import DataKeyError, SerializationError
from perdure.keys.data_keys import DataKeys
from perdure.stores.base import DataKeyRow, Store

__all__ = ["KeyCache", "Rewrapped", "SealedScan", "Sealer", "needs_sealing", "no_key_note",
           "rewrap", "sealed_arguments"]


class KeyCache:
    """Unwrapped data keys by object id, bounded (shared by a node's sealers)."""

    def __init__(self, size: int = 4096) -> None:
        self._keys: OrderedDict[str, bytes] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def get(self, object_id: str) -> bytes | None:
        with self._lock:
            key = self._keys.get(object_id)
            if key is not None:
                self._keys.move_to_end(object_id)
            return key

    def put(self, object_id: str, key: bytes) -> None:
        with self._lock:
            self._keys[object_id] = key
            while len(self._keys) > self._size:
                self._keys.popitem(last=False)


_BODY = operator.itemgetter(7)  # a Record's body_bytes


class SealedScan:
    """Whether an object's memory holds sealed values, scanning each record once per
    node: a claim of an object this node scanned before looks only at what was appended
    since (a 10,000-record memory is not searched again on every claim)."""

    def __init__(self, size: int = 16384) -> None:
        self._seen: OrderedDict[str, tuple[int, str, bool]] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def sealed(self, object_id: str, records: Sequence[Record]) -> bool:
        """Whether any of ``records`` (an object's memory, in order) may hold one."""
        with self._lock:
            seen = self._seen.get(object_id)
        start = 0
        if seen is not None and records:
            seq, digest, found = seen
            if found:
                return True
            at = seq - records[0].seq
            if 0 <= at < len(records) and records[at].hash == digest:
                start = at + 1
        found = marked(b"\n".join(map(_BODY, records[start:] if start else records)))
        if records:
            with self._lock:
                self._seen[object_id] = (records[-1].seq, records[-1].hash, found)
                self._seen.move_to_end(object_id)
                while len(self._seen) > self._size:
                    self._seen.popitem(last=False)
        return found


class Sealer:
    """Sealing and opening for object ``object_id`` with ``keys`` over ``store`` (see
    the module). ``seal_all``: the agent encrypts every payload, not only secrets."""

    def __init__(self, store: Store, keys: DataKeys | None, object_id: str, *,
                 seal_all: bool = False, cache: KeyCache | None = None) -> None:
        self.store = store
        self.keys = keys
        self.object_id = object_id
        self.seal_all = seal_all
        self._cache = cache if cache is not None else KeyCache(64)
        #: Texts of the secrets this object's values held (what redaction looks for).
        self.secrets: set[str] = set()

    # -- the data key ----------------------------------------------------------------

    def data_key(self, object_id: str | None = None, *, create: bool = False) -> bytes:
        """The data key of ``object_id`` (this sealer's object by default); ``create``
        makes this object's on first need."""
        oid = self.object_id if object_id is None else object_id
        key = self._cache.get(oid)
        if key is not None:
            return key
        row = self.store.data_key(oid)
        if row is None:
            if not create or oid != self.object_id:
                raise DataKeyError(oid, "its memory holds sealed values but the store holds "
                                        "no data key for it (the data_keys row is gone); "
                                        "restore the store from a backup")
            row = self._make_key()
        key = self._unwrap(row)
        self._cache.put(oid, key)
        return key

    def _keys(self) -> DataKeys:
        if self.keys is None:
            raise DataKeyError(self.object_id, "this node has no data keys configured; give "
                                               "it some (App(data_keys=...), --data-keys)")
        return self.keys

    def _make_key(self) -> DataKeyRow:
        keys = self._keys()
        current = keys.current(create=True)
        if current is None:
            raise DataKeyError(self.object_id, f"{keys.origin} holds no key-encryption key "
                                               "to make a data key with; add one "
                                               "(`perdure keys data-key`)")
        ident, kek = current
        dek = new_data_key()
        row = DataKeyRow(self.object_id, ident, wrap_data_key(kek, dek, self.object_id),
                         self.seal_all)
        return self.store.put_data_key(row, time.time())

    def _unwrap(self, row: DataKeyRow) -> bytes:
        keys = self._keys()
        kek = keys.get(row.key_id)
        if kek is None:
            held = ", ".join(keys.ids()) or "none"
            raise DataKeyError(
                row.object_id,
                f"its data key is wrapped under key-encryption key {row.key_id}, which this "
                f"node does not hold ({keys.origin}: {held}); copy that key to this node or "
                "let a node that holds it run the object", key_id=row.key_id)
        return unwrap_data_key(kek, row.wrapped, row.object_id)

    # -- the payload path ------------------------------------------------------------------

    def store_value(self, value: Any, *, what: str, max_depth: int = MAX_DEPTH,
                    whole: bool | None = None) -> tuple[Any, bytes]:
        """``value`` as memory keeps it, and its canonical bytes (see the module).

        ``whole`` overrides the agent's ``encrypt`` setting for this value. A value
        that is not JSON (and holds no ``Secret`` that would explain it), or that holds
        perdure's reserved keys itself, raises ``SerializationError``.
        """
        if not (self.seal_all if whole is None else whole):
            try:
                data = encode(value, what=what, max_depth=max_depth)
            except SerializationError:
                if not has_secrets(value):
                    raise
            else:
                if marked(data):
                    check_reserved(value, what)
                return value, data
        whole = self.seal_all if whole is None else whole
        sealed = seal(value, self.data_key(create=True), self.object_id, whole=whole,
                      what=what)
        self._remember(value, whole)
        return sealed, encode(sealed, what=what, max_depth=max_depth + 2)

    def open(self, value: Any) -> Any:
        """``value`` with every sealed value in it opened (``Secret`` objects back)."""
        opened = open_sealed(value, self.data_key, owner=self.object_id)
        if opened is not value:
            self._remember(opened, self.seal_all)
        return opened

    def _remember(self, value: Any, whole: bool) -> None:
        """Note what redaction must look for: the secrets' texts; for an agent that
        encrypts all, every text of 4 characters or more in its values."""
        self.secrets |= texts(value) if whole else revealed(value)

    def open_records(self, records: Sequence[Record]) -> list[Record]:
        """``records`` with the sealed values in their bodies opened (a record without
        any is the same object). Their bytes, hashes and signatures stay as stored."""
        opened = []
        for rec in records:
            if marked(rec.body_bytes):
                rec = rec._replace(body=self.open(rec.body))
            opened.append(rec)
        return opened

    def redact(self, value: Any) -> Any:
        """``value`` with the texts of the secrets met so far replaced by ``[secret]``."""
        return redact(value, self.secrets)


def needs_sealing(args: Sequence[Any], kwargs: Mapping[str, Any], *, seal_all: bool) -> bool:
    """Whether an agent's arguments must go through a sealer (secrets, or ``seal_all``)."""
    return seal_all or has_secrets(list(args)) or has_secrets(dict(kwargs))


def sealed_arguments(sealer: Sealer, args: Sequence[Any], kwargs: Mapping[str, Any], *,
                     agent: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """An agent's arguments as its first record keeps them: each one through
    ``store_value`` (so that, sealed whole, an argument is still one argument)."""
    what = f"arguments of agent {agent!r}"
    if sealer.seal_all:  # its key (and the flag senders go by) exists from the start
        sealer.data_key(create=True)
    return (tuple(sealer.store_value(arg, what=what)[0] for arg in args),
            {name: sealer.store_value(value, what=what)[0] for name, value in kwargs.items()})


@dataclass(frozen=True, slots=True)
class Rewrapped:
    """What ``rewrap`` did: data keys re-wrapped, already under the current key, and
    left as they were because this node lacks the key that wraps them (by key id)."""

    key_id: str
    rewrapped: int
    current: int
    missing: dict[str, int]


def rewrap(store: Store, keys: DataKeys, *, batch: int = 500) -> Rewrapped:
    """Re-wrap every data key in ``store`` under ``keys``' current key-encryption key.

    Only the ``data_keys`` rows change (compare-and-set, so a concurrent rewrap or a
    new object is never overwritten); no memory record is rewritten and the data keys
    themselves stay the same, so every sealed value opens as before. A row wrapped
    under a key this node does not hold is counted in ``missing`` and left as it is;
    one that does not unwrap raises ``SealBrokenError``.
    """
    current = keys.current(create=True)
    if current is None:
        raise DataKeyError("*", f"{keys.origin} holds no key-encryption key to re-wrap under")
    ident, kek = current
    done, missing, after = 0, dict[str, int](), ""
    while True:
        rows = store.data_keys_not_under(ident, after, batch)
        if not rows:
            break
        for row in rows:
            old = keys.get(row.key_id)
            if old is None:
                missing[row.key_id] = missing.get(row.key_id, 0) + 1
                continue
            dek = unwrap_data_key(old, row.wrapped, row.object_id)
            if store.rewrap_data_key(row, ident, wrap_data_key(kek, dek, row.object_id),
                                     time.time()):
                done += 1
        after = rows[-1].object_id
    return Rewrapped(ident, done, store.data_key_counts().get(ident, 0) - done, missing)


def no_key_note(exc: DataKeyError, node_id: str) -> str:
    """The one line a node leaves on an object it cannot open."""
    return f"node {node_id} cannot run this object: {exc.reason}"
