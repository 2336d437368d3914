"""Resources: the live things an agent holds, with restore recipes.

``await run.resource(name, recipe)`` opens a live thing, records its *descriptor* (never
a handle) and hands the live thing back. On every reentry, on any node, before the
agent's code continues, every resource still held is restored from its latest
descriptor and validated, all or nothing, and a restore report goes to memory
(``perdure show`` prints it). See docs/howto/resources.md and
docs/concepts/execution-state.md.

Built in: ``WorkingDirectory``, ``Environment``, ``Subprocess`` (a dev server, with a
readiness probe), ``OpenFile`` (with its position), ``PostgresSession`` (with session
settings and role), ``HttpSession`` (with auth headers). Your own: subclass
``Resource``. Staleness checks are in ``perdure.resources.checks``.
"""

from __future__ import annotations

from perdure.errors import (
    CannotRestoreError,
    DescriptorVersionError,
    ResourceError,
    ResourceStaleError,
)
from perdure.resources._protocol import Fresh, Invalidate, Resource, Stale, Validity
from perdure.resources.checks import Check, ExpiresAt, FileHash, GitHead, SchemaVersion
from perdure.resources.local import (
    Environment,
    OpenFile,
    Process,
    Subprocess,
    WorkingDirectory,
    revealed,
)
from perdure.resources.remote import HttpSession, PostgresSession

__all__ = [
    "CannotRestoreError",
    "Check",
    "DescriptorVersionError",
    "Environment",
    "ExpiresAt",
    "FileHash",
    "Fresh",
    "GitHead",
    "HttpSession",
    "Invalidate",
    "OpenFile",
    "PostgresSession",
    "Process",
    "Resource",
    "ResourceError",
    "ResourceStaleError",
    "SchemaVersion",
    "Stale",
    "Subprocess",
    "Validity",
    "WorkingDirectory",
    "revealed",
]
