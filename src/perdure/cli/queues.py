"""``perdure queues [--json]``: every queue declared in the store, its limits, the slots
it holds now (objects under a live lease), its objects ready for a slot, and its dormant
ones (which hold none)."""

from __future__ import annotations

import json
import time
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from perdure.stores.base import QueueStats

__all__ = ["queue_json", "queues"]


def queue_json(stats: QueueStats) -> dict[str, Any]:
    """One queue as ``perdure queues --json`` prints it."""
    return {"name": stats.queue.name, **stats.queue.limits(), "held": stats.held,
            "ready": stats.ready, "waiting": stats.waiting, "started": stats.started}


def _limit(value: int | None) -> str:
    return "-" if value is None else str(value)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of queues instead.")
@click.pass_obj
def queues(obj: Any, as_json: bool) -> None:
    """List queues: limits (concurrency, per key, per worker, starts per period,
    priorities), slots held now, objects ready for a slot, dormant objects."""
    app = obj.app()
    found = app.store.queue_stats(time.time())
    if as_json:
        click.echo(json.dumps([queue_json(stats) for stats in found], indent=2))
        return
    out = Console(highlight=False, soft_wrap=True)
    if not found:
        out.print("no queues declared in this store (app.queue declares one; a worker or "
                  "a start on it puts it here)")
        return
    table = Table(box=None, pad_edge=False)
    for column in ("queue", "concurrency", "per key", "per worker", "limiter", "priority",
                   "held", "ready", "waiting"):
        table.add_column(column, justify="left" if column == "queue" else "right")
    for stats in found:
        q = stats.queue
        limiter = ("-" if q.rate_limit is None
                   else f"{q.rate_limit}/{q.rate_period:g}s ({stats.started} now)")
        table.add_row(q.name, _limit(q.concurrency), _limit(q.per_key),
                      _limit(q.worker_concurrency), limiter, "yes" if q.priority else "no",
                      str(stats.held), str(stats.ready), str(stats.waiting))
    out.print(table)
