"""The live stream of a model call on an object's page: the dashboard's server-sent
events carry each journaled batch's text once, in order, as the real ``openai`` SDK
streams from the scripted server; the text collected is the reply. Both stores."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import closing
from typing import Any

import pytest

pytest.importorskip("openai")

import perdure
from perdure.llm import FlushPolicy, Message
from perdure.llm.scripted import ScriptedReply, ScriptedServer
from tests.llm.support import make_client
from tests.web.support import Served

pytestmark = pytest.mark.timeout(120)

TEXT = "The dashboard shows every word of this reply once, as it is written. " * 3


@pytest.fixture
def model_server() -> Iterator[ScriptedServer]:
    """A scripted model server on 127.0.0.1."""
    with ScriptedServer() as running:
        yield running


def test_the_stream_of_a_model_call(served: Served, model_server: ScriptedServer) -> None:
    app = served.app
    model_server.script(ScriptedReply(text=TEXT, chunk_chars=4, chunk_delay=0.01))

    @app.agent(name="streamer")
    async def streamer(run: perdure.Run) -> str:
        client = make_client("chat", model_server)
        try:
            reply = await run.model(client, model="gpt-4o", messages=[Message.user("Go")],
                                    stream=True, flush=FlushPolicy(interval=0.03,
                                                                   max_tokens=1000))
        finally:
            await client.aclose()
        return reply.text

    handle = app.options(object_id="talker").start("streamer")
    docs: list[dict[str, Any]] = []
    ended = threading.Event()

    with closing(served.login()) as client:
        def read() -> None:
            with client.stream("GET", "/stream", params={"id": "talker"}) as events:
                for line in events.iter_lines():
                    if line.startswith("data: {\"seq"):
                        docs.append(json.loads(line[6:]))
                    if line == "event: end":
                        ended.set()
                        return

        reader = threading.Thread(target=read)
        reader.start()
        with app.background_worker():
            result = handle.result(timeout=30)
        reader.join(30)
    assert ended.is_set() and result == TEXT
    seqs = [d["seq"] for d in docs]
    assert seqs == list(range(1, len(seqs) + 1))
    chunks = [d for d in docs if d["kind"] == "model_chunks"]
    assert len(chunks) > 1  # it arrived in pieces, as written
    assert "".join(d["text"] for d in chunks) == result
    assert any(d["kind"] == "model_call" and "tokens" in d["line"] for d in docs)
