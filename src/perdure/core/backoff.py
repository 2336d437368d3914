"""Semantic retry backoff: the next attempt time comes from what the failures were.

Instead of one fixed timer, the delay before the next attempt is derived from
the recorded outcomes of the step: the class of error (permanent, rate
limited, timeout, transient, unknown), how many failures of that class came
in a row, how long the failed attempts took, and any explicit retry-after
hint the error carried. Jitter is derived from the step identity, so the
result is a pure function of memory and replays identically.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["ErrorClass", "Failure", "RetryPolicy", "classify", "next_delay"]


class ErrorClass(StrEnum):
    """How a failure bears on retrying."""

    PERMANENT = "permanent"  # retrying cannot help (bad input, a bug)
    RATE_LIMITED = "rate_limited"  # the target asks us to slow down
    TIMEOUT = "timeout"  # the target was too slow
    TRANSIENT = "transient"  # connection reset, temporary I/O trouble
    UNKNOWN = "unknown"  # anything else: retried with the base pace


_PERMANENT_TYPES: tuple[type[BaseException], ...] = (
    TypeError,
    ValueError,
    LookupError,
    AttributeError,
    NameError,
    AssertionError,
    NotImplementedError,
    ArithmeticError,
)


def classify(exc: BaseException) -> ErrorClass:
    """Classify an exception by type, name and well-known attributes."""
    explicit = getattr(exc, "error_class", None)
    if isinstance(explicit, ErrorClass):
        return explicit
    name = type(exc).__name__.lower()
    status = getattr(exc, "status_code", None) or getattr(exc, "status", None)
    if status == 429 or "ratelimit" in name or "toomanyrequests" in name:
        return ErrorClass.RATE_LIMITED
    if isinstance(exc, TimeoutError) or "timeout" in name:
        return ErrorClass.TIMEOUT
    if isinstance(exc, ConnectionError | OSError):
        return ErrorClass.TRANSIENT
    if isinstance(exc, _PERMANENT_TYPES):
        return ErrorClass.PERMANENT
    return ErrorClass.UNKNOWN


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How many attempts a step gets and the pace between them.

    ``base`` is the first delay in seconds for a transient error; other classes
    scale it. ``cap`` bounds any single delay. ``retry_permanent`` retries even
    errors classified as permanent.
    """

    max_attempts: int = 3
    base: float = 1.0
    cap: float = 600.0
    retry_permanent: bool = False

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.base < 0 or self.cap < 0:
            raise ValueError("base and cap must not be negative")


@dataclass(frozen=True, slots=True)
class Failure:
    """One recorded failed attempt of a step."""

    attempt: int
    error_class: ErrorClass
    latency: float  # seconds the attempt ran before failing
    retry_after: float | None = None  # explicit hint from the error


_SCALE = {
    ErrorClass.TRANSIENT: 1.0,
    ErrorClass.UNKNOWN: 1.0,
    ErrorClass.TIMEOUT: 2.0,
    ErrorClass.RATE_LIMITED: 5.0,
    ErrorClass.PERMANENT: 1.0,
}


def _jitter(salt: str, attempt: int) -> float:
    """A factor in [0.8, 1.2) fixed by the step identity and attempt."""
    digest = hashlib.sha256(f"{salt}#{attempt}".encode()).digest()
    return 0.8 + 0.4 * (int.from_bytes(digest[:4], "big") / 2**32)


def next_delay(failures: Sequence[Failure], policy: RetryPolicy, *, salt: str) -> float | None:
    """Seconds to wait before the next attempt, or ``None`` when the step should give up.

    ``failures`` are the step's failed attempts in order; ``salt`` names the step
    (for deterministic jitter).
    """
    if not failures:
        return 0.0
    last = failures[-1]
    if len(failures) >= policy.max_attempts:
        return None
    if last.error_class is ErrorClass.PERMANENT and not policy.retry_permanent:
        return None
    if last.retry_after is not None:
        return max(0.0, min(last.retry_after, policy.cap))
    streak = 0
    for failure in reversed(failures):
        if failure.error_class is not last.error_class:
            break
        streak += 1
    delay = policy.base * _SCALE[last.error_class] * 2 ** (streak - 1)
    if last.error_class is ErrorClass.TIMEOUT:
        # A slow target gets at least as long to recover as the attempt took.
        delay = max(delay, last.latency)
    return float(min(delay * _jitter(salt, last.attempt), policy.cap))
