"""Stores: one ``Store`` protocol, one module per backend, one URL parser."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from perdure.errors import ConfigurationError
from perdure.stores.base import Append, Claim, Event, NewObject, ObjectRow, Store

__all__ = ["Append", "Claim", "Event", "NewObject", "ObjectRow", "Store", "open_store"]


def open_store(url: str) -> Store:
    """Open the store a URL names.

    ``sqlite:///relative.db`` and ``sqlite:////absolute/path.db`` (SQLAlchemy form);
    query options ``synchronous=full|normal`` and ``busy_timeout=SECONDS``.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "sqlite":
        if parts.netloc:
            raise ConfigurationError(
                f"store URL {url!r}: a SQLite URL has no host; use sqlite:///relative.db "
                "or sqlite:////absolute/path.db"
            )
        raw = unquote(parts.path)
        if not raw or raw == "/":
            raise ConfigurationError(f"store URL {url!r} names no file; use sqlite:///agents.db")
        path = Path(raw[1:])  # one slash separates the empty host from the path
        options = {key: values[-1] for key, values in parse_qs(parts.query).items()}
        unknown = set(options) - {"synchronous", "busy_timeout"}
        if unknown:
            raise ConfigurationError(
                f"store URL {url!r}: unknown option(s) {sorted(unknown)}; "
                "known: synchronous, busy_timeout"
            )
        from perdure.stores.sqlite import SQLiteStore

        try:
            timeout = float(options.get("busy_timeout", "30"))
        except ValueError as exc:
            raise ConfigurationError(f"store URL {url!r}: busy_timeout must be seconds") from exc
        return SQLiteStore(
            path, synchronous=options.get("synchronous", "full"), busy_timeout=timeout, url=url
        )
    if scheme in ("postgresql", "postgres"):
        raise ConfigurationError(
            f"store URL {url!r}: the PostgreSQL store is not available in this version; "
            "use sqlite:///FILE"
        )
    raise ConfigurationError(
        f"store URL {url!r}: unknown scheme {parts.scheme!r}; use sqlite:///FILE"
    )
