"""Following a stream from outside the object: ``Handle.stream`` in another thread (its
own App, as another process would have) and ``perdure tail`` in another process see each
journaled chunk once, the recovery marked once, and collect the reply's text, through a
broken connection and through a worker SIGKILLed mid-stream; a follower that starts late
or reconnects after a seq gets no chunk twice.

Real SDKs over real HTTP against the scripted server, on both stores.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.importorskip("openai")
pytest.importorskip("anthropic")

import perdure
from perdure.follow import StreamEvent
from perdure.llm import FlushPolicy, Message
from perdure.llm.scripted import ScriptedReply, ScriptedServer
from tests.integration.engine_support import REPO_ROOT, kill_process, wait_until
from tests.integration.model_support import long_stream, start_model_worker
from tests.llm.support import make_client

TIMEOUT = 30.0
TEXT = "A follower reads every word of this reply exactly once, and in order. " * 3
CHUNK_DELAY = 0.02


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    """A scripted model server on 127.0.0.1, stopped after the test."""
    with ScriptedServer() as running:
        yield running


def streamer(app: perdure.App, server: ScriptedServer, recovery: str = "continue") -> None:
    """An agent streaming one call (recovered as ``recovery`` says if it breaks) and
    returning its text."""

    @app.agent(name="streamer")
    async def stream(run: perdure.Run) -> str:
        client = make_client("chat", server)
        try:
            reply = await run.model(client, model="gpt-4o", messages=[Message.user("Go")],
                                    stream=True, recovery=recovery,
                                    flush=FlushPolicy(interval=0.03, max_tokens=1000))
        finally:
            await client.aclose()
        return reply.text


class Follower:
    """``Handle.stream`` in a thread of its own, on an App of its own."""

    def __init__(self, app: perdure.App, object_id: str, after: int = 0) -> None:
        self.events: list[StreamEvent] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(app, object_id, after))
        self.thread.start()

    def _run(self, app: perdure.App, object_id: str, after: int) -> None:
        try:
            for event in app.handle(object_id).stream(after, timeout=TIMEOUT, poll=0.01):
                self.events.append(event)
        except BaseException as exc:
            self.error = exc

    def join(self) -> list[StreamEvent]:
        """The events, once the follower ended by itself."""
        self.thread.join(TIMEOUT + 5)
        assert not self.thread.is_alive()
        if self.error is not None:
            raise self.error
        return self.events


def text_of(events: list[StreamEvent]) -> str:
    """The text of the chunk events."""
    return "".join(e.text for e in events if e.kind == "model_chunks")


def check_once(events: list[StreamEvent], recoveries: int) -> None:
    """Each record once, in order; ``recoveries`` markers; the terminal record last."""
    seqs = [e.seq for e in events]
    assert seqs == sorted(set(seqs))
    assert [e.recovery for e in events if e.kind == "model_recovered"] == [
        "continue"] * recoveries
    assert events[-1].ended


def test_a_follower_sees_a_broken_stream_once_with_its_recovery(
        make_app: Callable[..., perdure.App], server: ScriptedServer) -> None:
    """A follower started before the worker, one started mid-stream and one that
    reconnects after a seq all collect the reply's text, the recovery marked once."""
    app = make_app()
    server.script(ScriptedReply(text=TEXT, chunk_chars=4, chunk_delay=CHUNK_DELAY,
                                drop_after=20),
                  ScriptedReply(text=" The end.", chunk_chars=3, chunk_delay=CHUNK_DELAY))
    streamer(app, server)
    handle = app.options(object_id="f-1").start("streamer")
    early = Follower(make_app(), "f-1")
    with app.background_worker():
        assert wait_until(lambda: any(r.kind == "model_chunks" for r in app.history("f-1")),
                          TIMEOUT)
        late = Follower(make_app(), "f-1")
        result = handle.result(timeout=TIMEOUT)
    assert result == TEXT[:80] + " The end."
    for events in (early.join(), late.join()):
        check_once(events, 1)
        assert text_of(events) == result
    events = early.events
    cut = next(i for i, e in enumerate(events) if e.kind == "model_chunks") + 1
    resumed = list(app.handle("f-1").stream(events[cut - 1].seq, timeout=TIMEOUT))
    assert text_of(events[:cut]) + text_of(resumed) == result
    assert [e.seq for e in events[cut:]] == [e.seq for e in resumed]


@pytest.mark.parametrize("recovery", ["restart", "surface"])
def test_after_a_restart_or_a_surface_the_marker_says_what_the_text_is(
        make_app: Callable[..., perdure.App], server: ScriptedServer, recovery: str) -> None:
    """``restart``: the batches after the marker are the whole reply; ``surface``: none
    follow it, and the batches before it are the reply. Each record once; a follower
    whose ``stop`` is set ends."""
    app = make_app()
    server.script(ScriptedReply(text=TEXT, chunk_chars=4, chunk_delay=CHUNK_DELAY,
                                drop_after=10), ScriptedReply(text=TEXT, chunk_chars=4))
    streamer(app, server, recovery)
    handle = app.options(object_id="f-5").start("streamer")
    with app.background_worker():
        result = handle.result(timeout=TIMEOUT)
    events = list(make_app().handle("f-5").stream(timeout=TIMEOUT))
    seqs = [e.seq for e in events]
    assert seqs == sorted(set(seqs)) and events[-1].ended
    [marker] = [i for i, e in enumerate(events) if e.kind == "model_recovered"]
    assert events[marker].recovery == recovery
    before, after = text_of(events[:marker]), text_of(events[marker:])
    if recovery == "restart":
        assert before == TEXT[:40] and after == result == TEXT
    else:
        assert before == result == TEXT[:40] and after == ""
    stop = threading.Event()
    stop.set()
    assert [e.seq for e in handle.stream(stop=stop)] == seqs  # one read, then it stops


def test_a_follower_stops_at_the_reply_and_the_async_one_matches(
        make_app: Callable[..., perdure.App], server: ScriptedServer) -> None:
    """``until="reply"`` ends at the call's outcome; ``astream`` yields the same events;
    a follower of an object that does not end times out, naming where to go on."""
    app = make_app()
    server.script(ScriptedReply(text=TEXT, chunk_chars=8))
    streamer(app, server)
    handle = app.options(object_id="f-2").start("streamer")
    with app.background_worker():
        result = handle.result(timeout=TIMEOUT)
    to_reply = list(handle.stream(until="reply"))
    assert to_reply[-1].kind == "model_call" and text_of(to_reply) == result

    async def collect() -> list[StreamEvent]:
        return [event async for event in handle.astream(every=True)]

    every = asyncio.run(collect())
    assert [e.seq for e in every] == list(range(1, len(every) + 1))
    assert text_of(every) == result and every[-1].ended
    with pytest.raises(perdure.ResultTimeoutError, match="after="):
        list(make_app().handle(app.options(object_id="f-3").start("streamer").object_id)
             .stream(timeout=0.2))


def test_a_follower_goes_through_a_worker_killed_mid_stream(
        make_app: Callable[..., perdure.App], server: ScriptedServer, store_url: str,
        key_dir: Path, tmp_path: Path) -> None:
    """A worker process SIGKILLed mid-stream; the object resumes on another node with
    ``continue``: the follower (running throughout) and ``perdure tail`` afterwards see
    the salvaged chunks once, the recovery once, then the continuation."""
    story = "Once upon a time there was a durable agent that never lost its words. " * 4
    server.script(ScriptedReply(text=story, chunk_chars=4, chunk_delay=0.05),
                  ScriptedReply(text=" The end."))
    starter = make_app()
    starter.agent(name="long_stream")(long_stream)
    starter.options(object_id="story-1").start("long_stream", server.openai_base_url)
    follower = Follower(make_app(), "story-1")
    log = tmp_path / "worker.log"
    proc = start_model_worker(store_url, key_dir, log)
    try:
        assert wait_until(lambda: sum(r.kind == "model_chunks"
                                      for r in starter.history("story-1")) >= 5,
                          timeout=20), log.read_text()
    finally:
        kill_process(proc)
    resumer = make_app()
    resumer.agent(name="long_stream")(long_stream)
    with resumer.background_worker():
        result = resumer.handle("story-1").result(timeout=TIMEOUT)
    events = follower.join()
    check_once(events, 1)
    assert text_of(events) == result["text"]
    marker = next(i for i, e in enumerate(events) if e.kind == "model_recovered")
    assert story.startswith(text_of(events[:marker]))
    assert text_of(events[marker:]) == " The end."

    lines = tail(store_url, key_dir, "story-1").splitlines()
    assert plain_text(lines) == result["text"]
    [marked] = [line for line in lines if "model_recovered]" in line]
    assert "continue" in marked
    joined = tail(store_url, key_dir, "story-1", "--json")
    docs = [json.loads(line) for line in joined.splitlines()]
    assert "".join(d.get("text", "") for d in docs if d["kind"] == "model_chunks") == (
        result["text"])
    assert [d["recovery"] for d in docs if d["kind"] == "model_recovered"] == ["continue"]


def plain_text(lines: list[str]) -> str:
    """What ``perdure tail`` printed as stream text: the lines that are not records'."""
    return "".join(line for line in lines if not line.startswith("["))


def tail(store_url: str, key_dir: Path, *args: str) -> str:
    """``perdure tail ...`` in a process of its own: its stdout (it must exit 0)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERDURE_")}
    env.update(PYTHONPATH=str(REPO_ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "perdure", "--store", store_url, "--key-dir",
         str(key_dir), "tail", *args],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done
    return done.stdout


def test_perdure_tail_follows_a_stream_as_it_arrives(
        make_app: Callable[..., perdure.App], server: ScriptedServer, store_url: str,
        key_dir: Path) -> None:
    """``perdure tail ID --follow``, started before the object runs, prints the stream's
    text as it arrives, the other records as lines, and exits when the object ends."""
    app = make_app()
    server.script(ScriptedReply(text=TEXT, chunk_chars=4, chunk_delay=CHUNK_DELAY,
                                drop_after=10), ScriptedReply(text=" Done."))
    streamer(app, server)
    handle = app.options(object_id="f-4").start("streamer")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERDURE_")}
    env.update(PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "perdure", "--store", store_url, "--key-dir",
         str(key_dir), "tail", "f-4", "--follow", "--timeout", str(TIMEOUT)],
        cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with app.background_worker():
        result = handle.result(timeout=TIMEOUT)
    stdout, stderr = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, stderr
    lines = stdout.splitlines()
    assert lines[0].startswith("[1 instantiated]")
    assert "terminated]" in lines[-1]
    [marked] = [line for line in lines if "model_recovered]" in line]
    assert "continue" in marked
    assert plain_text(lines) == result
