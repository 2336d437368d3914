"""Intent refinement and the record-body round trip of Intent and Context."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perdure.core.codec import decode, encode
from perdure.core.intent import Context, Intent
from tests.unit.builders import PROFILE

scalars = st.none() | st.booleans() | st.integers(-1000, 1000) | st.text(max_size=8)
names = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12)

intents = st.builds(
    Intent,
    agent=names,
    version=names,
    args=st.lists(scalars, max_size=4).map(tuple),
    kwargs=st.dictionaries(names, scalars, max_size=3),
    deadline=st.none() | st.floats(0, 2e9),
    max_failures=st.none() | st.integers(0, 50),
    requires=st.lists(names, max_size=3).map(tuple),
    goal=st.dictionaries(names, scalars, max_size=3),
    version_no=st.integers(1, 100),
)
contexts = st.builds(
    Context,
    object_id=names,
    trace_id=names,
    parent_id=st.none() | names,
    root_id=st.none() | names,
    depth=st.integers(0, 10),
    tenant=st.none() | names,
    trust_scope=names,
    labels=st.dictionaries(names, names, max_size=3),
)


def test_refined_bumps_the_version_and_applies_changes() -> None:
    """A refinement returns the next intent version with the changes; the old one is kept."""
    first = Intent("demo", "1", args=(1,), goal={"pages": 3})
    second = first.refined({"goal": {"pages": 5}, "deadline": 99.0})
    assert second.version_no == 2
    assert second.goal == {"pages": 5}
    assert second.deadline == 99.0
    assert (second.agent, second.version, second.args) == ("demo", "1", (1,))
    assert first.version_no == 1
    assert first.goal == {"pages": 3}
    assert second.refined({}).version_no == 3


def test_refined_turns_requires_into_a_tuple() -> None:
    """``requires`` given as a list is stored as a tuple, keeping the intent hashable-safe."""
    refined = Intent("demo", "1").refined({"requires": ["gpu", "net"]})
    assert refined.requires == ("gpu", "net")


@pytest.mark.parametrize("field", ["agent", "version", "args", "kwargs", "version_no", "nope"])
def test_refined_refuses_other_fields(field: str) -> None:
    """Only deadline, max_failures, goal and requires can be refined; others are refused."""
    with pytest.raises(ValueError, match=field):
        Intent("demo", "1").refined({field: 1, "goal": {}})


def test_intent_is_frozen() -> None:
    """An intent cannot be changed in place."""
    with pytest.raises(dataclasses.FrozenInstanceError):
        Intent("demo", "1").deadline = 1.0  # type: ignore[misc]


def test_from_body_fills_defaults() -> None:
    """Bodies with only the required fields decode with the documented defaults."""
    assert Intent.from_body({"agent": "a", "version": "2"}) == Intent("a", "2")
    assert Context.from_body({"object_id": "o", "trace_id": "t"}) == Context("o", "t")


def test_from_body_requires_identity() -> None:
    """A body without the agent or object id is refused, not guessed."""
    with pytest.raises(KeyError):
        Intent.from_body({"version": "1"})
    with pytest.raises(KeyError):
        Context.from_body({"trace_id": "t"})


@PROFILE
@given(intents)
def test_intent_round_trip(intent: Intent) -> None:
    """An intent survives to_body, canonical JSON and from_body unchanged."""
    body = intent.to_body()
    assert Intent.from_body(body) == intent
    assert Intent.from_body(decode(encode(body))) == intent


@PROFILE
@given(contexts)
def test_context_round_trip(context: Context) -> None:
    """A context survives to_body, canonical JSON and from_body unchanged."""
    body = context.to_body()
    assert Context.from_body(body) == context
    assert Context.from_body(decode(encode(body))) == context
