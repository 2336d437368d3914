"""``ContextPolicy``: a wrong setting is refused when the policy is made, before any call."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("openai")

from perdure.errors import ConfigurationError
from perdure.llm import ContextPolicy


@pytest.mark.parametrize("settings", [
    {"window": 0}, {"window": -5}, {"window": True}, {"window": 1.5},
    {"window": 1000, "reserve": 1000}, {"window": 1000, "reserve": -1},
    {"window": 1000, "reserve": 10, "trigger": 0}, {"window": 1000, "reserve": 10, "trigger": 1.5},
    {"window": 1000, "reserve": 10, "keep": 0}, {"window": 1000, "reserve": 10, "keep": 1},
    {"window": 1000, "reserve": 10, "keep": 0.9, "trigger": 0.5},
    {"window": 1000, "reserve": 10, "name": ""},
    {"window": 1000, "reserve": 10, "instructions": "  "},
    {"window": 1000, "reserve": 10, "summary_max_tokens": 0},
])
def test_a_wrong_setting_is_refused(settings: dict[str, Any]) -> None:
    """Each wrong setting raises ``ConfigurationError`` naming what is wrong."""
    with pytest.raises(ConfigurationError, match="ContextPolicy"):
        ContextPolicy(**settings)


def test_the_defaults_fit_a_real_window() -> None:
    """The defaults keep a reply's room and compact at 80%, keeping half."""
    policy = ContextPolicy(window=128_000)
    assert (policy.reserve, policy.trigger, policy.keep, policy.compact) == (1024, 0.8, 0.5,
                                                                            True)
