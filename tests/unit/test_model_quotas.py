"""The rules of model quotas (``perdure.core.quotas``): bad declarations, the sliding
window's answer, and the adaptation to 429s."""

from __future__ import annotations

from typing import Any

import pytest

from perdure.core.quotas import (
    MIN_FACTOR,
    ModelQuota,
    QuotaState,
    Reservation,
    admit,
    factor_at,
    throttled,
)
from perdure.errors import ConfigurationError


@pytest.mark.parametrize("kwargs", [
    {"tokens_per_minute": 0}, {"tokens_per_minute": -5}, {"requests_per_minute": 0},
    {"tokens_per_minute": 1.5}, {"tokens_per_minute": "1000"}, {"tokens_per_minute": True},
    {}, {"tokens_per_minute": 10, "window": 0}, {"tokens_per_minute": 10, "window": -1},
    {"tokens_per_minute": 10, "window": float("nan")}, {"tokens_per_minute": 2**63},
])
def test_bad_limits_are_configuration_errors(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        ModelQuota("openai", "gpt-4o", **kwargs)


@pytest.mark.parametrize("provider, model", [("", "m"), ("openai", ""), (None, "m"),
                                             ("openai", 5)])
def test_bad_names_are_configuration_errors(provider: Any, model: Any) -> None:
    with pytest.raises(ConfigurationError):
        ModelQuota(provider, model, tokens_per_minute=10)


def test_per_window_scales_the_minute() -> None:
    quota = ModelQuota("openai", "m", tokens_per_minute=60_000, requests_per_minute=60,
                       window=6)
    assert quota.per_window() == (6000, 6)
    assert quota.per_window(0.5) == (3000, 3)
    assert ModelQuota("openai", "m", requests_per_minute=1, window=1).per_window() == (None, 1)


def test_admit_waits_for_the_oldest_to_leave() -> None:
    quota = ModelQuota("openai", "m", tokens_per_minute=600, window=60)  # 600 per window
    window = [Reservation(0.0, 200), Reservation(10.0, 300), Reservation(20.0, 50)]
    assert admit(quota, QuotaState(), window, 50, 30.0) is None
    assert admit(quota, QuotaState(), window, 51, 30.0) == 60.0    # when the 200 leaves
    assert admit(quota, QuotaState(), window, 450, 30.0) == 70.0   # and the 300
    assert admit(quota, QuotaState(), window, 450, 65.0) == 70.0   # the 200 left already
    assert admit(quota, QuotaState(), window, 250, 65.0) is None
    # A call larger than the whole window fits an empty one.
    assert admit(quota, QuotaState(), window, 5000, 30.0) == 80.0
    assert admit(quota, QuotaState(), [], 5000, 30.0) is None


def test_throttle_halves_recovers_additively_and_blocks() -> None:
    quota = ModelQuota("openai", "m", tokens_per_minute=600, window=10)
    state = throttled(quota, QuotaState(), 100.0, 2.5)
    assert (state.factor, state.blocked_until, state.throttles) == (0.5, 102.5, 1)
    assert admit(quota, state, [], 1, 101.0) == 102.5
    assert factor_at(quota, state, 100.0) == 0.5
    assert factor_at(quota, state, 120.0) == pytest.approx(0.7)
    assert factor_at(quota, state, 200.0) == 1.0
    again = throttled(quota, state, 110.0, None)
    assert again.factor == pytest.approx(0.3) and again.blocked_until == 102.5
    low = QuotaState()
    for _ in range(20):
        low = throttled(quota, low, 0.0, None)
    assert low.factor == MIN_FACTOR
