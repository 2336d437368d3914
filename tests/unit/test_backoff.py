"""Semantic backoff: error classes, streaks, hints, limits, cap and deterministic jitter."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perdure.core.backoff import ErrorClass, Failure, RetryPolicy, classify, next_delay
from tests.unit.builders import PROFILE

T = ErrorClass.TRANSIENT
SALT = "obj-1/0/fetch"
WIDE = RetryPolicy(max_attempts=100, base=1.0, cap=10_000.0)


class RateLimitError(Exception):
    """Named like a client library's rate-limit error."""


class TooManyRequestsError(Exception):
    """Named like an HTTP 429 exception."""


class ReadTimeoutError(Exception):
    """Named like a client library's timeout, without subclassing TimeoutError."""


class HTTPError(Exception):
    """Carries a status code like an HTTP client's error."""

    def __init__(self, status: int, attr: str = "status_code") -> None:
        super().__init__(status)
        setattr(self, attr, status)


class TaggedError(Exception):
    """Says its own class."""

    error_class = ErrorClass.TRANSIENT


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (HTTPError(429), ErrorClass.RATE_LIMITED),
        (HTTPError(429, attr="status"), ErrorClass.RATE_LIMITED),
        (RateLimitError(), ErrorClass.RATE_LIMITED),
        (TooManyRequestsError(), ErrorClass.RATE_LIMITED),
        (TimeoutError(), ErrorClass.TIMEOUT),
        (ReadTimeoutError(), ErrorClass.TIMEOUT),
        (ConnectionResetError(), ErrorClass.TRANSIENT),
        (ConnectionRefusedError(), ErrorClass.TRANSIENT),
        (OSError("disk busy"), ErrorClass.TRANSIENT),
        (ValueError("bad input"), ErrorClass.PERMANENT),
        (TypeError(), ErrorClass.PERMANENT),
        (KeyError("k"), ErrorClass.PERMANENT),
        (ZeroDivisionError(), ErrorClass.PERMANENT),
        (NotImplementedError(), ErrorClass.PERMANENT),
        (RuntimeError("?"), ErrorClass.UNKNOWN),
        (HTTPError(500), ErrorClass.UNKNOWN),
        (Exception(), ErrorClass.UNKNOWN),
        (TaggedError(), ErrorClass.TRANSIENT),
    ],
)
def test_classify(exc: BaseException, expected: ErrorClass) -> None:
    """Each exception falls in the class its type, name, status or own tag says."""
    assert classify(exc) is expected


def test_explicit_tag_wins_over_type() -> None:
    """An ``error_class`` attribute overrides what the type alone would say."""
    exc = ValueError("retry me")
    exc.error_class = ErrorClass.RATE_LIMITED  # type: ignore[attr-defined]
    assert classify(exc) is ErrorClass.RATE_LIMITED


def fails(*classes: ErrorClass, latency: float = 0.0) -> list[Failure]:
    """Failed attempts 1..n of the given classes."""
    return [Failure(i + 1, c, latency) for i, c in enumerate(classes)]


def within(delay: float | None, expected: float) -> bool:
    """``delay`` lies within the ±20% jitter band around ``expected``."""
    return delay is not None and expected * 0.8 <= delay <= expected * 1.2


def test_no_failures_means_no_wait() -> None:
    """Before any failure the next attempt is due at once."""
    assert next_delay([], WIDE, salt=SALT) == 0.0


def test_streak_doubles_the_delay() -> None:
    """Consecutive failures of one class double the delay each time."""
    for streak in range(1, 6):
        assert within(next_delay(fails(*[T] * streak), WIDE, salt=SALT), 2 ** (streak - 1))


@pytest.mark.parametrize(
    ("error_class", "scale"),
    [(ErrorClass.TRANSIENT, 1.0), (ErrorClass.UNKNOWN, 1.0), (ErrorClass.TIMEOUT, 2.0),
     (ErrorClass.RATE_LIMITED, 5.0)],
)
def test_classes_scale_the_base(error_class: ErrorClass, scale: float) -> None:
    """Timeouts wait twice and rate limits five times as long as transient errors."""
    policy = RetryPolicy(max_attempts=10, base=3.0)
    assert within(next_delay(fails(error_class), policy, salt=SALT), 3.0 * scale)


def test_class_change_resets_the_streak() -> None:
    """A failure of a new class starts its own streak from one."""
    failures = fails(T, T, T, ErrorClass.TIMEOUT)
    assert within(next_delay(failures, WIDE, salt=SALT), 2.0)  # not 2 * 2**3
    back = fails(ErrorClass.TIMEOUT, ErrorClass.TIMEOUT, T)
    assert within(next_delay(back, WIDE, salt=SALT), 1.0)
    mixed = fails(T, T, ErrorClass.UNKNOWN, T)
    assert within(next_delay(mixed, WIDE, salt=SALT), 1.0)


def test_timeout_waits_at_least_as_long_as_the_attempt_took() -> None:
    """A slow target gets at least the failed attempt's latency to recover."""
    delay = next_delay(fails(ErrorClass.TIMEOUT, latency=40.0), WIDE, salt=SALT)
    assert within(delay, 40.0)
    fast = next_delay(fails(T, latency=40.0), WIDE, salt=SALT)
    assert within(fast, 1.0)  # latency only matters for timeouts


def test_retry_after_hint_is_used_exactly() -> None:
    """An explicit retry-after hint is taken as is, with no jitter, and capped."""
    hinted = [Failure(1, ErrorClass.RATE_LIMITED, 0.0, retry_after=7.5)]
    assert next_delay(hinted, WIDE, salt=SALT) == 7.5
    assert next_delay(hinted, RetryPolicy(max_attempts=5, cap=2.0), salt=SALT) == 2.0
    negative = [Failure(1, T, 0.0, retry_after=-3.0)]
    assert next_delay(negative, WIDE, salt=SALT) == 0.0


def test_permanent_gives_up() -> None:
    """A permanent error is not retried unless the policy says so."""
    assert next_delay(fails(ErrorClass.PERMANENT), WIDE, salt=SALT) is None
    eager = RetryPolicy(max_attempts=5, retry_permanent=True)
    assert within(next_delay(fails(ErrorClass.PERMANENT), eager, salt=SALT), 1.0)


def test_max_attempts_gives_up() -> None:
    """After max_attempts failed attempts there is no next attempt."""
    policy = RetryPolicy(max_attempts=3)
    assert next_delay(fails(T, T), policy, salt=SALT) is not None
    assert next_delay(fails(T, T, T), policy, salt=SALT) is None
    assert next_delay(fails(T), RetryPolicy(max_attempts=1), salt=SALT) is None


def test_cap_bounds_every_delay() -> None:
    """No single delay exceeds the cap, however long the streak or latency."""
    policy = RetryPolicy(max_attempts=100, base=1.0, cap=5.0)
    assert next_delay(fails(*[T] * 30), policy, salt=SALT) == 5.0
    assert next_delay(fails(ErrorClass.TIMEOUT, latency=1e6), policy, salt=SALT) == 5.0


def test_jitter_is_deterministic_per_salt() -> None:
    """The same step and history always get the same delay; other steps spread out."""
    failures = fails(T, T)
    same = {next_delay(failures, WIDE, salt=SALT) for _ in range(5)}
    assert len(same) == 1
    spread = {next_delay(failures, WIDE, salt=f"obj-{i}/0/fetch") for i in range(20)}
    assert len(spread) > 10


def test_policy_validation() -> None:
    """Policies with no attempts or negative times are refused."""
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError, match="negative"):
        RetryPolicy(base=-1.0)
    with pytest.raises(ValueError, match="negative"):
        RetryPolicy(cap=-1.0)


classes = st.sampled_from([c for c in ErrorClass if c is not ErrorClass.PERMANENT])


@PROFILE
@given(
    history=st.lists(classes, min_size=1, max_size=8),
    salt=st.text(max_size=20),
    base=st.floats(0.01, 100.0),
)
def test_jitter_stays_within_twenty_percent(
    history: list[ErrorClass], salt: str, base: float
) -> None:
    """For any history and salt the delay is within ±20% of the unjittered value."""
    policy = RetryPolicy(max_attempts=100, base=base, cap=1e12)
    failures = fails(*history)
    last = history[-1]
    streak = 0
    for c in reversed(history):
        if c is not last:
            break
        streak += 1
    scale = {ErrorClass.TIMEOUT: 2.0, ErrorClass.RATE_LIMITED: 5.0}.get(last, 1.0)
    expected = base * scale * 2 ** (streak - 1)
    delay = next_delay(failures, policy, salt=salt)
    assert within(delay, expected)
    assert delay == next_delay(failures, policy, salt=salt)
