"""The store contract of model quotas (``ModelQuotas`` role): reservations against a
sliding window shared by every store opened on the same place, settled to what the
provider reported, adapted on 429s; many threads on many stores reserving at once never
pass a quota. Times are logical (the caller's ``now``)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from perdure.core.quotas import ModelQuota
from perdure.stores import Store

NOW = 1_000_000.0
QUOTA = ModelQuota("openai", "gpt-4o-mini", tokens_per_minute=6000, requests_per_minute=600,
                   window=10.0)  # 1000 tokens and 100 requests within any 10 s


def test_declare_keeps_limits_and_reports_a_change(store: Store) -> None:
    """A declaration is kept and listed; the same again reports nothing, other limits
    report those replaced; 429 adaptation survives a redeclaration."""
    assert store.declare_model_quota(QUOTA, NOW) is None
    assert store.declare_model_quota(QUOTA, NOW) is None
    assert store.model_quotas() == [QUOTA]
    store.quota_throttled("openai", "gpt-4o-mini", 2.0, NOW)
    bigger = ModelQuota("openai", "gpt-4o-mini", tokens_per_minute=12000)
    assert store.declare_model_quota(bigger, NOW) == QUOTA
    assert store.model_quotas() == [bigger]
    (stats,) = store.quota_stats(NOW)
    assert stats.state.throttles == 1 and stats.factor == 0.5


def test_no_quota_grants_without_a_ticket(store: Store) -> None:
    """A model nobody declared a quota for is granted, with nothing to settle."""
    grant = store.reserve_quota("openai", "other", 10**9, "obj", "o/1", NOW)
    assert grant.granted and grant.ticket is None


def test_reserve_settle_and_the_window(store: Store) -> None:
    """Reservations fill the window; one that does not fit is told when it will; settling
    to fewer tokens returns the rest at once; reservations leave the window after it."""
    store.declare_model_quota(QUOTA, NOW)
    first = store.reserve_quota("openai", "gpt-4o-mini", 600, "obj", "a/1", NOW)
    assert first.granted and first.ticket is not None
    second = store.reserve_quota("openai", "gpt-4o-mini", 500, "obj", "b/1", NOW + 1)
    assert not second.granted and second.ready_at == pytest.approx(NOW + 10)
    (stats,) = store.quota_stats(NOW + 1)
    assert (stats.used, stats.reserved, stats.requests) == (0, 600, 1)
    store.settle_quota(first.ticket, 350, NOW + 2)  # the provider reported 350
    (stats,) = store.quota_stats(NOW + 2)
    assert (stats.used, stats.reserved) == (350, 0)
    again = store.reserve_quota("openai", "gpt-4o-mini", 500, "obj", "b/1", NOW + 2)
    assert again.granted
    # A settled call counts from when its reply came: it leaves at NOW + 12.
    late = store.reserve_quota("openai", "gpt-4o-mini", 400, "obj", "c/1", NOW + 11)
    assert not late.granted and late.ready_at == pytest.approx(NOW + 12)
    # A reservation never settled (its worker died) leaves with its window all the same.
    assert store.reserve_quota("openai", "gpt-4o-mini", 400, "obj", "c/1", NOW + 12.01).granted
    (stats,) = store.quota_stats(NOW + 30)
    assert (stats.used, stats.reserved, stats.requests) == (0, 0, 0)


def test_requests_per_minute(store: Store) -> None:
    """A request limit counts calls, whatever their tokens."""
    store.declare_model_quota(ModelQuota("anthropic", "claude", requests_per_minute=12,
                                         window=10.0), NOW)  # 2 within any 10 s
    assert store.reserve_quota("anthropic", "claude", 1, "obj", "a", NOW).granted
    assert store.reserve_quota("anthropic", "claude", 1, "obj", "b", NOW + 1).granted
    third = store.reserve_quota("anthropic", "claude", 1, "obj", "c", NOW + 2)
    assert not third.granted and third.ready_at == pytest.approx(NOW + 10)


def test_a_429_halves_the_rate_blocks_until_retry_after_and_recovers(store: Store) -> None:
    """After a 429 nothing is granted before its retry-after; then the window admits half
    the declared tokens, growing back by a tenth per window."""
    store.declare_model_quota(QUOTA, NOW)
    state = store.quota_throttled("openai", "gpt-4o-mini", 3.0, NOW)
    assert state is not None and state.factor == 0.5 and state.blocked_until == NOW + 3
    blocked = store.reserve_quota("openai", "gpt-4o-mini", 10, "obj", "a", NOW + 1)
    assert not blocked.granted and blocked.ready_at == pytest.approx(NOW + 3)
    assert store.reserve_quota("openai", "gpt-4o-mini", 530, "obj", "a", NOW + 3).granted
    assert not store.reserve_quota("openai", "gpt-4o-mini", 1, "obj", "b", NOW + 3).granted
    (stats,) = store.quota_stats(NOW + 3)
    assert stats.factor == pytest.approx(0.53) and stats.state.throttles == 1
    assert store.quota_throttled("openai", "nobody", None, NOW) is None


def test_reservations_from_many_stores_at_once_never_pass_the_quota(
        store: Store, open_again: Callable[[], Store]) -> None:
    """Eight threads on four stores reserve 100 tokens each as fast as they can, all at
    one moment: exactly the quota's 1000 tokens are granted."""
    store.declare_model_quota(QUOTA, NOW)
    stores = [store] + [open_again() for _ in range(3)]
    granted: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(8)

    def reserve(s: Store) -> None:
        start.wait()
        for _ in range(5):
            if s.reserve_quota("openai", "gpt-4o-mini", 100, "obj", "x", NOW).granted:
                with lock:
                    granted.append(100)

    threads = [threading.Thread(target=reserve, args=(stores[i % 4],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(granted) == 1000
