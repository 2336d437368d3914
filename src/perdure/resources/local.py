"""Built-in recipes for things on the node itself: a working directory, environment
variables, an open file with its position, a subprocess such as a dev server.

Each restores from its descriptor alone. A thing that lives on one machine's disk (a
file, a directory not to be created) raises ``CannotRestoreError`` on a node where it is
missing, so the object moves to a node that has it; a subprocess whose program is not
installed here does the same.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from perdure.core.secret import Secret
from perdure.errors import CannotRestoreError, ConfigurationError
from perdure.resources._protocol import Fresh, Invalidate, Resource, Stale, Validity

__all__ = ["Environment", "OpenFile", "Process", "Subprocess", "WorkingDirectory",
           "revealed"]


class WorkingDirectory(Resource[Path]):
    """A directory the agent works in: created if ``create`` (also on restore), else it
    must exist (a node without it cannot restore)."""

    def __init__(self, path: str | Path, *, create: bool = True,
                 on_stale: str | Invalidate = "refresh", checks: Sequence[Any] = ()) -> None:
        super().__init__(on_stale=on_stale, checks=checks)
        self.path = Path(path).absolute()
        self.create = create

    async def open(self) -> Path:
        return _directory(str(self.path), self.create)

    def describe(self, live: Path) -> dict[str, Any]:
        return {"path": str(live), "create": self.create}

    @classmethod
    async def restore(cls, descriptor: dict[str, Any]) -> Path:
        return _directory(str(descriptor["path"]), bool(descriptor.get("create")))


def _directory(path: str, create: bool) -> Path:
    where = Path(path)
    if create:
        where.mkdir(parents=True, exist_ok=True)
    elif not where.is_dir():
        raise CannotRestoreError(f"directory {path} does not exist on this node")
    return where


class Environment(Resource[dict[str, Any]]):
    """Environment variables (the live thing is a ``dict`` to hand to ``Subprocess``);
    ``apply=True`` also sets them in this process's ``os.environ`` on every restore.

    A value given as a ``perdure.Secret``, or named in ``secret``, is a credential: the
    descriptor holds it as a ``Secret``, so memory keeps it sealed at rest and nothing
    prints it, and so does the live ``dict``: wherever it goes (another resource's
    descriptor, a step's result, an event) it is still a ``Secret`` and stays sealed.
    ``Subprocess`` reveals it for the process it starts (and ``os.environ`` gets the
    revealed value); for a process of your own, pass ``revealed(env)``."""

    versions = (1, 2)  # 2: secret values are Secrets in the descriptor

    def __init__(self, variables: Mapping[str, str | Secret[str]], *,
                 secret: Iterable[str] = (), apply: bool = False,
                 on_stale: str | Invalidate = "refresh") -> None:
        super().__init__(on_stale=on_stale)
        bad = [k for k, v in variables.items()
               if not isinstance(k, str) or not k or "=" in k
               or not isinstance(v.reveal() if isinstance(v, Secret) else v, str)]
        if bad:
            raise ConfigurationError(f"Environment: names and values must be strings (or "
                                     f"Secret strings), a name without '=': "
                                     f"{sorted(map(repr, bad))}")
        names = set(secret) | {k for k, v in variables.items() if isinstance(v, Secret)}
        self.secret = sorted(names)
        self.variables = _kept(variables, names)
        self.apply = apply

    async def open(self) -> dict[str, Any]:
        if self.apply:
            os.environ.update(revealed(self.variables))
        return dict(self.variables)

    def describe(self, live: dict[str, Any]) -> dict[str, Any]:
        return {"vars": _kept(live, set(self.secret)), "secret": self.secret,
                "apply": self.apply}

    @classmethod
    async def restore(cls, descriptor: dict[str, Any]) -> dict[str, Any]:
        names = {str(name) for name in descriptor.get("secret") or ()}
        variables = _kept({str(k): v for k, v in dict(descriptor["vars"]).items()}, names)
        if descriptor.get("apply"):
            os.environ.update(revealed(variables))
        return variables

    @classmethod
    async def validate(cls, descriptor: dict[str, Any], live: dict[str, Any]) -> Validity:
        if descriptor.get("apply"):
            differ = sorted(k for k, v in revealed(live).items() if os.environ.get(k) != v)
            if differ:
                return Stale(f"environment variables {', '.join(differ)} differ")
        return Fresh()


def _kept(variables: Mapping[str, Any], secret: set[str]) -> dict[str, Any]:
    """``variables`` with each value named in ``secret`` (or given as one) a ``Secret``
    and the others plain strings."""
    return {k: Secret(str(_plain(v))) if k in secret or isinstance(v, Secret)
            else str(v) for k, v in variables.items()}


def revealed(env: Mapping[str, Any]) -> dict[str, str]:
    """An environment mapping (an ``Environment``'s live ``dict``) with its ``Secret``
    values revealed, for a process of your own (``subprocess.run(..., env=...)``):
    what you do with the result is no longer tracked, so pass it there and nowhere
    else."""
    return {str(k): str(_plain(v)) for k, v in env.items()}


def _plain(value: Any) -> Any:
    """``value`` revealed if it is a ``Secret`` (only the live thing gets it)."""
    return value.reveal() if isinstance(value, Secret) else value


class OpenFile(Resource[IO[Any]]):
    """A file open at a position. Restored by opening it again (never truncating on
    open), checking the bytes before the position are the ones recorded, and seeking
    there; a writable file is cut back to the position, so bytes written after the last
    checkpoint are dropped and writing continues exactly where it was recorded."""

    def __init__(self, path: str | Path, mode: str = "a+", *, encoding: str | None = None,
                 on_stale: str | Invalidate = "fail", checks: Sequence[Any] = ()) -> None:
        super().__init__(on_stale=on_stale, checks=checks)
        if not set(mode) <= set("rwaxb+t") or sum(c in mode for c in "rwax") != 1:
            raise ConfigurationError(f"OpenFile: {mode!r} is not a file mode")
        self.path = Path(path).absolute()
        self.mode = mode
        self.encoding = encoding if "b" not in mode else None

    async def open(self) -> IO[Any]:
        return open(self.path, self.mode, encoding=self.encoding)

    def describe(self, live: IO[Any]) -> dict[str, Any]:
        return _file_descriptor(str(self.path), self.mode, self.encoding, live)

    @classmethod
    async def recapture(cls, descriptor: dict[str, Any], live: IO[Any]) -> dict[str, Any]:
        return _file_descriptor(str(descriptor["path"]), str(descriptor["mode"]),
                                descriptor.get("encoding"), live)

    @classmethod
    async def restore(cls, descriptor: dict[str, Any]) -> IO[Any]:
        path, mode = Path(str(descriptor["path"])), str(descriptor["mode"])
        if not path.is_file():
            raise CannotRestoreError(f"file {path} does not exist on this node")
        writable = any(c in mode for c in "wax+")
        reopen = ("r+" if writable else "r") + ("b" if "b" in mode else "")
        live = open(path, reopen, encoding=descriptor.get("encoding"))  # noqa: SIM115
        try:
            position = int(descriptor["position"])
            if path.stat().st_size >= position:
                live.seek(position)
                if writable:
                    live.truncate()
        except BaseException:
            live.close()
            raise
        return live

    @classmethod
    async def validate(cls, descriptor: dict[str, Any], live: IO[Any]) -> Validity:
        position = int(descriptor["position"])
        path = Path(str(descriptor["path"]))
        if path.stat().st_size < position:
            return Stale(f"{path} is shorter ({path.stat().st_size} bytes) than the "
                         f"recorded position {position}")
        if _prefix_hash(path, position) != descriptor.get("sha256"):
            return Stale(f"the first {position} bytes of {path} changed")
        return await super().validate(descriptor, live)

    @classmethod
    async def close(cls, live: IO[Any]) -> None:
        live.close()


def _file_descriptor(path: str, mode: str, encoding: str | None, live: IO[Any]
                     ) -> dict[str, Any]:
    live.flush()
    position = live.tell()
    return {"path": path, "mode": mode, "encoding": encoding, "position": position,
            "sha256": _prefix_hash(Path(path), position)}


def _prefix_hash(path: Path, length: int) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        left = length
        while left > 0:
            chunk = f.read(min(left, 1 << 20))
            if not chunk:
                break
            digest.update(chunk)
            left -= len(chunk)
    return digest.hexdigest()


@dataclass
class Process:
    """A running subprocess (``Subprocess``'s live thing)."""

    popen: subprocess.Popen[bytes]
    argv: list[str]
    ready: dict[str, Any] | None = None
    started: float = field(default_factory=time.time)

    @property
    def pid(self) -> int:
        """The process id."""
        return self.popen.pid

    def alive(self) -> bool:
        """Whether it still runs."""
        return self.popen.poll() is None


class Subprocess(Resource[Process]):
    """A long-running subprocess (a dev server): started, then probed until ready;
    on reentry started again and probed before the agent continues.

    ``ready`` is ``{"http": url}`` (an answer of any status) or ``{"tcp": [host, port]}``
    (a connection), waited for up to ``ready_timeout`` seconds. ``env`` adds to this
    process's environment. The subprocess dies with the worker (Linux: parent-death
    signal); one left over from a dead worker on this host is stopped first.
    """

    def __init__(self, argv: Sequence[str], *, cwd: str | Path | None = None,
                 env: Mapping[str, str | Secret[str]] | None = None,
                 ready: Mapping[str, Any] | None = None,
                 ready_timeout: float = 30.0, on_stale: str | Invalidate = "refresh") -> None:
        super().__init__(on_stale=on_stale)
        if not argv or not all(isinstance(a, str) for a in argv):
            raise ConfigurationError("Subprocess: argv must be a non-empty list of strings")
        if ready is not None and not (set(ready) <= {"http", "tcp"} and len(ready) == 1):
            raise ConfigurationError('Subprocess: ready is {"http": url} or {"tcp": [host, '
                                     'port]}')
        self.argv = list(argv)
        self.cwd = None if cwd is None else str(Path(cwd).absolute())
        self.env: dict[str, Any] = dict(env or {})
        if not all(isinstance(_plain(v), str) for v in self.env.values()):
            raise ConfigurationError("Subprocess: env values must be strings (or Secret "
                                     "strings)")
        self.ready = None if ready is None else dict(ready)
        self.ready_timeout = float(ready_timeout)

    async def open(self) -> Process:
        return await _start(self.argv, self.cwd, self.env, self.ready, self.ready_timeout)

    def describe(self, live: Process) -> dict[str, Any]:
        return {"argv": self.argv, "cwd": self.cwd, "env": self.env, "ready": self.ready,
                "ready_timeout": self.ready_timeout, "pid": live.pid,
                "host": socket.gethostname()}

    @classmethod
    async def recapture(cls, descriptor: dict[str, Any], live: Process) -> dict[str, Any]:
        return {**descriptor, "pid": live.pid, "host": socket.gethostname()}

    @classmethod
    async def restore(cls, descriptor: dict[str, Any]) -> Process:
        argv = [str(a) for a in descriptor["argv"]]
        await asyncio.to_thread(_stop_leftover, descriptor, argv)  # waits: off the loop
        return await _start(argv, descriptor.get("cwd"), dict(descriptor.get("env") or {}),
                            descriptor.get("ready"), float(descriptor["ready_timeout"]))

    @classmethod
    async def validate(cls, descriptor: dict[str, Any], live: Process) -> Validity:
        if not live.alive():
            return Stale(f"{live.argv[0]} exited with status {live.popen.returncode}")
        return Fresh()

    @classmethod
    async def close(cls, live: Process) -> None:
        await asyncio.to_thread(_stop, live.popen)  # waits up to seconds: off the loop


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


# Processes are started on one thread that lives as long as the process: forking (and
# finding the program) takes long enough to stall a worker's loop, and PR_SET_PDEATHSIG
# fires when the *thread* that forked exits, so a short-lived pool thread would take the
# child with it. This thread ends only as the process does, as the child should.
_SPAWNER = concurrent.futures.ThreadPoolExecutor(max_workers=1,
                                                 thread_name_prefix="perdure-spawner")


async def _start(argv: list[str], cwd: str | None, env: dict[str, Any],
                 ready: dict[str, Any] | None, timeout: float) -> Process:
    full_env = {**os.environ, **revealed(env)}
    popen = await asyncio.wrap_future(_SPAWNER.submit(_spawn, argv, cwd, full_env))
    live = Process(popen, argv, ready)
    try:
        await _wait_ready(live, ready, timeout)
    except BaseException:
        await asyncio.to_thread(_stop, popen)
        raise
    return live


def _spawn(argv: list[str], cwd: str | None, env: dict[str, str]
           ) -> subprocess.Popen[bytes]:
    """Start the program (on the spawner thread); ``CannotRestoreError`` when this node
    has no such program or directory."""
    if shutil.which(argv[0], path=env.get("PATH")) is None:
        raise CannotRestoreError(f"program {argv[0]!r} is not installed on this node")
    if cwd is not None and not Path(cwd).is_dir():
        raise CannotRestoreError(f"directory {cwd} does not exist on this node")
    return subprocess.Popen(
        argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True,
        preexec_fn=_die_with_parent if sys.platform == "linux" else None)


async def _wait_ready(live: Process, ready: dict[str, Any] | None, timeout: float) -> None:
    """Wait until the process itself is ready: alive, and (on a local address) the one
    listening on the port that answers. Another program answering on the port (a server
    left over, a second copy) is not this process being ready: if it holds the port
    when the process exits, this node cannot restore the resource."""
    if ready is None:
        return
    deadline = time.monotonic() + timeout
    foreign = False  # the port answered for another process
    while True:
        if not live.alive():
            status = live.popen.returncode
            if foreign:
                raise CannotRestoreError(
                    f"{live.argv[0]} exited with status {status}: port {_port(ready)} on "
                    f"this node is held by another process")
            raise RuntimeError(f"{live.argv[0]} exited with status {status} before it was "
                               f"ready")
        if await _probe(ready):
            owned = await asyncio.to_thread(_listens, live.pid, ready)  # reads /proc
            if owned is not False and live.alive():
                return
            foreign = True
        if time.monotonic() > deadline:
            held = f" (port {_port(ready)} answers for another process)" if foreign else ""
            raise TimeoutError(f"{live.argv[0]} was not ready ({ready}) within {timeout}s"
                               f"{held}")
        await asyncio.sleep(0.05)


def _address(ready: dict[str, Any]) -> tuple[str, int]:
    if "tcp" in ready:
        host, port = ready["tcp"]
        return str(host), int(port)
    from urllib.parse import urlsplit

    parts = urlsplit(str(ready["http"]))
    return parts.hostname or "127.0.0.1", parts.port or 80


def _port(ready: dict[str, Any]) -> int:
    return _address(ready)[1]


_LOCAL = {"localhost", "127.0.0.1", "::1", "0.0.0.0", "::"}  # noqa: S104 - names, no bind


def _listens(pid: int, ready: dict[str, Any]) -> bool | None:
    """Whether a process of ``pid``'s session (the subprocess or a child it started)
    holds the listening socket on the readiness port; ``None`` when that cannot be
    told here (no ``/proc``, or a remote address)."""
    host, port = _address(ready)
    if host not in _LOCAL and not host.startswith("127.") and host != socket.gethostname():
        return None
    inodes = set()
    try:
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with contextlib.suppress(FileNotFoundError), open(table) as f:
                next(f, None)
                for line in f:
                    fields = line.split()
                    if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(f"socket:[{fields[9]}]")
        if not inodes:
            return False
        for member in _session(pid):
            with contextlib.suppress(OSError):
                for fd in os.listdir(f"/proc/{member}/fd"):
                    with contextlib.suppress(OSError):
                        if os.readlink(f"/proc/{member}/fd/{fd}") in inodes:
                            return True
    except OSError:
        return None
    return False


def _session(pid: int) -> list[int]:
    """``pid`` and the processes of its session (it was started as a session leader)."""
    members = [pid]
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == pid:
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = Path(f"/proc/{entry}/stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[3]) == pid:  # field 6: session id
                members.append(int(entry))
    return members


async def _probe(ready: dict[str, Any]) -> bool:
    host, port = _address(ready)
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), 1.0)
    except (OSError, TimeoutError):
        return False
    try:
        if "http" not in ready:
            return True
        from urllib.parse import urlsplit

        parts = urlsplit(str(ready["http"]))
        writer.write(f"GET {parts.path or '/'} HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), 2.0)
        return line.startswith(b"HTTP/")
    except (OSError, TimeoutError):
        return False
    finally:
        writer.close()


def _stop(popen: subprocess.Popen[bytes]) -> None:
    if popen.poll() is not None:
        return
    try:
        os.killpg(popen.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    try:
        popen.wait(timeout=5)
    except subprocess.TimeoutExpired:
        os.killpg(popen.pid, signal.SIGKILL)
        popen.wait(timeout=5)


def _stop_leftover(descriptor: dict[str, Any], argv: list[str]) -> None:
    """A subprocess a dead worker on this host left running (its pid runs ``argv``):
    stop its process group, so the new one can have its port."""
    pid = descriptor.get("pid")
    if not isinstance(pid, int) or descriptor.get("host") != socket.gethostname():
        return
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return
    if [part.decode(errors="replace") for part in cmdline if part] != argv:
        return
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return
    for _ in range(100):
        if not Path(f"/proc/{pid}").exists():
            return
        time.sleep(0.01)
