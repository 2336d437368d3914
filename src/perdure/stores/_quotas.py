"""What the SQL stores share about model quotas (``perdure.core.quotas``): rows to
values, and each operation of the ``ModelQuotas`` role as statements on a connection
the caller opened (a write transaction; on PostgreSQL the row query locks the quota's
row). ``conn`` is a ``sqlite3`` or ``psycopg`` connection: both take
``conn.execute(sql, params)`` and return a cursor."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from perdure.core.quotas import ModelQuota, QuotaState, Reservation, admit, factor_at, throttled
from perdure.stores.base import QuotaGrant, QuotaStats

__all__ = ["declare_in", "quota_of", "reserve_in", "stats_in", "throttled_in"]


def quota_of(row: Sequence[Any]) -> tuple[ModelQuota, QuotaState]:
    """A quota and its state from ``provider, model, tokens_per_minute,
    requests_per_minute, window_seconds, factor, adapted_at, blocked_until, throttles,
    throttled_at``."""
    provider, model, tpm, rpm, window, factor, adapted, blocked, throttles, at = row[:10]
    quota = ModelQuota(str(provider), str(model),
                       None if tpm is None else int(tpm), None if rpm is None else int(rpm),
                       float(window))
    state = QuotaState(float(factor), None if adapted is None else float(adapted),
                       None if blocked is None else float(blocked), int(throttles),
                       None if at is None else float(at))
    return quota, state


def _key(provider: str, model: str) -> dict[str, Any]:
    return {"provider": provider, "model": model}


def declare_in(conn: Any, q: Mapping[str, Any], row_query: str, quota: ModelQuota,
               now: float) -> ModelQuota | None:
    """Keep ``quota``'s limits; those it replaced, if they differed."""
    row = conn.execute(q[row_query], _key(*quota.key)).fetchone()
    conn.execute(q["declare_model_quota"], {**_key(*quota.key), **quota.limits(), "now": now})
    before = None if row is None else quota_of(row)[0]
    return None if before is None or before.same_limits(quota) else before


def _window(conn: Any, q: Mapping[str, Any], quota: ModelQuota, now: float
            ) -> list[tuple[float, int, bool]]:
    # A call still in flight past the window counts as made now: it leaves no sooner.
    since = now - quota.window
    return [(float(at) if float(at) > since else now, int(tokens), bool(settled))
            for at, tokens, settled in conn.execute(
                q["quota_window"], {**_key(*quota.key), "since": since, "now": now})]


def reserve_in(conn: Any, q: Mapping[str, Any], row_query: str, provider: str, model: str,
               tokens: int, object_id: str, holder: str, now: float) -> QuotaGrant:
    """Reserve ``tokens`` and a request if they fit the quota's window (see the role)."""
    row = conn.execute(q[row_query], _key(provider, model)).fetchone()
    if row is None:
        return QuotaGrant(True)
    quota, state = quota_of(row)
    conn.execute(q["quota_prune"], {**_key(provider, model), "since": now - quota.window,
                                    "now": now})
    window = [Reservation(at, n) for at, n, _ in _window(conn, q, quota, now)]
    ready = admit(quota, state, window, tokens, now)
    if ready is not None:
        return QuotaGrant(False, None, ready)
    params = {**_key(provider, model), "holder": holder, "object_id": object_id,
              "tokens": tokens, "now": now}
    ticket = conn.execute(q["quota_reserve"], params).fetchone()[0]
    return QuotaGrant(True, int(ticket))


def throttled_in(conn: Any, q: Mapping[str, Any], row_query: str, provider: str, model: str,
                 retry_after: float | None, now: float) -> QuotaState | None:
    """Adapt the quota after a 429; its new state (``None``: no quota declared)."""
    row = conn.execute(q[row_query], _key(provider, model)).fetchone()
    if row is None:
        return None
    quota, state = quota_of(row)
    new = throttled(quota, state, now, retry_after)
    conn.execute(q["quota_adapt"], {**_key(provider, model), "factor": new.factor,
                                    "adapted_at": new.adapted_at,
                                    "blocked_until": new.blocked_until,
                                    "throttles": new.throttles,
                                    "throttled_at": new.throttled_at})
    return new


def stats_in(conn: Any, q: Mapping[str, Any], now: float) -> list[QuotaStats]:
    """Every declared quota and its window at ``now``."""
    found = []
    for row in list(conn.execute(q["model_quotas"])):
        quota, state = quota_of(row)
        window = _window(conn, q, quota, now)
        used = sum(n for _, n, settled in window if settled)
        reserved = sum(n for _, n, settled in window if not settled)
        found.append(QuotaStats(quota, state, used, reserved, len(window),
                                factor_at(quota, state, now)))
    return found
