"""Built-in recipes for sessions with other systems: a PostgreSQL session with its
settings (``perdure[postgres]``) and an HTTP session with auth headers
(``perdure[resources]``, httpx).

What comes back is a *new* session with the same settings: an open transaction on
the dead connection is gone (PostgreSQL rolled it back when the connection died),
and so is anything in flight on a socket. A step that must know whether its
transaction committed records a progress marker with the transaction id
(``txid_current()``) and asks ``txid_status`` on retry: see docs/howto/resources.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from perdure.errors import CannotRestoreError, ConfigurationError
from perdure.resources._protocol import Fresh, Invalidate, Resource, Stale, Validity

__all__ = ["HttpSession", "PostgresSession"]

# Connection failures that say this node has no route to the server (not that it is down).
_NO_ROUTE = ("could not translate host name", "name or service not known",
             "no route to host", "network is unreachable")


class PostgresSession(Resource[Any]):
    """A PostgreSQL session (a ``psycopg.AsyncConnection`` in autocommit mode) with
    session ``settings`` (``search_path``, ``statement_timeout``, ...) and a ``role``
    (``SET ROLE``). The URL holds credentials: it is never printed."""

    def __init__(self, url: str, *, settings: Mapping[str, str] | None = None,
                 role: str | None = None, on_stale: str | Invalidate = "refresh",
                 checks: Sequence[Any] = ()) -> None:
        super().__init__(on_stale=on_stale, checks=checks)
        if not isinstance(url, str) or not url.startswith(("postgresql://", "postgres://")):
            raise ConfigurationError("PostgresSession: url must be a postgresql:// URL")
        self.url = url
        self.settings = {str(k): str(v) for k, v in (settings or {}).items()}
        self.role = role
        self._effective: dict[str, str] = {}

    async def open(self) -> Any:
        live = await _connect(self.url, self.settings, self.role)
        self._effective = await _effective(live, self.settings, self.role)
        return live

    def describe(self, live: Any) -> dict[str, Any]:
        return {"url": self.url, "settings": self.settings, "role": self.role,
                "effective": self._effective}

    @classmethod
    async def restore(cls, descriptor: dict[str, Any]) -> Any:
        return await _connect(str(descriptor["url"]), dict(descriptor.get("settings") or {}),
                              descriptor.get("role"))

    @classmethod
    async def validate(cls, descriptor: dict[str, Any], live: Any) -> Validity:
        want = dict(descriptor.get("effective") or {})
        have = await _effective(live, dict(descriptor.get("settings") or {}),
                                descriptor.get("role"))
        differ = sorted(k for k in want if want[k] != have.get(k))
        if differ:
            return Stale("session settings differ: " + ", ".join(
                f"{k} {want[k]!r} -> {have.get(k)!r}" for k in differ))
        return await super().validate(descriptor, live)

    @classmethod
    async def close(cls, live: Any) -> None:
        await live.close()


async def _connect(url: str, settings: Mapping[str, str], role: str | None) -> Any:
    try:
        import psycopg
    except ImportError:
        raise CannotRestoreError("psycopg is not installed on this node: pip install "
                                 "'perdure[postgres]'") from None
    try:
        live = await psycopg.AsyncConnection.connect(url, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        text = str(exc).lower()
        if any(marker in text for marker in _NO_ROUTE):
            raise CannotRestoreError(f"no route to the PostgreSQL server from this node: "
                                     f"{_first_line(exc)}") from None
        raise ConnectionError(f"cannot connect to PostgreSQL: {_first_line(exc)}") from None
    try:
        for name, value in settings.items():
            await live.execute("SELECT set_config(%s, %s, false)", (name, value))
        if role is not None:
            await live.execute("SELECT set_config('role', %s, false)", (role,))
    except BaseException:
        await live.close()
        raise
    return live


async def _effective(live: Any, settings: Mapping[str, str], role: str | None
                     ) -> dict[str, str]:
    names = [*settings, *(["role"] if role is not None else [])]
    seen = {}
    for name in names:
        cur = await live.execute("SELECT current_setting(%s)", (name,))
        row = await cur.fetchone()
        seen[name] = str(row[0])
    return seen


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


class HttpSession(Resource[Any]):
    """An HTTP session (an ``httpx.AsyncClient``) on ``base_url`` with ``headers``
    (authorization among them; the values of ``secret`` headers are never printed).
    ``check`` is a path answered with a status below 400 while the session is good
    (a 401 says the credential expired: stale)."""

    def __init__(self, base_url: str, *, headers: Mapping[str, str] | None = None,
                 secret: Iterable[str] = ("authorization",), timeout: float = 30.0,
                 check: str | None = None, on_stale: str | Invalidate = "park",
                 checks: Sequence[Any] = ()) -> None:
        super().__init__(on_stale=on_stale, checks=checks)
        self.base_url = base_url
        self.headers = {str(k): str(v) for k, v in (headers or {}).items()}
        self.secret = sorted({s.lower() for s in secret})
        self.timeout = float(timeout)
        self.check = check

    async def open(self) -> Any:
        return _client(self.base_url, self.headers, self.timeout)

    def describe(self, live: Any) -> dict[str, Any]:
        return {"base_url": self.base_url, "headers": self.headers, "secret": self.secret,
                "timeout": self.timeout, "check": self.check}

    @classmethod
    async def restore(cls, descriptor: dict[str, Any]) -> Any:
        return _client(str(descriptor["base_url"]), dict(descriptor.get("headers") or {}),
                       float(descriptor.get("timeout") or 30.0))

    @classmethod
    async def validate(cls, descriptor: dict[str, Any], live: Any) -> Validity:
        path = descriptor.get("check")
        if path:
            reply = await live.get(str(path))
            if reply.status_code >= 400:
                return Stale(f"GET {path} answered {reply.status_code}")
        return await super().validate(descriptor, live) if descriptor.get("checks") else Fresh()

    @classmethod
    async def close(cls, live: Any) -> None:
        await live.aclose()


def _client(base_url: str, headers: dict[str, str], timeout: float) -> Any:
    try:
        import httpx
    except ImportError:
        raise CannotRestoreError("httpx is not installed on this node: pip install "
                                 "'perdure[resources]'") from None
    return httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout)
