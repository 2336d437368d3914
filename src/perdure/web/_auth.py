"""Who may use the dashboard: tokens and passwords, roles, sessions, login throttling.

A token is generated on the dashboard's first start (one per role), printed once, and
only its scrypt hash is kept, in the key folder's ``ui-auth.json`` (mode 0600). A
password may be configured instead (or as well) per role. Logging in with either opens
a session: a random id in an ``HttpOnly; SameSite=Strict`` cookie (``Secure`` over
https), with its own CSRF token, held in the server's memory only (a restart logs
everybody out).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from perdure.errors import ConfigurationError

__all__ = ["AUTH_FILE", "OPERATOR", "ROLES", "VIEWER", "Credentials", "Principal",
           "Session", "Sessions", "Throttle"]

AUTH_FILE = "ui-auth.json"
VIEWER = "viewer"
OPERATOR = "operator"
ROLES = (VIEWER, OPERATOR)

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
