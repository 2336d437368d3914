"""``perdure quotas [--json]``: every model quota declared in the store, its limits, its
window now (tokens of settled calls, tokens reserved by calls in flight, requests) and
what 429s taught (the rate in force, how many, no call before when)."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from perdure.stores.base import QuotaStats

__all__ = ["quota_json", "quotas"]


def quota_json(stats: QuotaStats, now: float) -> dict[str, Any]:
    """One quota as ``perdure quotas --json`` prints it."""
    q, state = stats.quota, stats.state
    blocked = state.blocked_until if state.blocked_until and state.blocked_until > now else None
    return {"provider": q.provider, "model": q.model, **q.limits(), "used": stats.used,
            "reserved": stats.reserved, "requests": stats.requests,
            "factor": round(stats.factor, 4), "throttles": state.throttles,
            "throttled_at": state.throttled_at, "blocked_until": blocked}


def _limit(value: int | None) -> str:
    return "-" if value is None else str(value)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of quotas instead.")
@click.pass_obj
def quotas(obj: Any, as_json: bool) -> None:
    """List model quotas: limits, the window's usage and reservations, the adapted rate."""
    app = obj.app()
    now = time.time()
    found = app.store.quota_stats(now)
    if as_json:
        click.echo(json.dumps([quota_json(stats, now) for stats in found], indent=2))
        return
    # Piped output is not cut to a terminal's width.
    out = Console(highlight=False, soft_wrap=True,
                  width=None if sys.stdout.isatty() else 200)
    if not found:
        out.print("no model quotas declared in this store (app.model_quota declares one; "
                  "a worker puts it here)")
        return
    table = Table(box=None, pad_edge=False)
    for column in ("provider", "model", "tokens/min", "requests/min", "window", "used",
                   "reserved", "requests", "rate", "429s"):
        table.add_column(column, justify="left" if column in ("provider", "model")
                         else "right")
    for stats in found:
        q = stats.quota
        table.add_row(q.provider, q.model, _limit(q.tokens_per_minute),
                      _limit(q.requests_per_minute), f"{q.window:g}s", str(stats.used),
                      str(stats.reserved), str(stats.requests), f"{100 * stats.factor:.0f}%",
                      str(stats.state.throttles))
    out.print(table)
