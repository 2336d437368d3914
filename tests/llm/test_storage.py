"""Requests stored as references to messages stored once: exact round trips, failing
closed, and storage that grows with the conversation, not with its square."""

from __future__ import annotations

import random
from typing import Any

import pytest

from perdure.llm import (
    Message,
    ModelParams,
    ModelReply,
    ModelRequest,
    RequestRefs,
    ToolCall,
    ToolSpec,
    Usage,
    canonical,
    join_reply,
    join_request,
    prompt_view,
    split_reply,
    split_request,
)

TEXT = ("the agent reads a ledger of invoices and checks each total against the order "
         "history before it writes a summary for the finance team with every discrepancy "
         "it found and the customer names dates amounts currencies and notes")
WORDS = TEXT.split()
TOOLS = (
    ToolSpec("lookup_invoice", "Find an invoice by its number.",
             {"type": "object", "properties": {"number": {"type": "string"}},
              "required": ["number"]}),
    ToolSpec("convert", "Convert an amount between currencies.",
             {"type": "object", "properties": {"amount": {"type": "number"},
                                               "from": {"type": "string"},
                                               "to": {"type": "string"}}}),
)


class CharCounter:
    """A cheap token counter for storage tests: a quarter of the characters."""

    name = "chars/4"

    def count_text(self, text: str) -> int:
        return len(text) // 4

    def count_message(self, message: Message) -> int:
        return 3 + self.count_text(message.text) + sum(
            self.count_text(c.arguments) + 3 for c in message.tool_calls)

    def count_prompt(self, messages: Any, tools: Any = ()) -> int:
        return 3 + sum(self.count_message(m) for m in messages)


def _sentence(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high))).capitalize()


def _reply(rng: random.Random, turn: int) -> ModelReply:
    if turn % 5 == 4:
        call = ToolCall(f"call_{turn}", "lookup_invoice", f'{{"number": "INV-{turn:04d}"}}')
        return ModelReply(tool_calls=(call,), finish_reason="tool_calls",
                          usage=Usage(1000 + turn * 50, 20), model="gpt-4o-2024-08-06",
                          provider="openai.chat", request_id=f"req_{turn}",
                          response_id=f"chatcmpl-{turn}", latency=0.8)
    return ModelReply(text=_sentence(rng, 40, 150), usage=Usage(1000 + turn * 50, 180),
                      model="gpt-4o-2024-08-06", provider="openai.chat",
                      request_id=f"req_{turn}", response_id=f"chatcmpl-{turn}", latency=1.2)


class Memory:
    """What a memory holds for model calls: blobs once, one record per call."""

    def __init__(self) -> None:
        self.blobs: dict[str, Any] = {}
        self.records: list[tuple[dict[str, Any], dict[str, Any]]] = []
        self.refs: RequestRefs | None = None

    def record(self, request: ModelRequest, reply: ModelReply) -> None:
        split = split_request(request, self.refs)
        for digest, blob in split.blobs.items():
            self.blobs.setdefault(digest, blob)
        stored = split_reply(reply)
        self.blobs.setdefault(stored.message_hash, stored.message)
        self.records.append((split.body, stored.body))
        self.refs = split.refs

    def stored_bytes(self) -> int:
        return (sum(len(canonical(b)) for b in self.blobs.values())
                + sum(len(canonical(a)) + len(canonical(b)) for a, b in self.records))

    def replay(self) -> list[tuple[ModelRequest, ModelReply]]:
        out = []
        refs: RequestRefs | None = None
        for request_body, reply_body in self.records:
            request, refs = join_request(request_body, self.blobs, refs)
            out.append((request, join_reply(reply_body, self.blobs)))
        return out


def converse(turns: int, *, window: int | None = None, seed: int = 7) -> tuple[
        Memory, list[tuple[ModelRequest, ModelReply]], list[Message]]:
    """A conversation of ``turns`` user turns, each call sending the whole history (or
    the prompt view of ``window`` tokens); a tool result follows each tool call."""
    rng = random.Random(seed)
    memory = Memory()
    calls: list[tuple[ModelRequest, ModelReply]] = []
    history = [Message.system("You reconcile invoices. " + _sentence(rng, 30, 40))]
    for turn in range(turns):
        history.append(Message.user(_sentence(rng, 15, 60)))
        while True:
            sent = history if window is None else list(prompt_view(
                history, window=window, counter=CharCounter()).messages)
            request = ModelRequest("gpt-4o", tuple(sent), TOOLS,
                                   ModelParams(temperature=0.2, max_tokens=800))
            reply = _reply(rng, turn if history[-1].role != "tool" else turn + 1)
            memory.record(request, reply)
            calls.append((request, reply))
            history.append(reply.message())
            if not reply.tool_calls:
                break
            for call in reply.tool_calls:
                history.append(Message.tool(call.id, _sentence(rng, 20, 40)))
    return memory, calls, history


def _unique_message_bytes(history: list[Message]) -> int:
    unique = {canonical(m.to_json()) for m in history}
    return sum(len(b) for b in unique)


def test_every_call_comes_back_exactly() -> None:
    """Joining the stored records gives back every request and reply, equal field for
    field."""
    memory, calls, _ = converse(30)
    assert memory.replay() == calls


@pytest.mark.parametrize("window", [None, 6_000])
def test_200_turns_take_at_most_twice_their_unique_messages(window: int | None) -> None:
    """A 200-turn conversation (tool calls every fifth turn) stores at most 2x the bytes
    of its unique messages, sending the whole history each call or a sliding window."""
    memory, calls, history = converse(200, window=window)
    unique = _unique_message_bytes(history)
    stored = memory.stored_bytes()
    assert len(calls) > 200
    assert stored <= 2 * unique, (stored, unique, stored / unique)
    naive = sum(len(canonical(r.to_json())) + len(canonical(p.to_json())) for r, p in calls)
    assert naive > 10 * stored  # what storing every request whole would cost


def test_bytes_per_turn_stay_flat() -> None:
    """Bytes per turn at 10, 100 and 200 turns stay within a small factor: growth is
    linear in the turns."""
    per_turn = []
    for turns in (10, 100, 200):
        memory, _, _ = converse(turns)
        per_turn.append(memory.stored_bytes() / turns)
    assert max(per_turn) < 1.5 * min(per_turn), per_turn


def test_a_body_names_only_new_messages() -> None:
    """The second call's body spells out only the hashes its base lacks; the rest is one
    slice."""
    first = ModelRequest("m", (Message.system("s"), Message.user("a")))
    second = ModelRequest("m", (*first.messages, Message.assistant("b"), Message.user("c")))
    one = split_request(first)
    two = split_request(second, one.refs)
    assert two.body["base"] == one.refs.hash
    assert two.body["messages"][0] == [0, 2]
    assert len(two.body["messages"]) == 3


def test_join_fails_closed() -> None:
    """A missing blob, a wrong base, a changed blob or a bad reference is a ValueError,
    never a different request."""
    first = split_request(ModelRequest("m", (Message.user("a"), Message.user("b"))))
    second = split_request(ModelRequest("m", (Message.user("a"), Message.user("b"),
                                              Message.user("c"))), first.refs)
    blobs = {**first.blobs, **second.blobs}
    assert join_request(second.body, blobs, first.refs)[0].messages[-1] == Message.user("c")
    with pytest.raises(ValueError, match="base"):
        join_request(second.body, blobs, None)
    missing = {k: v for k, v in blobs.items() if v != {"role": "user", "content": "c"}}
    with pytest.raises(ValueError, match="missing blob"):
        join_request(second.body, missing, first.refs)
    changed = {k: ({"role": "user", "content": "C"} if v == {"role": "user", "content": "c"}
                   else v) for k, v in blobs.items()}
    with pytest.raises(ValueError, match="hash"):
        join_request(second.body, changed, first.refs)
    with pytest.raises(ValueError, match="bad reference"):
        join_request({**second.body, "messages": [[0, 9]]}, blobs, first.refs)


def test_reply_is_stored_as_the_next_requests_message() -> None:
    """A reply's text lives in the assistant message blob the next request names."""
    reply = ModelReply(text="hello", model="m", usage=Usage(3, 1))
    stored = split_reply(reply)
    assert "text" not in stored.body
    following = split_request(ModelRequest("m", (Message.user("hi"), reply.message())))
    assert stored.message_hash in following.blobs
    assert join_reply(stored.body, {stored.message_hash: stored.message}) == reply
    with pytest.raises(ValueError):
        join_reply(stored.body, {})
