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

import asyncio
import importlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from perdure.core.secret import Secret
from perdure.errors import CannotRestoreError, ConfigurationError
from perdure.resources._protocol import Fresh, Invalidate, Resource, Stale, Validity

__all__ = ["HttpSession", "PostgresSession"]

# Connection failures that say this node has no route to the server (not that it is down).
_NO_ROUTE = ("could not translate host name", "name or service not known",
             "no route to host", "network is unreachable")


class PostgresSession(Resource[Any]):
    """A PostgreSQL session (a ``psycopg.AsyncConnection`` in autocommit mode) with
    session ``settings`` (``search_path``, ``statement_timeout``, ...) and a ``role``
    (``SET ROLE``).

    Credentials are secrets: a password in the URL (its user part or a ``password``
    query parameter) is taken out of it and kept, like ``password=`` (which wins), as
    a ``perdure.Secret`` in the descriptor (sealed at rest, never printed); a URL given
    as a ``Secret`` is kept sealed whole. Restore reveals them to the new connection
    only."""

    versions = (1, 2)  # 2: the password (or the whole URL) is a Secret

    def __init__(self, url: str | Secret[str], *, password: str | Secret[str] | None = None,
                 settings: Mapping[str, str] | None = None, role: str | None = None,
                 on_stale: str | Invalidate = "refresh", checks: Sequence[Any] = ()) -> None:
        super().__init__(on_stale=on_stale, checks=checks)
        plain = url.reveal() if isinstance(url, Secret) else url
        if not isinstance(plain, str) or not plain.startswith(("postgresql://",
                                                               "postgres://")):
            raise ConfigurationError("PostgresSession: url must be a postgresql:// URL")
        if password is not None and not isinstance(
                password.reveal() if isinstance(password, Secret) else password, str):
            raise ConfigurationError("PostgresSession: password must be a string or a "
                                     "Secret string")
        self.url: str | Secret[str] = url
        self.password: Secret[str] | None = (
            None if password is None else Secret(str(_revealed(password))))
        if isinstance(url, str):
            bare, found = _without_password(url)
            self.url = bare
            if found is not None and self.password is None:
                self.password = Secret(found)
        self.settings = {str(k): str(v) for k, v in (settings or {}).items()}
        self.role = role
        self._effective: dict[str, str] = {}

    async def open(self) -> Any:
        live = await _connect(self.url, self.password, self.settings, self.role)
        self._effective = await _effective(live, self.settings, self.role)
        return live

    def describe(self, live: Any) -> dict[str, Any]:
        return {"url": self.url, "password": self.password, "settings": self.settings,
                "role": self.role, "effective": self._effective}

    @classmethod
    async def restore(cls, descriptor: dict[str, Any]) -> Any:
        return await _connect(descriptor["url"], descriptor.get("password"),
                              dict(descriptor.get("settings") or {}), descriptor.get("role"))

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


def _without_password(url: str) -> tuple[str, str | None]:
    """``url`` without the password in it (in its user part or a ``password=`` query
    parameter), and that password (``None`` if it had none; the user part's wins)."""
    parts = urlsplit(url)
    found: str | None = None
    query = parse_qsl(parts.query, keep_blank_values=True)
    kept = [(k, v) for k, v in query if k != "password"]
    if len(kept) != len(query):
        found = [v for k, v in query if k == "password"][-1]
        parts = parts._replace(query=urlencode(kept))
    if parts.password is not None:
        user, _, host = parts.netloc.rpartition("@")
        found = unquote(parts.password)
        parts = parts._replace(netloc=f"{user.partition(':')[0]}@{host}")
    return urlunsplit(parts), found


def _revealed(value: Any) -> Any:
    return value.reveal() if isinstance(value, Secret) else value


async def _connect(url: str | Secret[str], password: str | Secret[str] | None,
                   settings: Mapping[str, str], role: str | None) -> Any:
    try:  # the driver's first import takes hundreds of ms: never on a worker's loop
        psycopg = await asyncio.to_thread(importlib.import_module, "psycopg")
    except ImportError:
        raise CannotRestoreError("psycopg is not installed on this node: pip install "
                                 "'perdure[postgres]'") from None
    extra: dict[str, Any] = {} if password is None else {"password": str(_revealed(password))}
    # Texts an error message must not quote: the password, and a URL given as a Secret.
    hidden = [text for text in (extra.get("password"), str(_revealed(url)) if isinstance(
        url, Secret) else None) if text]
    try:
        live = await psycopg.AsyncConnection.connect(str(_revealed(url)), autocommit=True,
                                                     connect_timeout=10, **extra)
    except psycopg.Error as exc:
        said = _first_line(exc)
        for text in sorted(hidden, key=len, reverse=True):
            said = said.replace(text, "***")
        if not isinstance(exc, psycopg.OperationalError):  # a malformed URL or option
            raise ConfigurationError(f"PostgresSession: {said}") from None
        if any(marker in said.lower() for marker in _NO_ROUTE):
            raise CannotRestoreError(f"no route to the PostgreSQL server from this node: "
                                     f"{said}") from None
        raise ConnectionError(f"cannot connect to PostgreSQL: {said}") from None
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
    (authorization among them). The values of ``secret`` headers, and any header given
    as a ``perdure.Secret``, are kept as ``Secret`` in the descriptor (sealed at rest,
    never printed) and revealed to the client only.
    ``check`` is a path answered with a status below 400 while the session is good
    (a 401 says the credential expired: stale)."""

    versions = (1, 2)  # 2: secret header values are Secrets

    def __init__(self, base_url: str, *,
                 headers: Mapping[str, str | Secret[str]] | None = None,
                 secret: Iterable[str] = ("authorization",), timeout: float = 30.0,
                 check: str | None = None, on_stale: str | Invalidate = "park",
                 checks: Sequence[Any] = ()) -> None:
        super().__init__(on_stale=on_stale, checks=checks)
        self.base_url = base_url
        given = dict(headers or {})
        hidden = {s.lower() for s in secret} | {
            str(k).lower() for k, v in given.items() if isinstance(v, Secret)}
        self.headers = {str(k): str(_revealed(v)) for k, v in given.items()}
        self.secret = sorted(hidden)
        self.timeout = float(timeout)
        self.check = check

    async def open(self) -> Any:
        return await _client(self.base_url, self.headers, self.timeout)

    def describe(self, live: Any) -> dict[str, Any]:
        hidden = set(self.secret)
        headers = {k: Secret(v) if k.lower() in hidden else v
                   for k, v in self.headers.items()}
        return {"base_url": self.base_url, "headers": headers, "secret": self.secret,
                "timeout": self.timeout, "check": self.check}

    @classmethod
    async def restore(cls, descriptor: dict[str, Any]) -> Any:
        headers = {str(k): str(_revealed(v))
                   for k, v in dict(descriptor.get("headers") or {}).items()}
        return await _client(str(descriptor["base_url"]), headers,
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


async def _client(base_url: str, headers: dict[str, str], timeout: float) -> Any:
    """An ``httpx.AsyncClient``, imported and made on a thread (importing httpx and
    loading its certificates would block a worker's event loop)."""
    def made() -> Any:
        try:
            import httpx
        except ImportError:
            raise CannotRestoreError("httpx is not installed on this node: pip install "
                                     "'perdure[resources]'") from None
        return httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout)

    return await asyncio.to_thread(made)
