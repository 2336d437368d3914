"""How memory holds an object's model calls: each value once, by number; requests as runs
of numbers; reading fails closed on a forged or broken record."""

from __future__ import annotations

import random
from typing import Any

import pytest

pytest.importorskip("openai")

from perdure.llm import CallTable, Message, ModelParams, ModelReply, ModelRequest, ToolSpec
from perdure.llm._records import _numbers, _runs
from perdure.llm._storage import request_hash

TOOL = ToolSpec("weather", "The weather.", {"type": "object"})


def _call(table: CallTable, messages: list[Message], text: str,
          params: ModelParams | None = None) -> dict[str, Any]:
    request = ModelRequest("gpt-4o", tuple(messages), (TOOL,), params or ModelParams())
    reply = ModelReply(text=text, model="gpt-4o", provider="openai.chat", request_id="r",
                       latency=0.123456)
    encoded = table.encode(request, request_hash(request), reply,
                           base_url="http://127.0.0.1:1/v1", provider="openai.chat")
    return {"pos": 0, "name": "m", "provider": "openai.chat", "asked": request_hash(request),
            "request": encoded.request, "reply": encoded.reply, "blobs": encoded.blobs}


def _conversation(turns: int) -> tuple[CallTable, list[dict[str, Any]]]:
    table = CallTable()
    messages = [Message.system("Be brief.")]
    bodies = []
    for i in range(turns):
        messages.append(Message.user(f"question {i}"))
        bodies.append(_call(table, messages, f"answer {i}", ModelParams(temperature=0.5)))
        messages.append(Message.assistant(f"answer {i}"))
    return table, bodies


def test_a_conversation_is_read_back_from_its_records_in_any_order() -> None:
    """Each value is stored once; a reader that learns the bodies shuffled rebuilds every
    request and reply; a request's size does not grow with the conversation."""
    _, bodies = _conversation(30)
    stored = [v for body in bodies for v in body["blobs"].values()]
    assert len(stored) == 1 + 30 * 2 + 2  # the messages, the tool and the constants once
    assert len(str(bodies[-1]["request"])) == len(str(bodies[10]["request"]))
    reader = CallTable()
    for body in random.Random(7).sample(bodies, len(bodies)):
        reader.learn(body)
    last = reader.request_of(bodies[-1])
    assert len(last.messages) == 60 and last.messages[-1] == Message.user("question 29")
    assert last.params == ModelParams(temperature=0.5) and last.tools == (TOOL,)
    reply = reader.reply_of(bodies[-1])
    assert reply.text == "answer 29" and reply.model == "gpt-4o" and reply.latency == 0.123


def test_runs_of_numbers_round_trip() -> None:
    """Any list of numbers survives being written as runs."""
    rng = random.Random(3)
    for _ in range(2000):
        numbers = [rng.randrange(40) for _ in range(rng.randrange(30))]
        assert _numbers(_runs(numbers)) == numbers


@pytest.mark.parametrize("items", [[-1], [[3, 3]], [[5, 2]], [True], ["0"], [[0, 10**9]],
                                   "0", [[0, 1, 2]]])
def test_a_forged_reference_is_refused(items: Any) -> None:
    """Negative, empty, reversed, boolean, text or enormous references are refused."""
    with pytest.raises(ValueError, match="bad value"):
        _numbers(items)


def test_reading_fails_closed_on_a_broken_record() -> None:
    """A value named and never stored, a number given two values, a bad number, a
    request whose values were swapped and a streamed reply without its chunks are each
    refused with ``ValueError``, never read as something else."""
    _, bodies = _conversation(3)
    lacking = CallTable()
    lacking.learn(bodies[2])
    with pytest.raises(ValueError, match="does not hold"):
        lacking.request_of(bodies[2])
    with pytest.raises(ValueError, match="stored twice"):
        clash = CallTable()
        clash.learn(bodies[0])
        clash.learn({**bodies[1], "blobs": {"0": {"role": "user", "content": "forged"}}})
    with pytest.raises(ValueError, match="bad value number"):
        CallTable().learn({**bodies[0], "blobs": {"x": {}}})
    reader = CallTable()
    for body in bodies:
        reader.learn(body)
    swapped = {**bodies[2], "request": {**bodies[2]["request"], "messages": [1, 0]}}
    with pytest.raises(ValueError, match="rebuilds to hash"):
        reader.request_of(swapped)
    with pytest.raises(ValueError, match="chunks of attempt 1"):
        CallTable().learn({**bodies[0], "blobs": {"0": {"role": "assistant", "streamed": 1}}})
    with pytest.raises(ValueError, match="bad streamed"):
        CallTable().learn({**bodies[0], "blobs": {"0": {"role": "assistant",
                                                        "streamed": "1"}}})


@pytest.mark.parametrize("change", [
    {"request": {"model": "gpt-4o", "messages": [[0, 10**7]]}},  # past what memory gave out
    {"request": {"model": "gpt-4o", "messages": [0], "setup": "2"}},
    {"request": {"model": "gpt-4o", "messages": [0], "setup": 0}},  # not a constants value
    {"request": None},
    {"reply": {"message": "4"}},
    {"reply": {"message": 0, "usage": "lots"}},
    {"reply": None},
])
def test_a_forged_call_body_is_refused_not_read(change: dict[str, Any]) -> None:
    """Forged request or reply fields of a call whose values are all held are refused
    with ``ValueError`` (never another exception, never a different request)."""
    table, bodies = _conversation(2)
    forged = {**bodies[1], **change}
    read = table.reply_of if "reply" in change else table.request_of
    with pytest.raises(ValueError):
        read(forged)


def test_a_signed_record_that_does_not_read_back_is_named_by_its_seq() -> None:
    """Memory read through ``CallTable.of`` or ``recorded_calls`` names the record that
    does not read back (a node parks the object on it, ``RecordDecodeError``)."""
    from perdure.core.records import Kind
    from perdure.llm import StoredCallError, recorded_calls
    from tests.unit.builders import chain

    _, bodies = _conversation(2)
    good = [(Kind.MODEL_CALL, {**b, "cmd": "model", "attempt": 1, "client": 0})
            for b in bodies]
    records = chain(good)
    assert [c.reply.text for c in recorded_calls(records)] == ["answer 0", "answer 1"]
    clash = {**good[1][1], "blobs": {"0": {"role": "user", "content": "forged"}}}
    with pytest.raises(StoredCallError, match="record #3") as caught:
        CallTable.of(chain([good[0], (Kind.MODEL_CALL, clash)]))
    assert caught.value.seq == 3
    hollow = {**good[1][1], "request": {**good[1][1]["request"], "messages": [[0, 9]]}}
    with pytest.raises(StoredCallError, match="record #3"):
        recorded_calls(chain([good[0], (Kind.MODEL_CALL, hollow)]))
