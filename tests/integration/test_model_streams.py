"""``run.model(stream=True)``: chunks journaled in batches as they arrive; a stream cut
short (a broken connection here, a killed worker in ``test_model_stream_kill.py``) is
continued, restarted or surfaced as the call's recovery policy says, and the choice is
recorded.

Real SDKs over real HTTP against the scripted server, on both stores.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("openai")
pytest.importorskip("anthropic")

import perdure
from perdure.core.backoff import RetryPolicy
from perdure.llm import FlushPolicy, Message, recorded_calls
from perdure.llm.scripted import ScriptedReply, ScriptedServer
from tests.integration.engine_support import wait_until
from tests.integration.test_model_calls import model_records
from tests.llm.support import make_client

TIMEOUT = 20.0
TEXT = "The quick brown fox jumps over the lazy dog, twice over."
FAST = RetryPolicy(max_attempts=4, base=0.05)


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    """A scripted model server on 127.0.0.1, stopped after the test."""
    with ScriptedServer() as running:
        yield running


def bodies(app: perdure.App, object_id: str, kind: str) -> list[dict[str, Any]]:
    """The bodies of an object's records of ``kind``."""
    return [dict(r.body) for r in app.history(object_id) if r.kind == kind]


def streamer(app: perdure.App, server: ScriptedServer, kind: str = "chat",
             recovery: str = "continue") -> None:
    """An agent streaming one call, then waiting for ``go`` (so it is replayed)."""

    @app.agent(name="streamer")
    async def stream(run: perdure.Run) -> dict[str, Any]:
        client = make_client(kind, server)
        try:
            reply = await run.model(client, model="gpt-4o", messages=[Message.user("Go")],
                                    stream=True, recovery=recovery, retry=FAST,
                                    flush=FlushPolicy(interval=0.05, max_tokens=1000))
        finally:
            await client.aclose()
        await run.wait_for("go")
        return {"text": reply.text, "finish": reply.finish_reason}


def _replies(call: dict[str, Any]) -> list[Any]:
    return [v for v in call["blobs"].values() if v.get("role") == "assistant"]


def finish(app: perdure.App, server: ScriptedServer) -> dict[str, Any]:
    """Start the streamer, let it wait, replay it, and return its result."""
    handle = app.options(object_id="s-1").start("streamer")
    with app.background_worker():
        assert wait_until(lambda: app.get("s-1").waiting_event == "go", TIMEOUT)
        heard = len(server.requests)
        app.send("s-1", "go")
        result = handle.result(timeout=TIMEOUT)
    assert len(server.requests) == heard  # the replay called nobody
    return dict(result)


@pytest.mark.parametrize("kind", ["chat", "anthropic"])
def test_a_stream_is_journaled_in_batches_and_replayed(
        make_app: Callable[..., perdure.App], server: ScriptedServer, kind: str) -> None:
    """Chunks arriving every 30 ms are written in batches (about every 50 ms here), all
    in order, each once; the reply is recorded whole and replayed without a call."""
    app = make_app()
    server.script(ScriptedReply(text=TEXT, chunk_chars=4, chunk_delay=0.03))
    streamer(app, server, kind)
    assert finish(app, server) == {"text": TEXT, "finish": "stop"}
    batches = bodies(app, "s-1", "model_chunks")
    assert len(batches) >= 3
    chunks = [c for batch in batches for c in batch["chunks"]]
    assert [c["index"] for c in chunks] == list(range(len(chunks)))
    assert "".join(c.get("text", "") for c in chunks) == TEXT
    [call] = model_records(app, "s-1")
    assert "recovery" not in call and len(server.requests) == 1
    # the text is held once, in the chunks: the reply's message names them
    assert TEXT not in str(call) and TEXT[:20] not in str(call)
    [message] = [v for v in call["blobs"].values() if v.get("role") == "assistant"]
    assert message == {"role": "assistant", "streamed": 1}
    [read] = recorded_calls(app.history("s-1"))
    assert read.reply.text == TEXT and read.reply.message() == Message.assistant(TEXT)


def test_a_broken_stream_is_continued_from_its_salvage(
        make_app: Callable[..., perdure.App], server: ScriptedServer) -> None:
    """The connection drops after 4 chunks; the next attempt records ``continue`` and
    asks the model to go on from the salvaged text (which the server hears); the reply
    holds both parts joined."""
    app = make_app()
    server.script(ScriptedReply(text=TEXT, chunk_chars=4, drop_after=4),
                  ScriptedReply(text=" And done."))
    streamer(app, server)
    salvaged = TEXT[:16]
    assert finish(app, server) == {"text": salvaged + " And done.", "finish": "stop"}
    [failed] = bodies(app, "s-1", "model_failed")
    assert failed["failure"]["kind"] == "transient" and failed["chunks"] == 4
    [recovered] = bodies(app, "s-1", "model_recovered")
    assert recovered["recovery"] == "continue" and recovered["chars"] == len(salvaged)
    assert recovered["attempt"] == 2 and recovered["lost_usage"]["output_tokens"] > 0
    continuation = server.requests[1].body["messages"]
    assert continuation[-2] == {"role": "assistant", "content": salvaged}
    assert continuation[-1]["role"] == "user"  # asking it to go on
    [call] = model_records(app, "s-1")
    assert call["recovery"] == {"recovery": "continue", "chunks": 4}
    assert call["request"]["prefix"] == {"streamed": 1}  # the salvage, held once
    assert _replies(call) == [{"role": "assistant", "streamed": 2}]  # prefix + its chunks
    [read] = recorded_calls(app.history("s-1"))
    assert read.reply.text == salvaged + " And done." and read.request.prefix == salvaged


def test_a_broken_stream_is_restarted_under_the_restart_policy(
        make_app: Callable[..., perdure.App], server: ScriptedServer) -> None:
    """``restart`` sends the request again from scratch and records the lost attempt's
    estimated usage as in doubt."""
    app = make_app()
    server.script(ScriptedReply(text=TEXT, chunk_chars=4, drop_after=3),
                  ScriptedReply(text="Fresh."))
    streamer(app, server, recovery="restart")
    assert finish(app, server) == {"text": "Fresh.", "finish": "stop"}
    [recovered] = bodies(app, "s-1", "model_recovered")
    assert recovered["recovery"] == "restart" and recovered["policy"] == "restart"
    assert server.requests[1].body["messages"] == server.requests[0].body["messages"]
    assert app.usage("s-1").in_doubt_tokens > 0


def test_a_broken_stream_is_surfaced_under_the_surface_policy(
        make_app: Callable[..., perdure.App], server: ScriptedServer) -> None:
    """``surface`` calls nobody again: the agent gets the partial text, marked
    ``interrupted``."""
    app = make_app()
    server.script(ScriptedReply(text=TEXT, chunk_chars=4, drop_after=3))
    streamer(app, server, recovery="surface")
    assert finish(app, server) == {"text": TEXT[:12], "finish": "interrupted"}
    assert len(server.requests) == 1
    [call] = model_records(app, "s-1")
    assert call["recovery"]["recovery"] == "surface"
    assert _replies(call) == [{"role": "assistant", "streamed": 1}]  # the salvage's chunks
    [read] = recorded_calls(app.history("s-1"))
    assert read.reply.text == TEXT[:12]
