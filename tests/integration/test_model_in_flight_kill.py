"""A non-streamed call in flight when its worker is SIGKILLed: a stateful request
(Responses ``store=True``) is in doubt on resume, never sent again; a stateless one is
simply sent again.

A real worker subprocess, real SDK, real HTTP, the scripted server; both stores.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.importorskip("openai")
pytest.importorskip("anthropic")

import perdure
from perdure.core.bodies import decode
from perdure.core.codec import encode
from perdure.llm.scripted import ScriptedReply, ScriptedServer
from tests.integration.engine_support import kill_process, wait_until
from tests.integration.model_support import start_model_worker, stateful_call


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    """A scripted model server on 127.0.0.1, stopped after the test."""
    with ScriptedServer() as running:
        yield running


def _kill_while_in_flight(make_app: Callable[..., perdure.App], server: ScriptedServer,
                          store_url: str, key_dir: Path, log: Path, store: bool,
                          stream: bool = False) -> perdure.App:
    """Start the call in a worker process, SIGKILL it once the server holds the request
    (its answer is 30 s away), and return an App that resumes the object."""
    server.script(ScriptedReply(text="Stored.", delay=30.0),
                  ScriptedReply(text="Sent again."))
    starter = make_app()
    starter.agent(name="stateful_call")(stateful_call)
    starter.options(object_id="call-1").start(
        "stateful_call", server.openai_base_url, store, stream)
    proc = start_model_worker(store_url, key_dir, log)
    try:
        assert wait_until(lambda: len(server.requests) >= 1, timeout=20), log.read_text()
    finally:
        kill_process(proc)
    resumer = make_app()
    resumer.agent(name="stateful_call")(stateful_call)
    return resumer


@pytest.mark.parametrize("stream", [False, True])
def test_a_stateful_call_in_flight_when_its_worker_died_is_in_doubt(
        make_app: Callable[..., perdure.App], server: ScriptedServer, store_url: str,
        key_dir: Path, tmp_path: Path, stream: bool) -> None:
    """``model_started`` was committed before the request left; on resume it has no
    outcome (and, streamed, no chunk), so the call fails for good, in doubt (recorded,
    the same on replay), and the provider hears the request once."""
    resumer = _kill_while_in_flight(make_app, server, store_url, key_dir,
                                    tmp_path / "worker.log", store=True, stream=stream)
    with resumer.background_worker():
        result = resumer.handle("call-1").result(timeout=20)
    assert result["error"] == "in_doubt"
    assert "in flight" in result["reason"]
    assert len(server.requests) == 1
    kinds = [r.kind for r in resumer.history("call-1")]
    assert kinds.index("model_started") < kinds.index("model_failed")
    [failed] = [r.body for r in resumer.history("call-1") if r.kind == "model_failed"]
    assert failed["final"] and failed["failure"]["kind"] == "in_doubt"
    assert failed["attempt"] == 1 and "model_call" not in kinds
    assert resumer.verify("call-1").ok
    for rec in resumer.history("call-1"):  # each body decodes and re-encodes to its bytes
        assert encode(decode(rec).encode()) == rec.body_bytes


def test_a_stateless_call_in_flight_when_its_worker_died_is_sent_again(
        make_app: Callable[..., perdure.App], server: ScriptedServer, store_url: str,
        key_dir: Path, tmp_path: Path) -> None:
    """Without provider state nothing is marked before sending, and the resumed call
    simply asks again."""
    resumer = _kill_while_in_flight(make_app, server, store_url, key_dir,
                                    tmp_path / "worker.log", store=False)
    with resumer.background_worker():
        result = resumer.handle("call-1").result(timeout=20)
    assert result == {"text": "Sent again."}
    assert len(server.requests) == 2
    assert "model_started" not in [r.kind for r in resumer.history("call-1")]
