"""Arguments against an agent's signature, and how a repeated start differs from the first."""

from __future__ import annotations

from typing import Any

import pytest

from perdure.core.arguments import agent_signature, check_arguments, start_differences
from perdure.errors import ConfigurationError


def review(run: Any, docs: list[str], pace: float = 1.0, *, strict: bool = False) -> None:
    """An agent function: the run first, then its own parameters."""


def anything(run: Any, *args: Any, **kwargs: Any) -> None:
    """An agent that takes whatever it is given."""


def test_signature_without_the_run() -> None:
    """The signature shown is the one a caller writes: the run parameter left out."""
    assert agent_signature(review) == (
        "(docs: list[str], pace: float = 1.0, *, strict: bool = False)"
    )
    assert agent_signature(anything) == "(*args: Any, **kwargs: Any)"


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((["a"],), {}), ((["a"], 2.0), {"strict": True}), ((), {"docs": [], "pace": 3})],
)
def test_arguments_that_bind(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Arguments the function accepts pass without a word."""
    check_arguments(review, args, kwargs, agent="review")
    check_arguments(anything, args, kwargs, agent="anything")


@pytest.mark.parametrize(
    ("args", "kwargs", "reason"),
    [
        ((), {}, "missing a required argument: 'docs'"),
        ((["a"], 1, 2), {}, "too many positional arguments"),
        ((["a"],), {"speed": 2}, "got an unexpected keyword argument 'speed'"),
        ((["a"],), {"docs": ["b"]}, "multiple values for argument 'docs'"),
        ((["a"], 1, True), {}, "too many positional arguments"),
    ],
)
def test_arguments_that_do_not_bind(args: tuple[Any, ...], kwargs: dict[str, Any],
                                    reason: str) -> None:
    """A mismatch is a ConfigurationError naming the agent, its signature and the reason."""
    with pytest.raises(ConfigurationError) as caught:
        check_arguments(review, args, kwargs, agent="review")
    assert str(caught.value) == (
        "agent 'review' takes (docs: list[str], pace: float = 1.0, *, strict: bool = False): "
        f"{reason}; pass arguments that match"
    )


def test_a_callable_without_a_signature_is_not_checked() -> None:
    """A callable whose signature cannot be read is left to fail when it runs."""
    check_arguments(min, (1, 2, 3), {"nope": 1}, agent="min")  # a builtin without one


FIRST = {
    "intent": {"agent": "review", "version": "1", "args": [3], "kwargs": {},
               "deadline": None, "max_failures": None},
    "context": {"object_id": "demo-1", "trace_id": "t", "labels": {}},
}


def differs(**asked: Any) -> str | None:
    options: dict[str, Any] = {"args": (3,), "kwargs": {}, "labels": {},
                               "max_failures": None, "deadline": None}
    options.update(asked)
    return start_differences("demo-1", FIRST, **options)


def test_the_same_start_does_not_differ() -> None:
    """The same arguments (a tuple is the list memory holds), labels, budget and no
    deadline: nothing differs."""
    assert differs() is None
    assert differs(args=[3]) is None


def test_other_arguments() -> None:
    """Other arguments are named in one sentence with both values, as compact JSON."""
    assert differs(args=(5,)) == (
        "object 'demo-1' already exists with other arguments: recorded args=[3] kwargs={}, "
        "asked args=[5] kwargs={}"
    )
    assert "asked args=[3] kwargs={\"x\":1}" in (differs(kwargs={"x": 1}) or "")


def test_other_labels_budget_and_deadline() -> None:
    """Labels, the failure budget and a deadline given or not are compared too, and
    every difference is in the one sentence."""
    text = differs(args=(4,), labels={"team": "a"}, max_failures=3, deadline=60.0)
    assert text == (
        "object 'demo-1' already exists with other arguments, labels, failure budget and "
        "deadline: recorded args=[3] kwargs={} labels={} max_failures=null deadline=none, "
        "asked args=[4] kwargs={} labels={\"team\":\"a\"} max_failures=3 deadline=in 60s"
    )


def test_a_deadline_is_compared_as_given_or_not() -> None:
    """A recorded deadline is a point in time and a start's is seconds from now: two
    starts that both give one do not differ."""
    first = {**FIRST, "intent": {**FIRST["intent"], "deadline": 1_700_000_060.0}}
    assert start_differences("demo-1", first, args=(3,), kwargs={}, labels={},
                             max_failures=None, deadline=60.0) is None
    text = start_differences("demo-1", first, args=(3,), kwargs={}, labels={},
                             max_failures=None, deadline=None)
    assert text is not None and "recorded deadline=at 1700000060, asked deadline=none" in text


def test_long_and_unprintable_values_stay_on_one_short_line() -> None:
    """Values are ASCII JSON (control and format characters escaped) and cut short."""
    text = differs(args=("\x1b[2J\u202e" + "x" * 500,)) or ""
    assert text.isprintable() and text.isascii()
    assert "\\u001b[2J\\u202e" in text
    assert len(text) < 400
