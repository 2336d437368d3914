"""The normalised shapes: one JSON form per value, round trips, and what is refused."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perdure.llm import (
    ImagePart,
    Message,
    ModelParams,
    ModelReply,
    ModelRequest,
    StreamChunk,
    TextPart,
    ToolCall,
    ToolCallDelta,
    ToolSpec,
    Usage,
    canonical,
    message_hash,
    request_hash,
)

texts = st.text(max_size=40)
calls = st.builds(ToolCall, id=st.text(min_size=1, max_size=8),
                  name=st.text(min_size=1, max_size=8), arguments=st.just('{"a": 1}'))
parts = st.one_of(st.builds(TextPart, texts),
                  st.builds(ImagePart, st.just("https://example.invalid/x.png"),
                            st.sampled_from([None, "image/png"])))
messages = st.one_of(
    st.builds(Message.system, texts),
    st.builds(Message.user, texts),
    st.builds(Message, st.just("user"), st.lists(parts, max_size=3).map(tuple)),
    st.builds(Message.assistant, texts, st.lists(calls, max_size=3)),
    st.builds(Message.tool, st.text(min_size=1, max_size=8), texts),
)


@given(messages)
def test_message_round_trips_through_json(message: Message) -> None:
    """``from_json(to_json(m)) == m``, through real JSON text."""
    assert Message.from_json(json.loads(json.dumps(message.to_json()))) == message


@given(messages)
def test_message_hash_is_the_hash_of_its_canonical_json(message: Message) -> None:
    """Equal messages hash equal; the hash is 64 hex digits of SHA-256."""
    copy = Message.from_json(message.to_json())
    assert message_hash(copy) == message_hash(message)
    assert len(message_hash(message)) == 64


def test_text_only_content_is_a_plain_string() -> None:
    """The compact form: a one-text-part message's content is a string."""
    assert Message.user("hi").to_json() == {"role": "user", "content": "hi"}
    assert Message.assistant("", [ToolCall("c1", "f")]).to_json() == {
        "role": "assistant", "tool_calls": [{"id": "c1", "name": "f", "arguments": "{}"}]}


@pytest.mark.parametrize("bad", [
    lambda: Message("robot", (TextPart("x"),)),  # type: ignore[arg-type]
    lambda: Message("user", (), (ToolCall("c", "f"),)),
    lambda: Message("tool", (TextPart("x"),)),
    lambda: Message("user", (TextPart("x"),), tool_call_id="c"),
])
def test_malformed_messages_are_refused(bad: object) -> None:
    """A wrong role, tool calls off an assistant, or a tool message without its call id
    raise ``ValueError`` when built."""
    with pytest.raises(ValueError):
        bad()  # type: ignore[operator]


def test_request_round_trip_and_hash() -> None:
    """A whole request round-trips; its hash changes with any part of it."""
    request = ModelRequest(
        "gpt-4o", (Message.system("s"), Message.user("u")),
        tools=(ToolSpec("f", "does f", {"type": "object", "properties": {"x": {}}}),),
        params=ModelParams(temperature=0.2, max_tokens=50, stop=("END",),
                           extra={"user": "u1"}),
        prefix="Once",
    )
    assert ModelRequest.from_json(json.loads(json.dumps(request.to_json()))) == request
    base = request_hash(request)
    assert request_hash(ModelRequest.from_json(request.to_json())) == base
    variants = [
        ModelRequest("gpt-4o-mini", request.messages, request.tools, request.params, "Once"),
        ModelRequest("gpt-4o", request.messages[:1], request.tools, request.params, "Once"),
        ModelRequest("gpt-4o", request.messages, (), request.params, "Once"),
        ModelRequest("gpt-4o", request.messages, request.tools, ModelParams(), "Once"),
        ModelRequest("gpt-4o", request.messages, request.tools, request.params, ""),
    ]
    assert len({base, *(request_hash(v) for v in variants)}) == 6


def test_stateful_means_stored_provider_state() -> None:
    """Only ``store=True`` or a ``previous_response_id`` make a request stateful."""
    plain = ModelRequest("m", (Message.user("x"),))
    assert not plain.stateful
    assert ModelRequest("m", (), params=ModelParams(store=True)).stateful
    assert ModelRequest("m", (), params=ModelParams(previous_response_id="resp_1")).stateful
    assert not ModelRequest("m", (), params=ModelParams(store=False)).stateful


def test_schema_and_extra_are_copied() -> None:
    """A tool's schema and the params' extra are copies: changing the caller's dict later
    changes neither the value nor its hash."""
    schema = {"type": "object", "properties": {}}
    tool = ToolSpec("f", parameters=schema)
    schema["properties"] = {"changed": {}}
    assert tool.parameters == {"type": "object", "properties": {}}


def test_reply_and_chunk_round_trip() -> None:
    """Replies and stream chunks round-trip; the reply's message is what goes next."""
    reply = ModelReply(text="hi", tool_calls=(ToolCall("c", "f", '{"q":1}'),),
                       finish_reason="tool_calls",
                       usage=Usage(10, 5, cached_input_tokens=4, reasoning_tokens=2),
                       model="m-1", provider="anthropic", request_id="req_1",
                       response_id="msg_1", latency=0.25)
    assert ModelReply.from_json(json.loads(json.dumps(reply.to_json()))) == reply
    assert reply.message() == Message.assistant("hi", [ToolCall("c", "f", '{"q":1}')])
    for chunk in (StreamChunk(0, text="a"),
                  StreamChunk(1, tool_call=ToolCallDelta(0, "c", "f", '{"q"'))):
        assert StreamChunk.from_json(chunk.to_json()) == chunk
    assert ToolCall("c", "f", '{"q": [1, 2]}').parsed() == {"q": [1, 2]}


def test_usage_adds_up() -> None:
    """Usages add field by field; total is input plus output."""
    total = Usage(10, 2, 3) + Usage(1, 1, 0, 5, 1)
    assert total == Usage(11, 3, 3, 5, 1)
    assert total.total_tokens == 14
    assert Usage.from_json(total.to_json()) == total


def test_canonical_bytes_sort_keys_and_keep_unicode() -> None:
    """Canonical JSON: sorted keys, no spaces, UTF-8 as it is."""
    assert canonical({"b": 1, "a": "é"}) == '{"a":"é","b":1}'.encode()
