"""What every benchmark shares: the backends, fresh databases, floors, machine facts.

A backend is one way of storing objects: SQLite with ``synchronous=FULL``, SQLite with
``synchronous=NORMAL`` (both in WAL mode, one file) or PostgreSQL (one database on a
server). Each scenario gets a fresh database: a new file, or a new PostgreSQL database
created for it and dropped afterwards.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PG = os.environ.get("PERDURE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


@dataclass(frozen=True)
class Backend:
    """One store configuration under test."""

    name: str
    kind: str  # "sqlite" or "postgresql"
    mode: str | None = None  # SQLite synchronous mode
    label: str = ""


BACKENDS: dict[str, Backend] = {
    "sqlite_full": Backend("sqlite_full", "sqlite", "full", "SQLite FULL"),
    "sqlite_normal": Backend("sqlite_normal", "sqlite", "normal", "SQLite NORMAL"),
    "postgresql": Backend("postgresql", "postgresql", None, "PostgreSQL"),
}


def pick_backends(text: str | None) -> list[Backend]:
    """Backends named in a comma-separated list (all of them when ``text`` is empty)."""
    if not text:
        return list(BACKENDS.values())
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in BACKENDS]
    if unknown:
        raise SystemExit(f"unknown backend(s) {unknown}; choose from {', '.join(BACKENDS)}")
    return [BACKENDS[n] for n in names]


# -- fresh databases -------------------------------------------------------------------


@dataclass
class Database:
    """A fresh database for one scenario: its store URL and a way to run plain SQL."""

    backend: Backend
    url: str
    sqlite_path: Path | None = None
    pg_url: str | None = None

    @contextlib.contextmanager
    def query(self, sql: str) -> Iterator[Callable[[], Any]]:
        """A function running ``sql`` on one open connection; first column of the first row.

        For polling: the connection stays open, so polling does not start a server
        process per call on PostgreSQL.
        """
        if self.sqlite_path is not None:
            lite = sqlite3.connect(self.sqlite_path, timeout=30, isolation_level=None)
            try:
                yield lambda: (lite.execute(sql).fetchone() or (None,))[0]
            finally:
                lite.close()
            return
        import psycopg

        assert self.pg_url is not None
        with psycopg.connect(self.pg_url, autocommit=True) as conn:
            yield lambda: (conn.execute(sql.encode()).fetchone() or (None,))[0]


def _pg_admin(admin_url: str, sql: str) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as conn:
        conn.execute(sql.encode())


def _pg_url_for(admin_url: str, database: str) -> str:
    return urlunsplit(urlsplit(admin_url)._replace(path=f"/{database}"))


@contextlib.contextmanager
def fresh_database(backend: Backend, folder: Path, admin_url: str) -> Iterator[Database]:
    """A new SQLite file in ``folder``, or a new PostgreSQL database dropped afterwards."""
    folder.mkdir(parents=True, exist_ok=True)
    if backend.kind == "sqlite":
        path = folder / "store.db"
        yield Database(backend, f"sqlite:///{path}?synchronous={backend.mode}", sqlite_path=path)
        return
    name = f"perdure_bench_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    try:
        _pg_admin(admin_url, f'CREATE DATABASE "{name}"')
    except Exception as exc:
        raise SystemExit(
            f"cannot create a database on PostgreSQL at {admin_url} ({exc}); start the server, "
            "pass --pg ADMIN_URL, or leave PostgreSQL out with --backends sqlite_full,sqlite_normal"
        ) from exc
    url = _pg_url_for(admin_url, name)
    try:
        yield Database(backend, url, pg_url=url)
    finally:
        with contextlib.suppress(Exception):
            _pg_admin(admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# -- floors: the cheapest durable write each backend can do --------------------------------

_BODY, _HASH, _SIGNATURE = b"x" * 160, os.urandom(32), os.urandom(64)
FLOOR_TABLE_SQLITE = (
    "CREATE TABLE rows (object_id TEXT NOT NULL, seq INTEGER NOT NULL, body BLOB NOT NULL,"
    " hash BLOB NOT NULL, signature BLOB NOT NULL, PRIMARY KEY (object_id, seq)) WITHOUT ROWID")
"""The floors' table on SQLite: a record-sized row, clustered by object and seq (as memory was
up to schema version 4, which keeps records in write order with an index on object and seq,
and so writes less per group commit than this floor)."""
FLOOR_TABLE_PG = (
    "CREATE TABLE {name} (object_id TEXT NOT NULL, seq INTEGER NOT NULL, body BYTEA NOT NULL,"
    " hash BYTEA NOT NULL, signature BYTEA NOT NULL, PRIMARY KEY (object_id, seq))")
"""The same on PostgreSQL; ``{name}`` is the table's name."""


def _floor_figures(times: list[float]) -> dict[str, Any]:
    mean = statistics.fmean(times)
    return {
        "commits": len(times),
        "us_per_commit": mean * 1e6,
        "us_per_commit_median": statistics.median(times) * 1e6,
        "commits_per_s": 1 / mean,
    }


def sqlite_floor(path: Path, mode: str, commits: int) -> dict[str, Any]:
    """One INSERT + COMMIT per iteration on a plain connection with the store's pragmas."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={mode.upper()}")
        conn.execute(FLOOR_TABLE_SQLITE)
        times: list[float] = []
        for seq in range(commits):
            began = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                "INSERT INTO rows VALUES (?, ?, ?, ?, ?)", ("object", seq, _BODY, _HASH, _SIGNATURE)
            )
            conn.execute("COMMIT")
            times.append(time.perf_counter() - began)
    finally:
        conn.close()
    return _floor_figures(times)


def pg_floor(url: str, commits: int) -> dict[str, Any]:
    """One INSERT + COMMIT per iteration on a plain psycopg connection to ``url``."""
    import psycopg

    with psycopg.connect(url) as conn:
        conn.execute(FLOOR_TABLE_PG.format(name="floor_rows"))
        conn.commit()
        times: list[float] = []
        for seq in range(commits):
            began = time.perf_counter()
            conn.execute(
                "INSERT INTO floor_rows VALUES (%s, %s, %s, %s, %s)",
                ("object", seq, _BODY, _HASH, _SIGNATURE),
            )
            conn.commit()
            times.append(time.perf_counter() - began)
    return _floor_figures(times)


def floor(db: Database, commits: int) -> dict[str, Any]:
    """The backend's floor commit, measured in ``db``."""
    if db.sqlite_path is not None:
        assert db.backend.mode is not None
        return sqlite_floor(db.sqlite_path.with_name("floor.db"), db.backend.mode, commits)
    assert db.pg_url is not None
    return pg_floor(db.pg_url, commits)


GROUP_OBJECTS, GROUP_ROWS = 50, 25


def _group_batches(rows: int) -> list[list[tuple[str, int]]]:
    """``(object, seq)`` of ``rows`` rows for ``GROUP_OBJECTS`` objects taken in turn,
    ``GROUP_ROWS`` to a commit: the shape of 50 objects sharing commits."""
    seqs = [0] * GROUP_OBJECTS
    order = []
    for n in range(rows):
        i = n % GROUP_OBJECTS
        seqs[i] += 1
        order.append((f"object-{i:03d}", seqs[i]))
    return [order[n:n + GROUP_ROWS] for n in range(0, rows, GROUP_ROWS)]


def _group_figures(times: list[float], rows: int) -> dict[str, Any]:
    total = sum(times)
    return {"rows": rows, "objects": GROUP_OBJECTS, "rows_per_commit": GROUP_ROWS,
            "us_per_row": total / rows * 1e6, "rows_per_s": rows / total,
            "us_per_commit": total / len(times) * 1e6}


def group_floor(db: Database, rows: int) -> dict[str, Any]:
    """The backend's floor for group commits: ``GROUP_ROWS`` hand-written INSERTs of
    ``GROUP_OBJECTS`` objects' rows (in turn) per commit, into the floor's table shape
    (rows clustered by object and seq, as memory is), on a plain connection. What the
    disk gives when many objects share commits: the ceiling for ``concurrent``."""
    batches = _group_batches(rows)
    times: list[float] = []
    if db.sqlite_path is not None:
        assert db.backend.mode is not None
        conn = sqlite3.connect(db.sqlite_path.with_name("group-floor.db"), isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={db.backend.mode.upper()}")
            conn.execute(FLOOR_TABLE_SQLITE)
            for batch in batches:
                began = time.perf_counter()
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany("INSERT INTO rows VALUES (?, ?, ?, ?, ?)",
                                 [(o, q, _BODY, _HASH, _SIGNATURE) for o, q in batch])
                conn.execute("COMMIT")
                times.append(time.perf_counter() - began)
        finally:
            conn.close()
        return _group_figures(times, rows)
    import psycopg

    assert db.pg_url is not None
    with psycopg.connect(db.pg_url) as pg:
        pg.execute(FLOOR_TABLE_PG.format(name="group_floor_rows"))
        pg.commit()
        for batch in batches:
            began = time.perf_counter()
            with pg.cursor() as cur:
                cur.executemany("INSERT INTO group_floor_rows VALUES (%s, %s, %s, %s, %s)",
                                [(o, q, _BODY, _HASH, _SIGNATURE) for o, q in batch])
            pg.commit()
            times.append(time.perf_counter() - began)
    return _group_figures(times, rows)


# -- figures ---------------------------------------------------------------------------------


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median of every numeric field over runs (booleans: all true; others: first run's)."""
    out: dict[str, Any] = {}
    for key, value in runs[0].items():
        if isinstance(value, bool):
            out[key] = all(r[key] for r in runs)
        elif isinstance(value, int | float):
            med = statistics.median(r[key] for r in runs)
            out[key] = round(med, 3) if isinstance(med, float) else med
        else:
            out[key] = value
    return out


def percentile(values: list[float], fraction: float) -> float:
    """The ``fraction`` quantile of ``values`` (nearest rank)."""
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * len(ordered) + 0.5) - 1))
    return ordered[index]


# -- machine facts ---------------------------------------------------------------------------


def _mount_of(path: Path) -> dict[str, str]:
    """Device, mount point and filesystem holding ``path`` (Linux; best effort)."""
    best: dict[str, str] = {}
    with contextlib.suppress(OSError):
        resolved = str(path.resolve())
        for line in Path("/proc/mounts").read_text().splitlines():
            device, mount, fstype, *_ = line.split()
            inside = resolved == mount or resolved.startswith(mount.rstrip("/") + "/")
            if inside and len(mount) >= len(best.get("mount", "")):
                best = {"device": device, "mount": mount, "filesystem": fstype}
    device = best.get("device", "")
    if device.startswith("/dev/"):
        name = device.removeprefix("/dev/")
        rotational = Path(f"/sys/class/block/{name}/queue/rotational")
        with contextlib.suppress(OSError):
            best["rotational"] = rotational.read_text().strip()
    return best


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _postgres_facts(admin_url: str) -> dict[str, Any]:
    try:
        import psycopg

        with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as conn:
            facts: dict[str, Any] = {
                "server_version": conn.execute("SHOW server_version").fetchone()[0],  # type: ignore[index]
            }
            for setting in ("synchronous_commit", "fsync", "wal_sync_method", "shared_buffers"):
                facts[setting] = conn.execute(f"SHOW {setting}").fetchone()[0]  # type: ignore[index]
            data_dir = conn.execute("SHOW data_directory").fetchone()[0]  # type: ignore[index]
            host = urlsplit(admin_url).hostname or "localhost"
            facts["host"] = host
            facts["data_directory"] = data_dir
            facts["disk"] = _mount_of(Path(data_dir))
            return facts
    except Exception as exc:
        return {"unavailable": str(exc).strip().splitlines()[0] if str(exc).strip() else "error"}


def _loadavg() -> list[float] | None:
    with contextlib.suppress(OSError):
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    return None


def machine(db_dir: Path, admin_url: str | None) -> dict[str, Any]:
    """What the figures were measured on."""
    facts: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "perdure": _version("perdure"),
        "cryptography": _version("cryptography"),
        "pynacl": _version("pynacl"),
        "psycopg": _version("psycopg"),
        "db_dir": str(db_dir),
        "disk": _mount_of(db_dir),
        "loadavg_at_start": _loadavg(),
    }
    if admin_url is not None:
        facts["postgresql"] = _postgres_facts(admin_url)
    return facts


def loadavg() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (Linux), to print beside the figures."""
    return _loadavg()


# -- worker processes ------------------------------------------------------------------------


def start_workers(
    url: str,
    key_dir: Path,
    count: int,
    *,
    concurrency: int | None,
    poll: float | None,
    log_dir: Path,
    gate: Path | None = None,
    lease: float | None = 5,
) -> list[subprocess.Popen[bytes]]:
    """Start ``count`` ``perdure worker`` processes on ``url`` running ``bench.agents``.

    ``concurrency``, ``poll`` and ``lease`` are passed as ``--concurrency``, ``--poll``
    and ``--lease``; ``None`` passes nothing, so the worker keeps its own default (the
    end-to-end part passes none of them)."""
    env = dict(os.environ)
    settings: list[str] = []
    for option, value, variable in (("--concurrency", concurrency, "PERDURE_CONCURRENCY"),
                                    ("--lease", lease, "PERDURE_LEASE"),
                                    ("--poll", poll, "PERDURE_POLL")):
        env.pop(variable, None)  # (the worker reads these as its options' defaults)
        if value is not None:
            settings += [option, str(value)]
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), env.get("PYTHONPATH", "")) if p
    )
    env.pop("PERDURE_BENCH_GATE", None)
    if gate is not None:
        env["PERDURE_BENCH_GATE"] = str(gate)
    log_dir.mkdir(parents=True, exist_ok=True)
    procs = []
    for i in range(count):
        with (log_dir / f"worker{i}.log").open("wb") as log:
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable, "-m", "perdure",
                        "--app", "bench.agents:app",
                        "--store", url,
                        "--key-dir", str(key_dir),
                        "--node-id", f"bench-w{i}",
                        "worker",
                        *settings,
                    ],
                    cwd=REPO,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
    return procs


def open_gate(gate: Path, procs: list[subprocess.Popen[bytes]], timeout: float = 60) -> None:
    """Wait until every worker process waits at ``gate``, then let them all go."""
    deadline = time.monotonic() + timeout
    while len(list(gate.parent.glob(f"{gate.name}.ready.*"))) < len(procs):
        for proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"worker process exited early with {proc.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError("worker processes did not reach the gate")
        time.sleep(0.005)
    gate.touch()


def stop_workers(procs: list[subprocess.Popen[bytes]], log_dir: Path | None = None) -> None:
    """SIGTERM each worker process, wait for it; raise if one had failed on its own."""
    failed = [p for p in procs if p.poll() is not None]
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if failed:
        where = f" (logs in {log_dir})" if log_dir is not None else ""
        raise RuntimeError(f"{len(failed)} worker process(es) stopped on their own{where}")


def progress(message: str) -> None:
    """One line on standard error: which part just finished and how long it took."""
    if os.environ.get("PERDURE_BENCH_QUIET") != "1":
        print(f"bench: {message}", file=sys.stderr, flush=True)
