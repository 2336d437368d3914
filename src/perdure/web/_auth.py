"""Who may use the dashboard and the HTTP API: tokens and passwords, roles and scopes,
sessions, throttling.

A dashboard token is generated on the dashboard's first start (one per role), printed
once, and only its scrypt hash is kept, in the key folder's ``ui-auth.json`` (mode 0600).
A password may be configured instead (or as well) per role. Logging in with either opens
a session: a random id in an ``HttpOnly; SameSite=Strict`` cookie (``Secure`` over
https), with its own CSRF token, held in the server's memory only (a restart logs
everybody out).

An API token (``ApiTokens``) is made by ``perdure api-token create NAME --scope ...``
for one caller: a name (who its actions are noted as), scopes (``read``, ``operate``,
``approve``) and an optional expiry; it is printed once and only its scrypt hash is
kept, in the key folder's ``api-tokens.json`` (mode 0600). The token carries its id
(``pdr_<id>_<secret>``), so checking one hashes once, against its own entry; a token
proved once is remembered (by its SHA-256) for as long as its entry is unchanged, so a
caller does not pay for scrypt on every request, and a revoked or expired token stops
working at its next request.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import re
import secrets
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perdure.core.names import check_name
from perdure.errors import ConfigurationError

__all__ = ["API_TOKENS_FILE", "APPROVE", "AUTH_FILE", "OPERATE", "OPERATOR", "READ", "ROLES",
           "SCOPES", "VIEWER", "ApiToken", "ApiTokens", "Credentials", "Principal",
           "Session", "Sessions", "Throttle"]

AUTH_FILE = "ui-auth.json"
VIEWER = "viewer"
OPERATOR = "operator"
ROLES = (VIEWER, OPERATOR)

API_TOKENS_FILE = "api-tokens.json"
READ = "read"
OPERATE = "operate"
APPROVE = "approve"
SCOPES = (READ, OPERATE, APPROVE)
"""What an API token may do: ``read`` (objects, results, streams, questions, approvals,
queries), ``operate`` (start, send, answer, pause, resume, cancel, retry), ``approve``
(decide on tool calls). Each is granted on its own."""

_SCRYPT = {"n": 2**14, "r": 8, "p": 1, "dklen": 32}
_MAX_SECRET = 1024  # characters of a token or password considered at all


def _hash(secret: str, salt: bytes) -> bytes:
    return hashlib.scrypt(secret.encode("utf-8", "surrogatepass")[:_MAX_SECRET * 4],
                          salt=salt, **_SCRYPT)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is logged in: the name they gave, their role, and how they proved it."""

    name: str
    role: str
    method: str  # "token" or "password"
    #: Through what they act: ``dashboard`` or ``api``.
    via: str = "dashboard"
    #: The id of the API token they proved (``None`` for the dashboard).
    credential: str | None = None

    @property
    def can_act(self) -> bool:
        """Operators act (send, pause, cancel, approve...); viewers only read."""
        return self.role == OPERATOR

    def label(self) -> str:
        """``name (role, method)``: who took an action, as memory records it."""
        return f"{self.name} ({self.role}, {self.method})"


class Credentials:
    """The dashboard's secrets: per role a stored token hash and/or a password."""

    def __init__(self, key_dir: Path, *, passwords: dict[str, str] | None = None) -> None:
        self.path = Path(key_dir) / AUTH_FILE
        self._passwords: dict[str, tuple[bytes, bytes]] = {}
        for role, password in (passwords or {}).items():
            if role not in ROLES:
                raise ConfigurationError(f"unknown dashboard role {role!r}; one of "
                                         f"{', '.join(ROLES)}")
            if len(password) < 8:
                raise ConfigurationError(f"the {role} password is shorter than 8 characters; "
                                         "choose a longer one")
            salt = os.urandom(16)
            self._passwords[role] = (salt, _hash(password, salt))

    @property
    def has_password(self) -> bool:
        """Whether a password is configured for any role."""
        return bool(self._passwords)

    def _load(self) -> dict[str, dict[str, str]]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise ConfigurationError(f"cannot read the dashboard's tokens in {self.path}: "
                                     f"{exc}; remove the file to issue new ones") from None
        tokens = data.get("tokens") if isinstance(data, dict) else None
        if not isinstance(tokens, dict) or not all(
                isinstance(v, dict) and isinstance(v.get("salt"), str)
                and isinstance(v.get("hash"), str) for v in tokens.values()):
            raise ConfigurationError(f"the dashboard's token file {self.path} is damaged; "
                                     "remove it to issue new tokens")
        return {str(k): v for k, v in tokens.items() if k in ROLES}

    def ensure_tokens(self, *, reissue: bool = False) -> dict[str, str]:
        """Issue a token per role unless the key folder holds them already: returns the
        new tokens (to print once) or ``{}`` when they existed."""
        if not reissue and self._load():
            return {}
        fresh = {role: secrets.token_urlsafe(24) for role in ROLES}
        stored = {}
        for role, token in fresh.items():
            salt = os.urandom(16)
            stored[role] = {"salt": salt.hex(), "hash": _hash(token, salt).hex()}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump({"tokens": stored, "created_at": time.time()}, out)
        os.replace(tmp, self.path)
        return fresh

    def check(self, secret: str) -> tuple[str, str] | None:
        """``(role, method)`` that ``secret`` proves, operator first; ``None``."""
        if not secret or len(secret) > _MAX_SECRET:
            return None
        tokens = self._load()
        for role in (OPERATOR, VIEWER):
            entry = tokens.get(role)
            if entry is not None:
                try:
                    salt, want = bytes.fromhex(entry["salt"]), bytes.fromhex(entry["hash"])
                except ValueError:
                    continue
                if hmac.compare_digest(_hash(secret, salt), want):
                    return role, "token"
            pw = self._passwords.get(role)
            if pw is not None and hmac.compare_digest(_hash(secret, pw[0]), pw[1]):
                return role, "password"
        return None


@dataclass(slots=True)
class Session:
    """A logged-in browser: who, its CSRF token, and until when it lasts."""

    principal: Principal
    csrf: str
    expires: float
    created: float = field(default_factory=time.time)


class Sessions:
    """Sessions by id, in memory; ids are 256-bit random, compared as dict keys."""

    def __init__(self, lifetime: float = 12 * 3600, limit: int = 10_000) -> None:
        self.lifetime = lifetime
        self.limit = limit
        self._lock = threading.Lock()
        self._by_id: dict[str, Session] = {}

    def open(self, principal: Principal) -> tuple[str, Session]:
        """A new session for ``principal``: its id (the cookie's value) and itself."""
        now = time.time()
        sid = secrets.token_urlsafe(32)
        session = Session(principal, secrets.token_urlsafe(32), now + self.lifetime)
        with self._lock:
            if len(self._by_id) >= self.limit:
                for key in [k for k, s in self._by_id.items() if s.expires <= now]:
                    del self._by_id[key]
                if len(self._by_id) >= self.limit:  # drop the oldest
                    oldest = min(self._by_id, key=lambda k: self._by_id[k].created)
                    del self._by_id[oldest]
            self._by_id[sid] = session
        return sid, session

    def get(self, sid: str | None) -> Session | None:
        """The live session of ``sid``; ``None`` for none, unknown or expired."""
        if not sid or len(sid) > 100:
            return None
        with self._lock:
            session = self._by_id.get(sid)
            if session is not None and session.expires <= time.time():
                del self._by_id[sid]
                return None
            return session

    def close(self, sid: str | None) -> None:
        """End a session (logout)."""
        with self._lock:
            self._by_id.pop(sid or "", None)


class Throttle:
    """Login attempts per client: after ``allowed`` failures within ``window`` seconds,
    that client is refused until the window passes.

    An attempt counts from the moment it is let in (``attempt``), before its secret is
    hashed, as a failure until it proves otherwise (``succeeded`` takes it back): logins
    sent at once cannot all be evaluated while none of them has failed yet.
    """

    def __init__(self, allowed: int = 5, window: float = 60.0) -> None:
        self.allowed = allowed
        self.window = window
        self._lock = threading.Lock()
        self._failures: dict[str, list[float]] = {}

    def _recent(self, client: str, now: float) -> list[float]:
        recent = [t for t in self._failures.get(client, []) if t > now - self.window]
        self._failures[client] = recent
        return recent

    def blocked(self, client: str) -> bool:
        """Whether ``client`` must wait before trying again."""
        with self._lock:
            return len(self._recent(client, time.time())) >= self.allowed

    def attempt(self, client: str) -> float | None:
        """Let one login attempt of ``client`` in, counted as failed until
        ``succeeded``: its stamp, or ``None`` when the client must wait (too many
        failures, or attempts still being checked)."""
        now = time.time()
        with self._lock:
            if len(self._failures) > 10_000:
                self._failures.clear()
            recent = self._recent(client, now)
            if len(recent) >= self.allowed:
                return None
            recent.append(now)
            return now

    def succeeded(self, client: str, stamp: float) -> None:
        """The attempt let in at ``stamp`` proved its secret: it is no failure."""
        with self._lock:
            recent = self._failures.get(client, [])
            if stamp in recent:
                recent.remove(stamp)

    def failed(self, client: str) -> None:
        """Count a failure of ``client`` (a bearer token that proved nothing)."""
        now = time.time()
        with self._lock:
            if len(self._failures) > 10_000:
                self._failures.clear()
            self._recent(client, now).append(now)


# -- API tokens ------------------------------------------------------------------------

_TOKEN = re.compile(r"pdr_([0-9a-f]{12})_([A-Za-z0-9_-]{20,200})")
_PROVED_MAX = 1000  # tokens remembered as proved


@dataclass(frozen=True, slots=True)
class ApiToken:
    """An API token as the key folder keeps it (never its secret): its id, the name its
    actions are noted under, its scopes, when it was made and when it expires."""

    token_id: str
    name: str
    scopes: tuple[str, ...]
    created_at: float
    expires_at: float | None = None

    def expired(self, now: float) -> bool:
        """Whether the token no longer works at ``now``."""
        return self.expires_at is not None and now >= self.expires_at

    def to_json(self) -> dict[str, Any]:
        """The token as JSON (what ``perdure api-token list --json`` prints)."""
        return {"id": self.token_id, "name": self.name, "scopes": list(self.scopes),
                "created_at": self.created_at, "expires_at": self.expires_at}


def check_scopes(scopes: Sequence[str]) -> tuple[str, ...]:
    """``scopes`` in their canonical order; ``ConfigurationError`` for an unknown one or
    none."""
    for scope in scopes:
        if scope not in SCOPES:
            raise ConfigurationError(f"unknown scope {scope!r}; one of {', '.join(SCOPES)}")
    if not scopes:
        raise ConfigurationError(f"give the token at least one scope ({', '.join(SCOPES)})")
    return tuple(s for s in SCOPES if s in scopes)


class ApiTokens:
    """The API's tokens, kept hashed in ``<key_dir>/api-tokens.json`` (see the module)."""

    def __init__(self, key_dir: Path) -> None:
        self.path = Path(key_dir) / API_TOKENS_FILE
        self._lock = threading.Lock()
        self._read: tuple[tuple[int, int, int], dict[str, dict[str, Any]]] | None = None
        self._proved: dict[bytes, str] = {}  # sha256(token) -> the entry's hash it matched

    # -- the file -------------------------------------------------------------------

    def _entries(self) -> dict[str, dict[str, Any]]:
        """The file's entries by token id (re-read only when the file changed)."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise ConfigurationError(f"cannot read the API tokens in {self.path}: "
                                     f"{exc.strerror or exc}") from None
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        with self._lock:
            if self._read is not None and self._read[0] == stamp:
                return self._read[1]
        entries = self._parse()
        with self._lock:
            self._read = (stamp, entries)
        return entries

    def _parse(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise ConfigurationError(f"cannot read the API tokens in {self.path}: {exc}; "
                                     "remove the file and create new tokens") from None
        tokens = data.get("tokens") if isinstance(data, dict) else None
        if not isinstance(tokens, dict) or not all(
                isinstance(v, dict) and isinstance(v.get("salt"), str)
                and isinstance(v.get("hash"), str) and isinstance(v.get("name"), str)
                and isinstance(v.get("scopes"), list) for v in tokens.values()):
            raise ConfigurationError(f"the API token file {self.path} is damaged; remove it "
                                     "and create new tokens")
        return {str(k): v for k, v in tokens.items()}

    @contextlib.contextmanager
    def _changing(self) -> Iterator[dict[str, dict[str, Any]]]:
        """The entries to change, under a lock file; written back (mode 0600) after."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = os.open(self.path.with_suffix(".lock"), os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            entries = dict(self._parse())
            yield entries
            tmp = self.path.with_suffix(".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as out:
                json.dump({"tokens": entries}, out, indent=1)
            os.replace(tmp, self.path)
        finally:
            os.close(lock)

    @staticmethod
    def _token(token_id: str, entry: dict[str, Any]) -> ApiToken:
        expires = entry.get("expires_at")
        return ApiToken(token_id, str(entry["name"]),
                        tuple(s for s in SCOPES if s in entry["scopes"]),
                        float(entry.get("created_at") or 0.0),
                        None if expires is None else float(expires))

    # -- what the CLI does ---------------------------------------------------------------

    def create(self, name: str, scopes: Sequence[str], *, days: float | None = None
               ) -> tuple[str, ApiToken]:
        """A new token for ``name`` with ``scopes`` (expiring after ``days``): the token
        itself (print it once; only its hash is kept) and what is kept of it."""
        check_name(name, "token name")
        granted = check_scopes(scopes)
        if days is not None and not days > 0:
            raise ConfigurationError("--days must be more than 0")
        token_id = secrets.token_hex(6)
        secret = secrets.token_urlsafe(32)
        salt = os.urandom(16)
        now = time.time()
        entry = {"name": name, "scopes": list(granted), "salt": salt.hex(),
                 "hash": _hash(secret, salt).hex(), "created_at": now,
                 "expires_at": None if days is None else now + days * 86400}
        with self._changing() as entries:
            entries[token_id] = entry
        return f"pdr_{token_id}_{secret}", self._token(token_id, entry)

    def list(self) -> list[ApiToken]:
        """Every token kept, oldest first (expired ones too)."""
        found = [self._token(k, v) for k, v in self._entries().items()]
        return sorted(found, key=lambda t: (t.created_at, t.token_id))

    def revoke(self, token_id: str) -> bool:
        """Remove the token ``token_id``; ``False`` if there was none."""
        with self._changing() as entries:
            return entries.pop(token_id, None) is not None

    # -- what the API does -------------------------------------------------------------------

    def check(self, token: str) -> ApiToken | None:
        """The live token ``token`` proves, or ``None`` (unknown, wrong, revoked, expired).
        Hashes with scrypt the first time a token is seen (call it off the event loop)."""
        if not token or len(token) > _MAX_SECRET:
            return None
        match = _TOKEN.fullmatch(token)
        if match is None:
            return None
        token_id, secret = match.groups()
        entry = self._entries().get(token_id)
        if entry is None:
            return None
        found = self._token(token_id, entry)
        if found.expired(time.time()):
            return None
        digest = hashlib.sha256(token.encode()).digest()
        with self._lock:
            known = self._proved.get(digest)
        if known is None or not hmac.compare_digest(known, entry["hash"]):
            try:
                salt, want = bytes.fromhex(entry["salt"]), bytes.fromhex(entry["hash"])
            except ValueError:
                return None
            if not hmac.compare_digest(_hash(secret, salt), want):
                return None
            with self._lock:
                if len(self._proved) >= _PROVED_MAX:
                    self._proved.clear()
                self._proved[digest] = entry["hash"]
        return found
