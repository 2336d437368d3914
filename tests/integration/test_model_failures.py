"""``run.model`` failures are perdure's to handle: dormancy for a rate limit or a transient
failure, ``ModelCallError`` for a permanent one (the same on replay), and fallback
chains whose record says which client answered and why the others were skipped.

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
from perdure.llm import Message, ModelCallError
from perdure.llm.scripted import ScriptedFailure, ScriptedReply, ScriptedServer
from tests.integration.engine_support import wait_until
from tests.integration.test_model_calls import model_records
from tests.llm.support import make_client

TIMEOUT = 20.0
HELLO = [Message.user("Hello?")]


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    """A scripted model server on 127.0.0.1, stopped after the test."""
    with ScriptedServer() as running:
        yield running


@pytest.fixture
def backup() -> Iterator[ScriptedServer]:
    """A second scripted server: another provider to fall back to."""
    with ScriptedServer() as running:
        yield running


def bodies(app: perdure.App, object_id: str, kind: str) -> list[dict[str, Any]]:
    """The bodies of an object's records of ``kind``."""
    return [dict(r.body) for r in app.history(object_id) if r.kind == kind]


def test_a_rate_limit_makes_the_object_dormant_until_the_retry_after(
        make_app: Callable[..., perdure.App], server: ScriptedServer) -> None:
    """A 429 with ``retry-after: 1`` is recorded with the client's rest; the object is
    dormant meanwhile (no lease held, nothing sleeping) and the next attempt succeeds."""
    app = make_app()
    server.script(ScriptedFailure(429, retry_after="1"), ScriptedReply(text="Hi!"))

    @app.agent(name="limited")
    async def limited(run: perdure.Run) -> str:
        client = make_client("chat", server)
        try:
            reply = await run.model(client, model="gpt-4o", messages=HELLO)
        finally:
            await client.aclose()
        return reply.text

    handle = app.options(object_id="limited-1").start("limited")
    with app.background_worker():
        assert wait_until(lambda: app.get("limited-1").status == "dormant", TIMEOUT)
        row = app.store.get("limited-1")
        assert row is not None and row.lease_owner is None  # no node holds it meanwhile
        assert handle.result(timeout=TIMEOUT) == "Hi!"
    [failed] = bodies(app, "limited-1", "model_failed")
    assert failed["failure"]["kind"] == "rate_limited" and failed["failure"]["retry_after"] == 1
    assert not failed["final"] and failed["until"] is not None
    [dormant] = bodies(app, "limited-1", "dormant")
    assert dormant["cmd"] == "model" and dormant["wake_at"] == failed["until"]
    first, second = server.requests
    assert second.received - first.received >= 1.0
    [call] = model_records(app, "limited-1")
    assert call["attempt"] == 2 and "skipped" not in call


def test_a_transient_failure_backs_off_and_retries(make_app: Callable[..., perdure.App],
                                                   server: ScriptedServer) -> None:
    """A 500 is transient: the call rests for the retry policy's pace, then succeeds."""
    app = make_app()
    server.script(ScriptedFailure(500), ScriptedFailure(503), ScriptedReply(text="Back."))

    @app.agent(name="flaky")
    async def flaky(run: perdure.Run) -> str:
        client = make_client("anthropic", server)
        try:
            reply = await run.model(client, model="claude", messages=HELLO,
                                    retry=RetryPolicy(max_attempts=4, base=0.05))
        finally:
            await client.aclose()
        return reply.text

    handle = app.options(object_id="flaky-1").start("flaky")
    with app.background_worker():
        assert handle.result(timeout=TIMEOUT) == "Back."
    failed = bodies(app, "flaky-1", "model_failed")
    assert [f["failure"]["kind"] for f in failed] == ["transient", "transient"]
    assert [f["attempt"] for f in failed] == [1, 2]
    assert len(server.requests) == 3


def test_a_permanent_failure_reaches_the_agent_the_same_on_replay(
        make_app: Callable[..., perdure.App], server: ScriptedServer) -> None:
    """A 404 is permanent: the agent gets ``ModelCallError`` with the failure; replayed
    after a wait, it gets the same error from memory and the provider hears nothing."""
    app = make_app()
    server.script(ScriptedFailure(404, message="no such model"))

    @app.agent(name="lost")
    async def lost(run: perdure.Run) -> list[Any]:
        client = make_client("responses", server)
        try:
            await run.model(client, model="gpt-9", messages=HELLO)
        except ModelCallError as exc:
            seen = [str(exc), exc.failure.to_json()]
        finally:
            await client.aclose()
        await run.wait_for("go")
        return seen

    handle = app.options(object_id="lost-1").start("lost")
    with app.background_worker():
        assert wait_until(lambda: app.get("lost-1").waiting_event == "go", TIMEOUT)
        app.send("lost-1", "go")
        message, failure = handle.result(timeout=TIMEOUT)
    assert failure["kind"] == "permanent" and failure["status"] == 404
    assert "gpt-9" in message and failure["detail"] == "no such model"
    [failed] = bodies(app, "lost-1", "model_failed")
    assert failed["final"] and failed["until"] is None and failed["failure"] == failure
    assert len(server.requests) == 1


def test_a_fallback_answers_when_the_first_client_is_rate_limited_past_the_bound(
        make_app: Callable[..., perdure.App], server: ScriptedServer,
        backup: ScriptedServer) -> None:
    """The first client is rate limited for 60 s, longer than ``wait_up_to``: the next
    one is asked at once, under its own model, and the reply's record says which client
    answered and why the first was skipped."""
    app = make_app()
    server.script(ScriptedFailure(429, retry_after="60"))
    backup.script(ScriptedReply(text="From the backup."))

    @app.agent(name="chain")
    async def chain(run: perdure.Run) -> str:
        primary = make_client("chat", server)
        secondary = make_client("anthropic", backup)
        try:
            reply = await run.model([primary, (secondary, "claude-backup")], model="gpt-4o",
                                    messages=HELLO, wait_up_to=5.0)
        finally:
            await primary.aclose()
            await secondary.aclose()
        return reply.text

    handle = app.options(object_id="chain-1").start("chain")
    with app.background_worker():
        assert handle.result(timeout=TIMEOUT) == "From the backup."
    [call] = model_records(app, "chain-1")
    assert call["client"] == 1 and call["provider"] == "anthropic"
    assert call["request"]["model"] == "claude-backup"
    [skipped] = call["skipped"]
    assert skipped["client"] == 0 and skipped["provider"] == "openai.chat"
    assert "429" in skipped["reason"] and skipped["until"] is not None
    assert backup.requests[0].body["model"] == "claude-backup"
    assert not bodies(app, "chain-1", "dormant")


def test_a_fallback_that_gave_up_is_skipped_and_the_last_failure_is_final(
        make_app: Callable[..., perdure.App], server: ScriptedServer,
        backup: ScriptedServer) -> None:
    """A 401 on the first client (permanent: it gave up) passes the call to the next;
    when that one fails for good too, the agent gets its ``ModelCallError``."""
    app = make_app()
    server.script(ScriptedFailure(401, message="bad key"))
    backup.script(ScriptedFailure(400, message="bad request"))

    @app.agent(name="doomed")
    async def doomed(run: perdure.Run) -> dict[str, Any]:
        first, second = make_client("chat", server), make_client("chat", backup)
        try:
            await run.model([first, second], model="gpt-4o", messages=HELLO)
        except ModelCallError as exc:
            return exc.failure.to_json()
        finally:
            await first.aclose()
            await second.aclose()
        return {}

    handle = app.options(object_id="doomed-1").start("doomed")
    with app.background_worker():
        failure = handle.result(timeout=TIMEOUT)
    assert failure["status"] == 400
    failed = bodies(app, "doomed-1", "model_failed")
    assert [(f["client"], f["final"]) for f in failed] == [(0, False), (1, True)]
