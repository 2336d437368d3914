"""SQLite's pushed notifications: a folder of Unix datagram sockets beside the file.

SQLite has no LISTEN/NOTIFY, but every process sharing a file runs on one machine. So
beside ``agents.db`` a folder ``agents.db.wake/`` (owner-only, like the key folder)
holds one socket per listening process. A process that listens (a worker waiting for
work, a caller waiting for a result or following an object) binds a Unix datagram
socket there, named for what it wants to hear: ``KINDS.PID.TOKEN``, ``KINDS`` the
letters of ``perdure.stores._push`` (``w`` wake-ups, ``e`` ends, ``c`` changes). A
process that committed something worth telling sends one small datagram to each socket
that wants it, after the commit.

Telling is kept cheap and harmless on the commit path: the folder's listing is cached
and read again only when the folder's modification time moves (or moved so lately that
a change in the same clock tick could hide behind it); sends never block (a listener
whose queue is full already has a wake-up waiting), and no failure of a send reaches the
commit. A socket whose owner is gone (``ECONNREFUSED``) is removed by the first sender
that finds it. A listener that drained a queue full enough that sends may have been
dropped tells its subscribers to look again.

Where the folder cannot be made or a socket cannot be bound (a read-only or network
filesystem, another user's folder, no ``AF_UNIX`` as on Windows), listening fails once
with a log line and the store's nodes and callers poll as before.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import secrets
import selectors
import socket
import sys
import threading
import time
import weakref
from pathlib import Path

from perdure.stores._push import KINDS, Hub

__all__ = ["WakeFolder"]

log = logging.getLogger("perdure.store")

_NAME = re.compile(r"^([cew]+)\.(\d+)\.([0-9a-f]+)$")
_ID, _KIND = "\x1f", "\x1e"  # separators no object id holds (ids have no control character)
_CHUNK = 48_000  # bytes of ids per datagram, well under a Unix datagram's limit
# The longest socket path: sun_path holds 108 bytes on Linux, 104 on macOS and the BSDs.
_PATH_MAX = 107 if sys.platform.startswith("linux") else 103
# A folder changed this lately (ns) may change again within the same clock tick of its
# modification time: its listing is read again on every send until then.
_RACY_NS = 1_000_000_000


def _queue_limit() -> int:
    """How many datagrams a socket's queue holds before sends to it fail (Linux)."""
    try:
        return max(2, int(Path("/proc/sys/net/unix/max_dgram_qlen").read_text()))
    except (OSError, ValueError):
        return 8


class WakeFolder:
    """The notification folder of one SQLite file: this process's listening socket, if
    any, and sending to the others (see the module).

    ``hub`` receives what other processes send; ``listen`` (re)names this process's socket
    for the kinds ``hub`` has subscribers for; ``targets`` and ``send`` tell the other
    sockets.
    """

    def __init__(self, db_path: str, hub: Hub) -> None:
        self.folder = Path(db_path + ".wake")
        self.hub = hub
        self._lock = threading.RLock()
        self._sender: socket.socket | None = None
        self._dir_fd: int | None = None
        self._cache: tuple[int, int, dict[str, tuple[str, ...]], frozenset[str]] | None = None
        self._sock: socket.socket | None = None
        self._name: str | None = None
        self._token = secrets.token_hex(4)
        self._thread: threading.Thread | None = None
        self._stop_w: int | None = None
        self._failed = False
        self._limit = _queue_limit()

    # -- sending ------------------------------------------------------------------------

    def send(self, found: dict[str, list[str]], targets: dict[str, tuple[str, ...]]) -> None:
        """Tell the sockets of ``targets`` (from ``targets()``) that want them the
        notifications ``found`` (kind: object ids). Never raises, never blocks."""
        try:
            payloads: dict[frozenset[str], list[bytes]] = {}
            for name, kinds in targets.items():
                key = frozenset(k for k in kinds if k in found)
                if not key:
                    continue
                datagrams = payloads.get(key)
                if datagrams is None:
                    datagrams = payloads[key] = _datagrams({k: found[k] for k in key})
                for datagram in datagrams:
                    if not self._send_one(name, datagram):
                        break
        except Exception:  # a notification never fails a commit
            log.debug("wake-up not sent", exc_info=True, extra={"action": "wake_not_sent"})

    def _send_one(self, name: str, datagram: bytes) -> bool:
        """Send one datagram to socket ``name``; whether to go on sending to it."""
        sender = self._sender
        address = self._address(name)
        if sender is None or address is None:
            return False
        try:
            sender.sendto(datagram, address)
            return True
        except (BlockingIOError, InterruptedError):
            return False  # its queue is full: it has wake-ups waiting already
        except OSError as exc:
            if exc.errno in (errno.ECONNREFUSED, errno.ENOENT, errno.ENOTSOCK):
                if exc.errno != errno.ENOENT:  # nobody is bound to it: its owner is gone
                    with contextlib.suppress(OSError):
                        os.unlink(self.folder / name)
                with self._lock:
                    self._cache = None
            return False

    def targets(self) -> tuple[dict[str, tuple[str, ...]], frozenset[str]]:
        """The other processes' sockets in the folder with the kinds each wants, and all
        the kinds wanted. The listing is read again only when the folder changed (or
        changed lately enough that its time may hide a change); never raises."""
        try:
            mtime = os.stat(self.folder).st_mtime_ns
        except OSError:
            return {}, frozenset()
        cache = self._cache
        if cache is not None and cache[0] == mtime and cache[1] - mtime > _RACY_NS:
            return cache[2], cache[3]
        listed_at = time.time_ns()
        names: dict[str, tuple[str, ...]] = {}
        try:
            entries = os.listdir(self.folder)
        except OSError:
            return {}, frozenset()
        own = self._name
        for entry in entries:
            match = _NAME.match(entry)
            if match is not None and entry != own:
                names[entry] = tuple(match.group(1))
        wanted = frozenset(k for kinds in names.values() for k in kinds)
        with self._lock:
            if self._sender is None and names:
                sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                sender.setblocking(False)
                self._sender = sender
                # A store dropped without ``close`` closes its sender when collected.
                weakref.finalize(self, sender.close)
            if own == self._name:
                self._cache = (mtime, listed_at, names, wanted)
        return names, wanted

    def _address(self, name: str) -> str | None:
        """The address of socket ``name``: its path, or where the path is too long for a
        socket address, the path through this process's open handle on the folder
        (Linux's ``/proc/self/fd``); ``None`` if neither fits."""
        path = str(self.folder / name)
        if len(os.fsencode(path)) <= _PATH_MAX:
            return path
        if self._dir_fd is None and os.path.isdir("/proc/self/fd"):
            with self._lock, contextlib.suppress(OSError):
                if self._dir_fd is None:
                    self._dir_fd = os.open(self.folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        if self._dir_fd is None:
            return None
        short = f"/proc/self/fd/{self._dir_fd}/{name}"
        return short if len(short) <= _PATH_MAX else None

    # -- listening -------------------------------------------------------------------------

    @property
    def listening(self) -> bool:
        """Whether this process has a socket in the folder."""
        return self._sock is not None

    def listen(self, kinds: frozenset[str]) -> bool:
        """Have this process's socket hear ``kinds`` (none: remove it); whether it can."""
        with self._lock:
            if not kinds:
                self._close_socket()
                return True
            name = f"{''.join(k for k in KINDS if k in kinds)}.{os.getpid()}.{self._token}"
            if self._sock is not None and self._name == name:
                return True
            try:
                if self._sock is None:
                    self._bind(name)
                else:
                    assert self._name is not None
                    os.rename(self.folder / self._name, self.folder / name)
                    self._name = name
                    self._cache = None
            except OSError as exc:
                self._close_socket()
                if not self._failed:
                    self._failed = True
                    log.warning("cannot listen for wake-ups in %s (%s); this process polls "
                                "the store instead", self.folder, exc.strerror or exc,
                                extra={"action": "wake_unavailable"})
                return False
            return True

    def _bind(self, name: str) -> None:
        if not hasattr(socket, "AF_UNIX"):
            raise OSError(errno.EAFNOSUPPORT, "this platform has no Unix sockets")
        try:
            self.folder.mkdir(mode=0o700)
        except FileExistsError:
            if not self.folder.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, "not a folder") from None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            address = self._address(name)
            if address is None:
                raise OSError(errno.ENAMETOOLONG, "the folder's path is too long for a socket")
            sock.bind(address)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self._sock, self._name = sock, name
        self._cache = None
        stop_r, self._stop_w = os.pipe()
        self._thread = threading.Thread(target=self._receive, args=(sock, stop_r),
                                        name="perdure-wake", daemon=True)
        self._thread.start()

    def _close_socket(self) -> None:
        """Stop listening and remove this process's socket (under ``_lock``)."""
        if self._sock is None:
            return
        assert self._stop_w is not None and self._thread is not None
        os.write(self._stop_w, b"x")
        os.close(self._stop_w)
        thread = self._thread
        if thread is not threading.current_thread():
            thread.join(timeout=5)
        with contextlib.suppress(OSError):
            os.unlink(self.folder / str(self._name))
        self._sock.close()
        self._sock = self._name = self._thread = self._stop_w = None
        self._cache = None

    def _receive(self, sock: socket.socket, stop_r: int) -> None:
        """The listening thread: hand each batch of datagrams to the hub."""
        with selectors.DefaultSelector() as sel:
            sel.register(sock, selectors.EVENT_READ)
            sel.register(stop_r, selectors.EVENT_READ)
            try:
                while True:
                    ready = sel.select()
                    if any(key.fd == stop_r for key, _ in ready):
                        return
                    found: dict[str, list[str]] = {}
                    count = 0
                    while True:
                        try:
                            data = sock.recv(65536)
                        except (BlockingIOError, InterruptedError):
                            break
                        except OSError:
                            return
                        count += 1
                        _parse(data, found)
                    if count >= self._limit:
                        # The queue was full: a send may have been dropped.
                        self.hub.everyone()
                    else:
                        self.hub.deliver_all(found)
            finally:
                os.close(stop_r)

    def close(self) -> None:
        """Stop listening, remove this process's socket, close the sender."""
        with self._lock:
            self._close_socket()
            if self._sender is not None:
                self._sender.close()
                self._sender = None
            if self._dir_fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._dir_fd)
                self._dir_fd = None


def _datagrams(found: dict[str, list[str]]) -> list[bytes]:
    """``found`` (kind: object ids) as datagrams of at most about ``_CHUNK`` bytes:
    ``KIND`` then each id after ``\\x1f``, kinds apart by ``\\x1e``."""
    out: list[bytes] = []
    parts: list[str] = []
    size = 0
    for kind, ids in found.items():
        part = [kind]
        for oid in dict.fromkeys(ids):
            if size > _CHUNK:
                parts.append(_ID.join(part))
                out.append(_KIND.join(parts).encode("utf-8", "surrogatepass"))
                parts, part, size = [], [kind], 0
            part.append(oid)
            size += len(oid) + 1
        parts.append(_ID.join(part))
    if parts:
        out.append(_KIND.join(parts).encode("utf-8", "surrogatepass"))
    return out


def _parse(data: bytes, found: dict[str, list[str]]) -> None:
    """Add the notifications of one datagram to ``found``."""
    for part in data.decode("utf-8", "replace").split(_KIND):
        kind, *ids = part.split(_ID)
        if kind in KINDS:
            found.setdefault(kind, []).extend(ids if ids else [""])
