"""Execution-state records in words, for ``perdure show`` (``perdure.describe``).

Descriptors are never printed: they hold paths, URLs with credentials and secret
environment values. A resource is named with its recipe and descriptor version; a
restore report lists each resource's outcome, its time and, when stale or failed, why.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from perdure.core.bodies import Body, Invalidated, ResourceHeld, RestoreReport, StepCheckpoint
from perdure.stores.base import CheckpointRow

__all__ = ["MASK", "RESOURCE_LINES", "shown_body", "slot_lines"]

MASK = "***"
_RESOURCE = "resource"


def _masked_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:{MASK}@{host}"))


def _masked(descriptor: Mapping[str, Any]) -> dict[str, Any]:
    secret = {str(name).lower() for name in descriptor.get("secret") or ()}
    shown = dict(descriptor)
    for key in ("vars", "headers"):
        values = descriptor.get(key)
        if isinstance(values, dict):
            shown[key] = {k: MASK if str(k).lower() in secret else v for k, v in values.items()}
    for key, value in descriptor.items():
        if str(key).endswith("url") and isinstance(value, str):
            shown[key] = _masked_url(value)
    return shown


def shown_body(kind: str, body: Mapping[str, Any]) -> Mapping[str, Any]:
    """``body`` as output may show it (``--json``): a resource descriptor's secret
    values (named in its ``secret`` list) and a URL's password masked; other bodies
    as they are."""
    if kind != _RESOURCE or not isinstance(body.get("descriptor"), dict):
        return body
    return {**body, "descriptor": _masked(body["descriptor"])}


def _recipe(type_name: str) -> str:
    return type_name.rpartition(":")[2] or type_name


def _held(body: ResourceHeld) -> tuple[str, bool]:
    what = f"resource {body.name} ({_recipe(body.type)}, descriptor v{body.version})"
    if body.pos is not None:
        return f"#{body.pos} {what} held", True
    if body.state == "closed":
        return f"{what} released", True
    return f"{what}: descriptor updated", True


def _report(body: RestoreReport) -> tuple[str, bool]:
    parts = []
    for entry in body.resources:
        took = float(entry.get("seconds") or 0) * 1000
        text = f"{entry.get('name')} {entry.get('status')} {took:.1f}ms"
        if entry.get("rolled_back"):
            text += " (closed again)"
        if entry.get("reason"):
            text += f" ({entry['reason']})"
        parts.append(text)
    retry = " ; retry later" if body.retry_at is not None else ""
    return (f"restore {body.outcome} on {body.node} in {body.seconds * 1000:.1f}ms: "
            f"{'; '.join(parts)}{retry}"), True


def _checkpoint(body: StepCheckpoint) -> tuple[str, bool]:
    cursor = json.dumps(body.cursor, ensure_ascii=False, sort_keys=True)
    cut = cursor if len(cursor) <= 80 else cursor[:79] + "…"
    return f"#{body.pos} {body.name} attempt {body.attempt}: checkpoint {body.count}: {cut}", True


def _invalidated(body: Invalidated) -> tuple[str, bool]:
    return (f"commands from #{body.from_pos} ({body.step}) run again: resource "
            f"{body.resource} is stale: {body.reason}"), True


RESOURCE_LINES: Mapping[type[Body], Callable[[Any], tuple[str, bool]]] = {
    ResourceHeld: _held,
    RestoreReport: _report,
    StepCheckpoint: _checkpoint,
    Invalidated: _invalidated,
}
"""Each execution-state body class and how it reads: (text, shown whole)."""


def slot_lines(rows: Sequence[CheckpointRow]) -> list[str]:
    """The object's checkpoint slots (latest descriptors, progress markers kept outside
    the chain) in words: slot, the record it follows, who wrote it and when; never the
    value (a descriptor may hold secrets; it is verified and used at the next claim)."""
    from datetime import UTC, datetime

    lines = []
    for row in rows:
        when = datetime.fromtimestamp(row.written_at, UTC).strftime("%Y-%m-%d %H:%M:%S")
        lines.append(f"  {row.slot}: latest value after #{row.after_seq}, written by "
                     f"{row.signer} at {when} UTC ({len(row.body)} bytes)")
    return lines
