"""A worker process SIGKILLed mid-stream loses at most one flush window; on resume the
call is continued from what memory holds, and the server hears the salvaged prefix.

A real worker subprocess, real SDK, real HTTP, the scripted server; both stores.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.importorskip("openai")
pytest.importorskip("anthropic")

import perdure
from perdure.llm import recorded_calls
from perdure.llm.scripted import ScriptedReply, ScriptedServer
from tests.integration.engine_support import kill_process, wait_until
from tests.integration.model_support import long_stream, start_model_worker
from tests.integration.test_model_calls import model_records

STORY = "Once upon a time there was a durable agent that never lost its words. " * 6
CHUNK_DELAY = 0.05  # seconds between chunks: 4 characters each
FLUSH_WINDOW = 0.1  # the default FlushPolicy's interval


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    """A scripted model server on 127.0.0.1, stopped after the test."""
    with ScriptedServer() as running:
        yield running


def test_a_worker_killed_mid_stream_loses_at_most_one_flush_window(
        make_app: Callable[..., perdure.App], server: ScriptedServer, store_url: str,
        key_dir: Path, tmp_path: Path) -> None:
    """SIGKILL while the reply streams: memory holds every chunk older than one flush
    window; the resuming node records the lost attempt, chooses ``continue`` (recorded)
    and sends the salvaged text as the reply's start; the agent gets both parts."""
    server.script(ScriptedReply(text=STORY, chunk_chars=4, chunk_delay=CHUNK_DELAY),
                  ScriptedReply(text=" The end."))
    starter = make_app()
    starter.agent(name="long_stream")(long_stream)
    starter.options(object_id="story-1").start("long_stream", server.openai_base_url)
    log = tmp_path / "worker.log"
    proc = start_model_worker(store_url, key_dir, log)
    try:
        assert wait_until(lambda: sum(r.kind == "model_chunks"
                                      for r in starter.history("story-1")) >= 5,
                          timeout=20), log.read_text()
    finally:
        kill_process(proc)
    batches = [r.body for r in starter.history("story-1") if r.kind == "model_chunks"]
    chunks = [c for batch in batches for c in batch["chunks"]]
    salvaged = "".join(c["text"] for c in chunks)
    assert STORY.startswith(salvaged)
    sent = server.streamed(1)  # chunks the server wrote before the kill (counted, not timed)
    lost = sent - len(chunks)
    assert lost <= FLUSH_WINDOW / CHUNK_DELAY + 2, (sent, len(chunks))

    resumer = make_app()
    resumer.agent(name="long_stream")(long_stream)
    with resumer.background_worker():
        result = resumer.handle("story-1").result(timeout=20)
    assert result == {"text": salvaged + " The end.", "finish": "stop"}
    history = resumer.history("story-1")
    [failed] = [r.body for r in history if r.kind == "model_failed"]
    assert failed["failure"]["reason"] == "the worker was lost mid-stream"
    assert failed["chunks"] == len(chunks)
    [recovered] = [r.body for r in history if r.kind == "model_recovered"]
    assert recovered["recovery"] == "continue" and recovered["chars"] == len(salvaged)
    assert len(server.requests) == 2
    continuation = server.requests[1].body["messages"]
    assert continuation[-2] == {"role": "assistant", "content": salvaged}
    [call] = model_records(resumer, "story-1")
    assert call["attempt"] == 2 and call["request"]["prefix"] == {"streamed": 1}
    [read] = recorded_calls(resumer.history("story-1"))
    assert read.request.prefix == salvaged and read.reply.text == result["text"]
    assert resumer.verify("story-1").ok
