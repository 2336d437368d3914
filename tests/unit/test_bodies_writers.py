"""The engine's writers build bodies through the typed ones, byte for byte as before.

``ChildFinished.signalled`` must write whatever a child's signal carried, as the engine
wrote it by hand (the payload with the event's id and digest over it), and the step hot
path (``durable_first``, ``done_draft``) the very dicts and bytes it built by hand.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perdure.core.bodies import NO_RESULT, OUTCOMES, ChildFinished, StepStarted, decode_body
from perdure.core.codec import decode as decode_json
from perdure.core.codec import encode
from perdure.core.records import Kind, step_done_bytes
from perdure.engine.commands.steps import done_draft

ERROR = {"type": "builtins:ValueError", "message": "bad", "args": ["bad"], "attrs": {},
         "dropped": []}


def _merged(payload: dict[str, Any], event_id: int, digest: str | None) -> dict[str, Any]:
    """How the engine wrote a ``child_finished`` body before ``ChildFinished.signalled``:
    the signal's payload with the event's id and digest over it."""
    extra: dict[str, Any] = {"event_id": event_id}
    if digest:
        extra["event_hash"] = digest
    return {**payload, **extra}


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=4),
                     lambda inner: st.lists(inner, max_size=2)
                     | st.dictionaries(st.text(max_size=3), inner, max_size=2), max_leaves=4)


@given(st.fixed_dictionaries(
           {"child_id": st.one_of(st.text(max_size=5), _JSON)},
           optional={"outcome": st.sampled_from(OUTCOMES) | _JSON, "result": _JSON,
                     "error": st.dictionaries(st.text(max_size=3), _JSON, max_size=2) | _JSON,
                     "event_id": _JSON, "event_hash": _JSON, "extra": _JSON}),
       st.integers(min_value=1, max_value=10**6),
       st.none() | st.just("") | st.text(alphabet="0123456789abcdef", min_size=1, max_size=8))
def test_child_finished_of_any_signal_is_the_merged_payload(payload: dict[str, Any],
                                                            event_id: int,
                                                            digest: str | None) -> None:
    """``ChildFinished.signalled`` writes what a signal carried, byte for byte, whatever
    its shape; a signal in perdure's own shape decodes back to the same body."""
    typed = ChildFinished.signalled(payload, event_id, digest)
    assert typed.encode() == _merged(payload, event_id, digest)
    assert encode(typed.draft().body) == encode(_merged(payload, event_id, digest))
    if typed.others is None and typed.result is not NO_RESULT and typed.outcome in OUTCOMES:
        stored = decode_json(encode(typed.encode()))
        assert decode_body("child_finished", stored, object_id="o", seq=2) == typed


@pytest.mark.parametrize("outcome", OUTCOMES)
def test_perdure_signals_give_plain_child_finished_bodies(outcome: str) -> None:
    """A signal as ``parent_signal`` writes it needs no ``others``."""
    payload: dict[str, Any] = {"child_id": "o-1.0", "outcome": outcome}
    if outcome == "completed":
        payload["result"] = [1]
    if outcome == "failed":
        payload["error"] = ERROR
    typed = ChildFinished.signalled(payload, 7, "ab" * 32)
    assert typed.others is None
    assert typed == ChildFinished("o-1.0", outcome, 7, payload.get("result"),
                                  payload.get("error"), "ab" * 32)


@given(st.integers(min_value=0, max_value=10**6)
       | st.from_regex(r"[0-9]{1,3}(\.[0-9]{1,3}){1,3}", fullmatch=True),
       st.text(max_size=12), st.integers(min_value=1, max_value=50),
       st.floats(min_value=0, max_value=1e4, allow_nan=False), _JSON)
def test_step_records_equal_the_dicts_the_engine_wrote(pos: int | str, name: str,
                                                       attempt: int, latency: float,
                                                       result: Any) -> None:
    """``done_draft`` and ``StepStarted`` (the step hot path) give exactly the dicts and
    bytes the engine built by hand before typed bodies."""
    latency = round(latency, 6)
    base = {"pos": pos, "cmd": "step", "name": name}
    result_bytes = encode(result)
    done = done_draft(pos, name, attempt, latency, result, result_bytes)
    assert done.kind == Kind.STEP_DONE
    assert done.body == {**base, "attempt": attempt, "latency": latency, "result": result}
    assert done.body_bytes == step_done_bytes(attempt, latency, name, pos, result_bytes)
    if done.body_bytes is not None:
        assert done.body_bytes == encode(done.body)
    started = StepStarted(pos, name, attempt, "k").draft()
    assert started.body == {**base, "attempt": attempt, "key": "k"}
