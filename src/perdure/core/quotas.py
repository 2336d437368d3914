"""Model quotas: tokens and requests per minute per provider and model, shared by every
node through the store. Pure rules, no I/O.

A provider limits what one account may ask of a model per minute: tokens (TPM) and
requests (RPM). A ``ModelQuota`` says so to perdure, and every node that calls that
provider's model reserves against it through the store before a call:

- **reserve** before a call: the request's tokens (its prompt, counted offline, plus the
  most it may write: ``max_tokens``, or 4096 when it sets none) and one request, against
  the usage of the last ``window`` seconds (a sliding window; 60 s by default, as the
  providers count). A reservation that does not fit is refused with the time at which
  it will (``admit`` returns it): the object goes dormant until then, no process waits.
- **settle** after the call to the tokens the provider reported (input plus output), so
  what the estimate held beyond them returns to the window at once. A settled
  reservation counts from the moment its reply came, so the window never frees a call's
  tokens before the provider does.
- A reservation whose worker died before settling it keeps its estimate until it leaves
  the window: nothing is counted down, so nothing leaks.
- **adapt** on a 429: the provider says the quota is smaller than declared (another
  client on the same account, a lower tier). The effective rate is halved
  (multiplicative decrease, down to ``MIN_FACTOR`` of the declared one) and grows back
  by ``RECOVERY`` of it per window (additive increase); no reservation is granted
  before the provider's ``retry-after``.

The store serialises reservations of one quota (PostgreSQL: the quota's row locked;
SQLite: the write lock) and asks ``admit`` whether the new one fits.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from perdure.errors import ConfigurationError

__all__ = [
    "MIN_FACTOR",
    "RECOVERY",
    "ModelQuota",
    "QuotaState",
    "Reservation",
    "admit",
    "factor_at",
    "throttled",
]

MIN_FACTOR = 0.05
"""The lowest share of a quota's declared rate that 429s can adapt it down to."""

RECOVERY = 0.1
"""How much of the declared rate an adapted quota gets back per window without a 429."""

_MAX = 2**62


def _rate(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(f"{what} is a whole number of at least 1 (or None: no "
                                 f"limit), not {value!r}")
    if not 1 <= value <= _MAX:
        raise ConfigurationError(f"{what} must be from 1 to {_MAX} (or None: no limit), "
                                 f"not {value}")
    return value


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > 200:
        raise ConfigurationError(f"a quota's {what} is a non-empty string (at most 200 "
                                 f"characters), not {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class ModelQuota:
    """What a provider lets one account ask of a model: ``tokens_per_minute`` (input plus
    output tokens) and/or ``requests_per_minute``, counted over a sliding ``window`` of
    seconds (60 by default; the limits are per minute whatever the window, so a window
    of 6 s admits a tenth of them within any 6 s).

    ``provider`` is the client's API family (``"openai"`` for the Chat Completions and
    Responses clients, ``"anthropic"``); ``model`` the model the request names. A limit
    that makes no sense (zero, negative, not a whole number), or a quota with neither, is
    a ``ConfigurationError`` here.
    """

    provider: str
    model: str
    tokens_per_minute: int | None = None
    requests_per_minute: int | None = None
    window: float = 60.0

    def __post_init__(self) -> None:
        _text(self.provider, "provider")
        _text(self.model, "model")
        _rate(self.tokens_per_minute, "tokens_per_minute")
        _rate(self.requests_per_minute, "requests_per_minute")
        if self.tokens_per_minute is None and self.requests_per_minute is None:
            raise ConfigurationError("a model quota needs tokens_per_minute and/or "
                                     "requests_per_minute")
        window = self.window
        if (isinstance(window, bool) or not isinstance(window, int | float)
                or not math.isfinite(window) or not 0.1 <= window <= 3600):
            raise ConfigurationError(f"a quota's window is a number of seconds from 0.1 to "
                                     f"3600, not {window!r}")
        object.__setattr__(self, "window", float(window))

    @property
    def key(self) -> tuple[str, str]:
        """``(provider, model)``: what the quota is of."""
        return self.provider, self.model

    def limits(self) -> dict[str, Any]:
        """The limits as plain values (what ``perdure quotas --json`` shows)."""
        return {"tokens_per_minute": self.tokens_per_minute,
                "requests_per_minute": self.requests_per_minute, "window": self.window}

    def same_limits(self, other: ModelQuota) -> bool:
        """Whether ``other`` is of the same provider and model, with the same limits."""
        return self.key == other.key and self.limits() == other.limits()

    def per_window(self, factor: float = 1.0) -> tuple[int | None, int | None]:
        """The tokens and requests the window admits at ``factor`` of the declared rate
        (each at least 1)."""
        scale = self.window / 60.0 * factor
        tokens = (None if self.tokens_per_minute is None
                  else max(1, math.floor(self.tokens_per_minute * scale)))
        requests = (None if self.requests_per_minute is None
                    else max(1, math.floor(self.requests_per_minute * scale)))
        return tokens, requests


@dataclass(frozen=True, slots=True)
class QuotaState:
    """What 429s taught about a quota: the rate's ``factor`` (of the declared one) as of
    ``adapted_at``, no grant before ``blocked_until`` (the provider's ``retry-after``),
    and how many 429s were reported (``throttles``, the last at ``throttled_at``)."""

    factor: float = 1.0
    adapted_at: float | None = None
    blocked_until: float | None = None
    throttles: int = 0
    throttled_at: float | None = None


def factor_at(quota: ModelQuota, state: QuotaState, now: float) -> float:
    """The share of the declared rate in force at ``now``: the adapted factor, grown back
    by ``RECOVERY`` per window since it was set."""
    if state.adapted_at is None or state.factor >= 1.0:
        return 1.0
    grown = state.factor + RECOVERY * max(0.0, now - state.adapted_at) / quota.window
    return min(1.0, grown)


def throttled(quota: ModelQuota, state: QuotaState, now: float,
              retry_after: float | None) -> QuotaState:
    """The state after a 429 at ``now``: the rate in force halved (at least
    ``MIN_FACTOR``), no grant until ``retry_after`` seconds have passed."""
    factor = max(MIN_FACTOR, factor_at(quota, state, now) / 2)
    blocked = state.blocked_until
    if retry_after is not None and retry_after > 0:
        blocked = max(blocked or 0.0, now + retry_after)
    return QuotaState(factor, now, blocked, state.throttles + 1, now)


@dataclass(frozen=True, slots=True)
class Reservation:
    """One call's place in a quota's window: its ``tokens`` (the estimate until settled,
    then what the provider reported) counted from ``at``."""

    at: float
    tokens: int


def admit(quota: ModelQuota, state: QuotaState, window: Iterable[Reservation], tokens: int,
          now: float) -> float | None:
    """Whether a call of ``tokens`` may be made at ``now`` given the reservations in the
    quota's window: ``None`` when it fits, else the time at which it will (as the
    window's reservations leave it, at the rate in force now; a call larger than the
    whole window's tokens fits an empty window)."""
    blocked = state.blocked_until
    if blocked is not None and blocked > now:
        return blocked
    token_cap, request_cap = quota.per_window(factor_at(quota, state, now))
    live = sorted((r for r in window if r.at > now - quota.window), key=lambda r: r.at)
    need = tokens if token_cap is None else min(tokens, token_cap)
    used = sum(r.tokens for r in live)
    count = len(live)

    def fits(used: int, count: int) -> bool:
        return ((token_cap is None or used + need <= token_cap)
                and (request_cap is None or count + 1 <= request_cap))

    if fits(used, count):
        return None
    for r in live:  # the oldest leave first
        used -= r.tokens
        count -= 1
        if fits(used, count):
            return r.at + quota.window
    return now + quota.window  # not reached: an empty window fits any call
