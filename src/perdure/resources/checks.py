"""Staleness checks: when a resource's checkpoint no longer matches the world.

A check notes what it sees when the resource is declared (or recaptured) in the
descriptor's ``checks`` list, and on restore looks again: a difference makes the
resource ``Stale`` with a reason, and the resource's ``on_stale`` policy decides
(refresh, invalidate recorded steps, park, fail).

- ``GitHead(path)``: the git repository's HEAD commit moved;
- ``FileHash(path)``: a file's SHA-256 differs (or the file is gone);
- ``SchemaVersion(query)``: a query on a ``PostgresSession`` gives another value
  (``select max(version) from schema_migrations``, say);
- ``ExpiresAt(when)``: a credential's expiry time (seconds since the epoch) passed.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from perdure.errors import ResourceError
from perdure.resources._protocol import Fresh, Stale, Validity

__all__ = ["Check", "ExpiresAt", "FileHash", "GitHead", "SchemaVersion", "run_checks",
           "see_all", "see_checks"]


_UTC = "%Y-%m-%d %H:%M:%SZ"


class Check:
    """A staleness check: ``see(live)`` what the world says now; ``spec()`` the JSON
    that memory keeps to build the check again; ``explain(seen, now)`` the reason a
    difference makes it stale."""

    kind = ""

    def spec(self) -> dict[str, Any]:
        """What memory keeps to build this check again (without what it saw)."""
        raise NotImplementedError

    async def see(self, live: Any) -> Any:
        """What the world says now (a JSON value)."""
        raise NotImplementedError

    def explain(self, seen: Any, now: Any) -> str | None:
        """Why ``now`` differs from ``seen`` (``None``: it does not)."""
        return None if seen == now else f"{self.kind}: was {seen!r}, now {now!r}"


class GitHead(Check):
    """The HEAD commit of the git repository at ``path``."""

    kind = "git_head"

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)

    def spec(self) -> dict[str, Any]:
        return {"check": self.kind, "path": self.path}

    async def see(self, live: Any) -> Any:
        proc = await asyncio.create_subprocess_exec(
            "git", "-C", self.path, "rev-parse", "HEAD", stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL)
        out, _ = await proc.communicate()
        return out.decode().strip() if proc.returncode == 0 else None

    def explain(self, seen: Any, now: Any) -> str | None:
        if seen == now:
            return None
        return f"git HEAD of {self.path} moved from {str(seen)[:12]} to {str(now)[:12]}"


class FileHash(Check):
    """The SHA-256 of the file at ``path`` (``None`` when it is missing)."""

    kind = "file_hash"

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)

    def spec(self) -> dict[str, Any]:
        return {"check": self.kind, "path": self.path}

    async def see(self, live: Any) -> Any:
        try:
            return hashlib.sha256(Path(self.path).read_bytes()).hexdigest()
        except FileNotFoundError:
            return None

    def explain(self, seen: Any, now: Any) -> str | None:
        if seen == now:
            return None
        if now is None:
            return f"{self.path} is gone"
        return f"{self.path} changed (sha256 {str(seen)[:12]} -> {now[:12]})"


class SchemaVersion(Check):
    """The first column of ``query``'s first row, on a ``PostgresSession``'s connection."""

    kind = "schema_version"

    def __init__(self, query: str) -> None:
        self.query = query

    def spec(self) -> dict[str, Any]:
        return {"check": self.kind, "query": self.query}

    async def see(self, live: Any) -> Any:
        cur = await live.execute(self.query)
        row = await cur.fetchone()
        value = None if row is None else row[0]
        return value if isinstance(value, int | str | float | None) else str(value)

    def explain(self, seen: Any, now: Any) -> str | None:
        return None if seen == now else f"schema version changed from {seen!r} to {now!r}"


class ExpiresAt(Check):
    """A credential valid until ``when`` (seconds since the epoch)."""

    kind = "expires"

    def __init__(self, when: float) -> None:
        self.when = float(when)

    def spec(self) -> dict[str, Any]:
        return {"check": self.kind, "when": self.when}

    async def see(self, live: Any) -> Any:
        return self.when

    def explain(self, seen: Any, now: Any) -> str | None:
        if time.time() >= self.when:
            return f"credential expired at {time.strftime(_UTC, time.gmtime(self.when))}"
        return None


_KINDS: dict[str, Any] = {
    "git_head": lambda s: GitHead(s["path"]),
    "file_hash": lambda s: FileHash(s["path"]),
    "schema_version": lambda s: SchemaVersion(s["query"]),
    "expires": lambda s: ExpiresAt(s["when"]),
}


def _build(entry: Any) -> Check:
    if not isinstance(entry, dict) or entry.get("check") not in _KINDS:
        raise ResourceError(f"a resource's descriptor holds an unknown check: {entry!r}")
    try:
        check: Check = _KINDS[entry["check"]](entry)
    except (KeyError, TypeError, ValueError) as exc:
        raise ResourceError(f"a resource's check {entry!r} is malformed: {exc}") from None
    return check


async def see_all(checks: Sequence[Check], live: Any) -> list[dict[str, Any]]:
    """The ``checks`` entries of a descriptor: each check's spec and what it sees now."""
    return [{**check.spec(), "seen": await check.see(live)} for check in checks]


async def see_checks(descriptor: dict[str, Any], live: Any) -> dict[str, Any]:
    """``descriptor`` with each of its checks seen again (a refresh)."""
    entries = descriptor.get("checks")
    if not entries:
        return descriptor
    checks = [_build(entry) for entry in entries]
    return {**descriptor, "checks": await see_all(checks, live)}


async def run_checks(descriptor: dict[str, Any], live: Any) -> Validity:
    """``Stale`` with every reason any of the descriptor's checks gives, else ``Fresh``."""
    reasons = []
    for entry in descriptor.get("checks") or ():
        check = _build(entry)
        reason = check.explain(entry.get("seen"), await check.see(live))
        if reason is not None:
            reasons.append(reason)
    return Stale("; ".join(reasons)) if reasons else Fresh()
