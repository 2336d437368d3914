"""Journal batches of a stream, and what is done with a salvaged one."""

from __future__ import annotations

import pytest

from perdure.llm import (
    BpeTokenCounter,
    ChunkBatcher,
    FlushPolicy,
    Message,
    ModelCallError,
    ModelParams,
    ModelRequest,
    Recovery,
    RecoveryMarker,
    Salvage,
    StreamChunk,
    ToolCallDelta,
    choose_recovery,
    continuation_of,
    lost_usage,
)
from perdure.llm.scripted import ScriptedReply, ScriptedServer
from tests.llm.support import KINDS, make_client, run, stream


def _chunks(n: int, text: str = "word ") -> list[StreamChunk]:
    return [StreamChunk(i, text=text) for i in range(n)]


def test_batches_close_at_max_tokens() -> None:
    """Without a pause, a batch is written every ``max_tokens`` tokens."""
    batcher = ChunkBatcher(FlushPolicy(interval=10.0, max_tokens=4))
    written = [batcher.add(c, now=0.0) for c in _chunks(10)]
    assert [len(b) for b in written if b] == [4, 4]
    assert len(batcher.take()) == 2 and batcher.take() == ()


def test_batches_close_by_time_and_say_when() -> None:
    """A slow stream is written ``interval`` after a batch's first chunk; ``deadline``
    tells a timer when, so a stalled stream's last chunks are written on time too."""
    batcher = ChunkBatcher(FlushPolicy(interval=0.1, max_tokens=64))
    first, second, third = _chunks(3)
    assert batcher.deadline is None
    assert batcher.add(first, now=1.00) == ()
    assert batcher.deadline == pytest.approx(1.1)
    assert batcher.add(second, now=1.05) == ()
    assert not batcher.due(1.09) and batcher.due(1.10)
    assert batcher.add(third, now=1.12) == (first, second, third)
    assert batcher.deadline is None


def test_tokens_counted_with_a_counter() -> None:
    """With a counter, a batch closes on counted tokens, tool-call arguments included."""
    batcher = ChunkBatcher(FlushPolicy(interval=10.0, max_tokens=10), BpeTokenCounter())
    long = StreamChunk(0, tool_call=ToolCallDelta(0, arguments='{"text": "' + "a b c " * 5))
    assert len(batcher.add(long, now=0.0)) == 1


def test_bad_policy() -> None:
    """A policy needs a positive interval and at least one token."""
    with pytest.raises(ValueError):
        FlushPolicy(interval=0)
    with pytest.raises(ValueError):
        FlushPolicy(max_tokens=0)


@pytest.mark.parametrize(("policy", "salvage", "stateful", "chosen"), [
    (Recovery.CONTINUE, Salvage("Once upon", 2), False, Recovery.CONTINUE),
    (Recovery.CONTINUE, Salvage("", 0), False, Recovery.RESTART),
    (Recovery.CONTINUE, Salvage("Let me", 3, tool_call_started=True), False,
     Recovery.RESTART),
    (Recovery.RESTART, Salvage("Once", 1), False, Recovery.RESTART),
    (Recovery.SURFACE, Salvage("Once", 1), False, Recovery.SURFACE),
    (Recovery.CONTINUE, Salvage("Once", 1), True, Recovery.SURFACE),
    (Recovery.RESTART, Salvage("", 0), True, Recovery.SURFACE),
])
def test_choose_recovery(policy: Recovery, salvage: Salvage, stateful: bool,
                         chosen: Recovery) -> None:
    """Only text is continued; a stateful call is never repeated by itself."""
    assert choose_recovery(policy, salvage, stateful=stateful) is chosen


def test_salvage_from_journaled_chunks() -> None:
    """A salvage is the prefix and the chunks' text; a tool-call chunk is noted."""
    chunks = [StreamChunk(0, "Once "), StreamChunk(1, "upon"),
              StreamChunk(2, tool_call=ToolCallDelta(0, "c1", "f"))]
    assert Salvage.from_chunks(chunks, prefix="Well. ") == Salvage("Well. Once upon", 3, True)


def test_lost_usage_is_an_estimate_of_prompt_and_salvage() -> None:
    """The lost attempt's usage: the prompt's tokens and the salvaged output's."""
    counter = BpeTokenCounter()
    request = ModelRequest("gpt-4o", (Message.user("Tell me a story."),))
    usage = lost_usage(request, Salvage("Once upon a time", 4), counter)
    assert usage.input_tokens == counter.count_prompt(request.messages)
    assert usage.output_tokens == counter.count_text("Once upon a time")


def test_marker_is_seen_by_the_model() -> None:
    """A surfaced stream's marker round-trips and gives the partial reply and a note."""
    marker = RecoveryMarker(Recovery.SURFACE, "Once upon", 2, "the worker was killed")
    assert RecoveryMarker.from_json(marker.to_json()) == marker
    partial, note = marker.messages()
    assert partial == Message.assistant("Once upon")
    assert note.role == "user" and "interrupted after 2 chunk(s)" in note.text


@pytest.mark.parametrize("kind", KINDS)
def test_a_broken_stream_batched_salvaged_and_continued(kind: str,
                                                        server: ScriptedServer) -> None:
    """End to end on real HTTP: a stream batched as a journal would, broken after five
    chunks; what was written is salvaged and continued to the whole text."""
    story = "Once upon a time a worker kept every word it had written in its memory."
    server.script(ScriptedReply(text=story, chunk_chars=5, drop_after=5))
    request = ModelRequest("m", (Message.user("A story."),), params=ModelParams())
    journal: list[StreamChunk] = []
    batcher = ChunkBatcher(FlushPolicy(interval=10.0, max_tokens=2))

    async def consume() -> None:
        client = make_client(kind, server)
        try:
            async for item in client.stream(request):
                if isinstance(item, StreamChunk):
                    journal.extend(batcher.add(item, now=0.0))
        finally:
            await client.aclose()

    with pytest.raises(ModelCallError):
        run(consume())
    assert len(journal) == 4  # the fifth chunk was pending: one batch is lost at most
    salvage = Salvage.from_chunks(journal)
    assert choose_recovery(Recovery.CONTINUE, salvage, stateful=False) is Recovery.CONTINUE
    sent = salvage.text.rstrip() if kind == "anthropic" else salvage.text
    server.script(ScriptedReply(text=story[len(sent):]))
    _, reply = run(stream(make_client(kind, server), continuation_of(request, salvage)))
    assert reply.text == story
