"""What the SQL stores share about queues: rows to ``Queue`` values and back, a queue's
load from its ``queue_held`` rows, and how many candidates a claim reads."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from perdure.core.flow import Candidate, Queue, QueueLoad
from perdure.stores.base import QueueStats

__all__ = ["candidates", "load_of", "queue_params", "queue_row", "scan_size", "stats_row"]


def queue_row(row: Sequence[Any]) -> Queue:
    """A ``Queue`` from ``name, concurrency, per_key, worker_concurrency, rate_limit,
    rate_period, priority``."""
    name, concurrency, per_key, worker, rate_limit, rate_period, priority = row[:7]
    return Queue(str(name), concurrency=concurrency, per_key=per_key,
                 worker_concurrency=worker, rate_limit=rate_limit,
                 rate_period=None if rate_period is None else float(rate_period),
                 priority=bool(priority))


def queue_params(queue: Queue, now: float) -> dict[str, Any]:
    """The ``declare_queue`` parameters."""
    return {"name": queue.name, "concurrency": queue.concurrency, "per_key": queue.per_key,
            "worker_concurrency": queue.worker_concurrency, "rate_limit": queue.rate_limit,
            "rate_period": queue.rate_period, "priority": queue.priority, "now": now}


def stats_row(row: Sequence[Any]) -> QueueStats:
    """A ``QueueStats`` from a ``queue_stats`` row."""
    return QueueStats(queue_row(row), int(row[7]), int(row[8]), int(row[9]), int(row[10]))


def load_of(held: Iterable[Sequence[Any]], started: int) -> QueueLoad:
    """A queue's load from its ``queue_held`` rows ``(key, held, held by the claimer)``."""
    total = mine = 0
    by_key: dict[str, int] = {}
    for key, count, own in held:
        total += int(count)
        mine += int(own or 0)
        if key is not None:
            by_key[key] = int(count)
    return QueueLoad(total, mine, by_key, started)


def candidates(rows: Iterable[Sequence[Any]]) -> list[Candidate]:
    """``queue_candidates`` rows as ``Candidate`` values."""
    return [Candidate(row[0], row[1], bool(row[2]), bool(row[3])) for row in rows]


def scan_size(limit: int) -> int:
    """How many candidates one claim of up to ``limit`` objects reads of a queue: keys at
    their cap are left out by the query, so a few per slot leave room for the rest."""
    return 4 * limit + 32
