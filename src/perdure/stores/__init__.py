"""Stores: one ``Store`` protocol, one module per backend, one URL parser."""

from __future__ import annotations

import math
from pathlib import Path
from urllib.parse import parse_qs, parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from perdure.errors import ConfigurationError
from perdure.stores._urls import redact_url
from perdure.stores.base import Append, Claim, Event, NewObject, ObjectRow, Store

__all__ = [
    "Append",
    "Claim",
    "Event",
    "NewObject",
    "ObjectRow",
    "Store",
    "open_store",
    "redact_url",
    "sqlite_file",
]


def sqlite_file(url: str) -> Path | None:
    """The database file a ``sqlite:///`` URL names (as given, relative or absolute);
    ``None`` for any other URL or one that names no file."""
    parts = urlsplit(url)
    if parts.scheme.lower() != "sqlite" or parts.netloc:
        return None
    raw = unquote(parts.path)
    return Path(raw[1:]) if raw and raw != "/" else None


def open_store(url: str) -> Store:
    """Open the store a URL names.

    ``sqlite:///relative.db`` and ``sqlite:////absolute/path.db`` (SQLAlchemy form);
    query options ``synchronous=full|normal`` and ``busy_timeout=SECONDS``.
    ``postgresql://user@host:5432/db`` (needs ``pip install 'perdure[postgres]'``);
    query options ``pool_size``, ``connect_timeout_s`` and ``idle_tx_timeout_s``
    (default 30: the server ends a session left idle inside a transaction, such as
    a frozen node's, so its row locks do not block other nodes); the rest go to libpq.
    ``memory:`` or ``memory://NAME``: a new, empty in-memory store, for tests (the name
    is only shown in banners; see ``perdure.stores.memory``).
    """
    parts = urlsplit(url)
    shown = redact_url(url)
    scheme = parts.scheme.lower()
    if scheme == "sqlite":
        if parts.netloc:
            raise ConfigurationError(
                f"store URL {shown!r}: a SQLite URL has no host; use sqlite:///relative.db "
                "or sqlite:////absolute/path.db"
            )
        raw = unquote(parts.path)
        if not raw or raw == "/":
            raise ConfigurationError(f"store URL {shown!r} names no file; use sqlite:///agents.db")
        path = Path(raw[1:])  # one slash separates the empty host from the path
        options = {key: values[-1] for key, values in parse_qs(parts.query).items()}
        unknown = set(options) - {"synchronous", "busy_timeout"}
        if unknown:
            raise ConfigurationError(
                f"store URL {shown!r}: unknown option(s) {sorted(unknown)}; "
                "known: synchronous, busy_timeout"
            )
        from perdure.stores.sqlite import SQLiteStore

        try:
            timeout = float(options.get("busy_timeout", "30"))
        except ValueError as exc:
            raise ConfigurationError(f"store URL {shown!r}: busy_timeout must be seconds") from exc
        return SQLiteStore(
            path, synchronous=options.get("synchronous", "full"), busy_timeout=timeout, url=url
        )
    if scheme in ("postgresql", "postgres"):
        return _open_postgres(url, parts.query)
    if scheme == "memory":
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ConfigurationError(
                f"store URL {shown!r}: an in-memory store takes no path or options; "
                "use memory: or memory://NAME"
            )
        from perdure.stores.memory import MemoryStore

        return MemoryStore(url)
    if not scheme:  # a bare file name or path, such as agents.db
        bare = url if url.startswith("/") else url.removeprefix("./")
        raise ConfigurationError(
            f"store URL {shown!r} has no scheme; for a SQLite file write "
            f"sqlite:///{bare} (or postgresql://USER@HOST:PORT/DB, memory:)"
        )
    raise ConfigurationError(
        f"store URL {shown!r}: unknown scheme {parts.scheme!r}; use sqlite:///FILE, "
        "postgresql://USER@HOST:PORT/DB or memory:"
    )


_PG_OPTIONS = {"pool_size", "connect_timeout_s", "idle_tx_timeout_s"}


def _open_postgres(url: str, query: str) -> Store:
    """``postgresql://user:pass@host:port/db?pool_size=8&connect_timeout_s=5``.

    Other query parameters (``sslmode``, ``application_name``, ...) go to libpq.
    """
    shown = redact_url(url)
    try:
        from perdure.stores.postgres import PostgresStore
    except ImportError as exc:  # pragma: no cover - raised as ConfigurationError inside
        raise ConfigurationError(
            "the PostgreSQL store needs psycopg: pip install 'perdure[postgres]'"
        ) from exc
    pairs = parse_qsl(query, keep_blank_values=True)
    ours = {key: value for key, value in pairs if key in _PG_OPTIONS}
    rest = [(key, value) for key, value in pairs if key not in _PG_OPTIONS]
    conninfo = urlunsplit(urlsplit(url)._replace(scheme="postgresql", query=urlencode(rest)))
    try:
        pool_size = int(ours.get("pool_size", "8"))
    except ValueError:
        pool_size = 0
    if pool_size < 1:
        raise ConfigurationError(
            f"store URL {shown!r}: pool_size must be a whole number of connections, at least 1"
        )
    try:
        timeout = float(ours.get("connect_timeout_s", "5"))
    except ValueError:
        timeout = math.nan
    if not timeout > 0 or math.isinf(timeout):
        raise ConfigurationError(
            f"store URL {shown!r}: connect_timeout_s must be a number of seconds above 0"
        )
    try:
        idle_tx = float(ours.get("idle_tx_timeout_s", "30"))
    except ValueError:
        idle_tx = -1.0
    if idle_tx < 0:
        raise ConfigurationError(
            f"store URL {shown!r}: idle_tx_timeout_s must be seconds (0 turns it off)"
        )
    return PostgresStore(conninfo, pool_size=pool_size, connect_timeout=timeout,
                         idle_tx_timeout=idle_tx, url=url)

