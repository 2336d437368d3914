"""Emitted events: ``run.emit`` writes each once; ``Handle.stream``/``astream`` and
``perdure tail --follow`` deliver them with model tokens in order, each exactly once,
across a worker SIGKILLed mid-run (emits before the crash delivered once, replayed
emits not delivered again). Both stores, a real worker subprocess."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import perdure
from perdure.follow import StreamEvent
from tests.integration.engine_support import REPO_ROOT, count_lines, kill_process, wait_until
from tests.integration.steer_support import register, start_steer_worker

EXPECTED = [("started", {"of": 3}), ("progress", {"done": 1, "total": 1}),
            ("progress", {"done": 2}), ("progress", {"done": 3, "total": 3})]


def _emitted(events: list[StreamEvent]) -> list[tuple[str | None, object]]:
    return [(e.name, e.data) for e in events if e.kind == "emitted"]


def test_emitted_events_reach_followers_once_across_a_sigkill(
        make_app: Callable[..., perdure.App], store_url: str, key_dir: Path,
        tmp_path: Path) -> None:
    app = register(make_app())
    marks = str(tmp_path / "marks")
    handle = app.options(object_id="emit-1").start("emitter", marks, 30.0)
    seen: list[StreamEvent] = []
    stop = threading.Event()
    follower = threading.Thread(
        target=lambda: seen.extend(handle.stream(timeout=60, stop=stop)), daemon=True)
    follower.start()
    log = tmp_path / "worker.log"
    proc = start_steer_worker(store_url, key_dir, log)
    try:
        # The blocking step runs: two events are out, the kill comes mid-step.
        assert wait_until(lambda: count_lines(marks) == 1, timeout=20), log.read_text()
        assert wait_until(lambda: len(_emitted(seen)) == 2, timeout=10)
    finally:
        kill_process(proc)
    with app.background_worker():
        assert handle.result(timeout=30) == 3
    follower.join(timeout=20)
    assert not follower.is_alive()
    assert count_lines(marks) == 2  # the step ran again after the kill
    assert _emitted(seen) == EXPECTED  # each once, in order
    assert [e.seq for e in seen] == sorted({e.seq for e in seen})
    assert seen[-1].ended
    emitted = [r for r in app.history("emit-1") if r.kind == "emitted"]
    assert len(emitted) == 4  # replay wrote none again
    # A follower starting afterwards, or going on from a seq, sees the same.
    assert _emitted(list(handle.stream())) == EXPECTED
    assert _emitted(list(handle.stream(after=emitted[1].seq))) == EXPECTED[2:]

    async def collect() -> list[StreamEvent]:
        return [event async for event in handle.astream()]

    assert _emitted(asyncio.run(collect())) == EXPECTED
    assert app.verify("emit-1").ok


def test_perdure_tail_follows_emitted_events(make_app: Callable[..., perdure.App],
                                             store_url: str, key_dir: Path,
                                             tmp_path: Path) -> None:
    app = register(make_app())
    marks = str(tmp_path / "marks")
    mark_first = tmp_path / "marks"
    mark_first.write_text("ran\n")  # the blocking step does not block
    app.options(object_id="emit-tail").start("emitter", marks, 0.0)
    tail = subprocess.Popen(
        [sys.executable, "-m", "perdure", "--store", store_url, "--key-dir", str(key_dir),
         "tail", "emit-tail", "--follow", "--json", "--timeout", "60"],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    with app.background_worker():
        assert app.handle("emit-tail").result(timeout=20) == 3
    out, errors = tail.communicate(timeout=60)
    assert tail.returncode == 0, errors
    docs = [json.loads(line) for line in out.decode().splitlines()]
    assert [(d["name"], d["data"]) for d in docs if d["kind"] == "emitted"] == EXPECTED
    assert docs[-1]["kind"] == "terminated"
    plain = subprocess.run(
        [sys.executable, "-m", "perdure", "--store", store_url, "--key-dir", str(key_dir),
         "tail", "emit-tail"], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert "emitted 'progress' {\"done\": 2}" in plain.stdout


def test_emit_checks_its_input(make_app: Callable[..., perdure.App]) -> None:
    app = make_app()

    @app.agent(name="bad_emitter")
    async def bad_emitter(run: perdure.Run) -> list[str]:
        errors = []
        for name, data in (("", 1), ("ok", object()), ("ok", float("inf"))):
            try:
                await run.emit(name, data)
            except (perdure.ConfigurationError, perdure.SerializationError) as exc:
                errors.append(type(exc).__name__)
        await run.emit("fine", [1, "two"])
        return errors

    @app.agent(name="sync_emitter")
    def sync_emitter(run: perdure.SyncRun) -> str:
        run.emit("hello", {"from": "sync"})
        return "ok"

    with app.background_worker():
        assert app.options(object_id="b").start(bad_emitter).result(timeout=10) == [
            "ConfigurationError", "SerializationError", "SerializationError"]
        assert app.options(object_id="s").start(sync_emitter).result(timeout=10) == "ok"
    assert [(e.name, e.data) for e in app.handle("b").stream()
            if e.kind == "emitted"] == [("fine", [1, "two"])]
    assert [e.data for e in app.handle("s").stream() if e.kind == "emitted"] == [
        {"from": "sync"}]


def test_emitted_events_and_model_tokens_come_in_one_ordered_stream(
        make_app: Callable[..., perdure.App]) -> None:
    """A streamed model call between two emits: a follower gets the emit, the reply's
    text as its batches were journaled, the model call, then the second emit, in memory
    order, through the real SDK and the scripted server."""
    import pytest

    pytest.importorskip("openai")
    from perdure.llm import ChatCompletionsClient, Message
    from perdure.llm.scripted import ScriptedReply, ScriptedServer

    app = make_app()

    @app.agent(name="narrator")
    async def narrator(run: perdure.Run, base_url: str) -> str:
        client = ChatCompletionsClient(base_url=base_url, api_key=lambda: "test")
        try:
            await run.emit("phase", "asking")
            reply = await run.model(client, model="gpt-4o", stream=True,
                                    messages=[Message.user("Say something.")])
            await run.emit("phase", {"done": len(reply.text)})
        finally:
            await client.aclose()
        return reply.text

    text = "Durable words, streamed and kept. " * 4
    with ScriptedServer() as server:
        server.script(ScriptedReply(text=text, chunk_chars=5, chunk_delay=0.01))
        handle = app.options(object_id="narrate").start(narrator, server.openai_base_url)
        with app.background_worker():
            assert handle.result(timeout=20) == text
    events = list(handle.stream())
    kinds = [e.kind for e in events]
    first, last = kinds.index("emitted"), len(kinds) - 1 - kinds[::-1].index("emitted")
    assert events[first].data == "asking" and events[last].data == {"done": len(text)}
    between = events[first + 1:last]
    assert "".join(e.text for e in between if e.kind == "model_chunks") == text
    assert between[-1].kind == "model_call"
    assert [e.seq for e in events] == sorted(e.seq for e in events)
    assert events[-1].ended
