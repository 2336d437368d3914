"""A watched folder: each new or changed file starts one object.

Polled with ``os.scandir`` every ``interval`` seconds, off the event loop; no package
beyond the standard library. A file is taken once its size and modification time stay
the same across two looks (and for at least ``settle`` seconds), so a file still being
written is not taken half-written; hidden files (a name starting with ``.``) are left
alone, so a writer that writes ``.name.part`` and renames it when done is never seen
half-way at all.

The object's id is derived from the file's path under the folder, its size and its
modification time (nanoseconds): a watcher started again (or a second one) starts no
file twice, while a file written again is a new version and starts a new object. The
agent is started with the file's absolute path as its one argument; the object carries
the labels ``trigger`` and ``file`` (the path under the folder).
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import hashlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from perdure.errors import ConfigurationError, PerdureError, StoreError
from perdure.triggers.common import AfterCommit, Message, Outcome, Result, Trigger

if TYPE_CHECKING:
    from perdure.app import App

__all__ = ["FolderTrigger", "FolderWatch"]

log = logging.getLogger("perdure.triggers")

Signature = tuple[int, int]  # size, modification time in nanoseconds


@dataclass(frozen=True, kw_only=True)
class FolderTrigger(Trigger):
    """Watch folder ``path`` (``Triggers.folder`` declares one): files whose name
    matches ``pattern`` (``fnmatch``), in sub-folders too with ``recursive``."""

    path: str
    pattern: str = "*"
    recursive: bool = False
    interval: float = 1.0
    settle: float = 0.0

    kind: ClassVar[str] = "folder"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mode != "start":
            raise ConfigurationError(f"trigger {self.name!r}: a folder trigger starts objects "
                                     "(mode='start')")
        if self.agent is None:
            raise ConfigurationError(f"trigger {self.name!r}: a folder trigger needs an agent")
        for what, value in (("interval", self.interval), ("settle", self.settle)):
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ConfigurationError(f"trigger {self.name!r}: {what} is a number of "
                                         f"seconds, not {value!r}")
        if self.interval <= 0:
            raise ConfigurationError(f"trigger {self.name!r}: interval must be more than 0")

    def source(self) -> str:
        """The folder and the pattern."""
        return f"folder {self.path} ({self.pattern}{', recursive' if self.recursive else ''})"

    def file_key(self, relative: str, signature: Signature) -> str:
        """What names one version of one file: a hash of its path, size and time."""
        size, mtime_ns = signature
        text = f"{relative}\0{size}\0{mtime_ns}".encode("utf-8", "surrogateescape")
        return hashlib.sha256(text).hexdigest()[:32]

    def scan(self) -> dict[str, Signature]:
        """The matching files now, by path under the folder (blocking: run it off the
        loop). ``ConfigurationError`` if the folder is not there."""
        root = Path(self.path)
        if not root.is_dir():
            raise ConfigurationError(f"trigger {self.name!r}: {self.path} is not a folder")
        found: dict[str, Signature] = {}
        todo = [root]
        while todo:
            folder = todo.pop()
            try:
                entries = os.scandir(folder)
            except OSError:  # gone, or not readable: seen again on the next look
                continue
            with entries:
                for entry in entries:
                    if entry.name.startswith("."):
                        continue
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            if self.recursive:
                                todo.append(Path(entry.path))
                            continue
                        if not entry.is_file() or not fnmatch.fnmatch(entry.name,
                                                                      self.pattern):
                            continue
                        stat = entry.stat()
                    except OSError:  # removed between the listing and the look
                        continue
                    relative = Path(entry.path).relative_to(root).as_posix()
                    found[relative] = (stat.st_size, stat.st_mtime_ns)
        return found

    async def consume(self, app: App, stop: asyncio.Event, *,
                      after_commit: AfterCommit | None = None,
                      drain_seconds: float = 10.0) -> None:
        """Look every ``interval`` seconds until ``stop`` is set; a start under way
        finishes first."""
        watch = FolderWatch(self, app, after_commit)
        await app.aio.to_thread(self.scan)  # a missing folder fails now
        log.info("trigger %s watching %s", self.name, self.source(),
                 extra={"action": "trigger_consuming"})
        while not stop.is_set():
            await watch.look(time.monotonic(), stop)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.interval)

    async def start_file(self, app: App, root: Path, relative: str, signature: Signature,
                         after_commit: AfterCommit | None) -> str | None:
        """Start the object of one file version: its id, ``""`` if it cannot be started
        (said in the log), ``None`` to try again on the next look (the store is
        unavailable)."""
        key = self.file_key(relative, signature)
        object_id = self.object_id_for(key)
        path = str(root / relative)
        message = Message(body=b"", headers={}, message_id=key, source=path)
        agent: Any = self.agent
        try:
            starter = app.aio.options(object_id=object_id, labels={
                **self.labels, "trigger": self.name, "file": relative})
            handle = await starter.start(agent, path)
        except StoreError as exc:
            log.warning("trigger %s: file %s waits, the store is unavailable: %s",
                        self.name, relative, exc, extra={"action": "trigger_retry"})
            return None
        except (PerdureError, TypeError, ValueError) as exc:
            log.warning("trigger %s: file %s not started: %s", self.name, relative, exc,
                        extra={"action": "trigger_dead"})
            return ""
        log.info("trigger %s: file %s %s object %s", self.name, relative,
                 "started" if handle.created else "was started before as", object_id,
                 extra={"action": "trigger_done"})
        if after_commit is not None:
            after_commit(self, message, Result(Outcome.DONE, object_id,
                                               applied=handle.created))
        return object_id


class FolderWatch:
    """What a folder trigger's watcher remembers between looks: each file's last size
    and time and since when, and the versions it started."""

    def __init__(self, trigger: FolderTrigger, app: App,
                 after_commit: AfterCommit | None = None) -> None:
        self.trigger = trigger
        self.app = app
        self.after_commit = after_commit
        self.root = Path(trigger.path).resolve()
        self.looked: dict[str, tuple[Signature, float]] = {}  # last signature, seen since
        self.done: dict[str, Signature] = {}  # versions started (or refused) already

    async def look(self, now: float, stop: asyncio.Event | None = None) -> list[str]:
        """Look at the folder once (``now``: a monotonic time) and start the object of
        each file that has not changed since the look before (and for ``settle``
        seconds). Returns the ids of the objects started or found started."""
        found = await self.app.aio.to_thread(self.trigger.scan)
        started = []
        for relative, signature in found.items():
            if stop is not None and stop.is_set():
                break
            if self.done.get(relative) == signature:
                continue
            before = self.looked.get(relative)
            if before is None or before[0] != signature:
                self.looked[relative] = (signature, now)
                continue
            if now - before[1] < self.trigger.settle:
                continue
            object_id = await self.trigger.start_file(self.app, self.root, relative, signature,
                                                  self.after_commit)
            if object_id is not None:
                self.done[relative] = signature
                self.looked.pop(relative, None)
                if object_id:
                    started.append(object_id)
        for gone in set(self.looked) - set(found):
            del self.looked[gone]
        for gone in set(self.done) - set(found):
            del self.done[gone]
        return started
