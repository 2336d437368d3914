"""Each failure class through each real SDK over real HTTP: SDK retries are off, and
every failure comes out as one ``ModelCallError`` that says what to do."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from perdure.core.backoff import ErrorClass
from perdure.llm import FailureKind, Message, ModelCallError, ModelParams, ModelRequest
from perdure.llm.scripted import ScriptedFailure, ScriptedReply, ScriptedServer
from tests.llm.support import KINDS, complete, make_client, run, stream

ASK = ModelRequest("gpt-4o", (Message.user("Tell me a story."),))
STORY = "Once upon a time there was a worker that never lost its place in a story."


def _fail(kind: str, server: ScriptedServer, *, streaming: bool = False,
          request: ModelRequest = ASK, **options: object) -> ModelCallError:
    client = make_client(kind, server, **options)
    with pytest.raises(ModelCallError) as caught:
        run(stream(client, request) if streaming else complete(client, request))
    return caught.value


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize(("failure", "delay"), [
    (ScriptedFailure(429, retry_after="7"), 7.0),
    (ScriptedFailure(429, retry_after_ms="1500"), 1.5),
    (ScriptedFailure(429), None),
])
def test_rate_limited_with_the_providers_delay(kind: str, streaming: bool,
                                               failure: ScriptedFailure,
                                               delay: float | None,
                                               server: ScriptedServer) -> None:
    """429 is rate limited, with the delay from ``retry-after-ms`` or ``retry-after``;
    the SDK did not retry (one request reached the server)."""
    server.script(failure)
    error = _fail(kind, server, streaming=streaming)
    assert error.failure.kind is FailureKind.RATE_LIMITED
    assert error.error_class is ErrorClass.RATE_LIMITED
    assert error.retry_after == delay
    assert len(server.requests) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_rate_limited_until_an_http_date(kind: str, server: ScriptedServer) -> None:
    """``retry-after`` as an HTTP date is a delay measured from now."""
    when = datetime.now(UTC) + timedelta(seconds=90)
    server.script(ScriptedFailure(429, retry_after=format_datetime(when, usegmt=True)))
    delay = _fail(kind, server).retry_after
    assert delay is not None and 80 < delay <= 90


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("status", "kind_of_failure"), [
    (408, FailureKind.TRANSIENT), (409, FailureKind.TRANSIENT),
    (500, FailureKind.TRANSIENT), (503, FailureKind.TRANSIENT),
    (529, FailureKind.TRANSIENT),
    (400, FailureKind.PERMANENT), (401, FailureKind.PERMANENT),
    (403, FailureKind.PERMANENT), (404, FailureKind.PERMANENT),
])
def test_status_classes(kind: str, status: int, kind_of_failure: FailureKind,
                        server: ScriptedServer) -> None:
    """408, 409 and 5xx are transient, 400, 401, 403 and 404 permanent; once each."""
    server.script(ScriptedFailure(status, message=f"status {status}"))
    error = _fail(kind, server)
    assert (error.failure.kind, error.failure.status) == (kind_of_failure, status)
    assert error.failure.detail == f"status {status}"
    assert len(server.requests) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_should_retry_header(kind: str, server: ScriptedServer) -> None:
    """``x-should-retry`` overrides the status either way."""
    server.script(ScriptedFailure(400, should_retry=True),
                  ScriptedFailure(503, should_retry=False))
    assert _fail(kind, server).failure.kind is FailureKind.TRANSIENT
    assert _fail(kind, server).failure.kind is FailureKind.PERMANENT


@pytest.mark.parametrize("kind", KINDS)
def test_content_policy_refusal_is_permanent(kind: str, server: ScriptedServer) -> None:
    """A 400 naming a content policy (by code, or in the message) is a permanent
    refusal."""
    server.script(ScriptedFailure(400, message="Output blocked by content filtering policy"
                                  if kind == "anthropic" else "flagged",
                                  code="content_policy_violation",
                                  error_type="invalid_request_error"))
    failure = _fail(kind, server).failure
    assert failure.kind is FailureKind.PERMANENT and "content policy" in failure.reason


@pytest.mark.parametrize("kind", KINDS)
def test_connection_dropped_before_an_answer(kind: str, server: ScriptedServer) -> None:
    """A connection closed without an answer is a transient connection error."""
    server.script(ScriptedReply(text=STORY, drop_after=0))
    failure = _fail(kind, server).failure
    assert (failure.kind, failure.error_class) == (FailureKind.TRANSIENT,
                                                   ErrorClass.TRANSIENT)


@pytest.mark.parametrize("kind", KINDS)
def test_timeout(kind: str, server: ScriptedServer) -> None:
    """No answer within the client's timeout is transient, with the timeout backoff."""
    server.script(ScriptedReply(text=STORY, delay=1.0))
    failure = _fail(kind, server, timeout=0.2).failure
    assert (failure.kind, failure.error_class) == (FailureKind.TRANSIENT, ErrorClass.TIMEOUT)


@pytest.mark.parametrize("kind", KINDS)
def test_stream_dropped_midway_keeps_what_arrived(kind: str, server: ScriptedServer) -> None:
    """A connection dropped after three chunks: transient, and the error holds the text
    of exactly those chunks, which were handed out before it."""
    server.script(ScriptedReply(text=STORY, chunk_chars=6, drop_after=3))
    seen: list[str] = []

    async def consume() -> None:
        client = make_client(kind, server)
        try:
            async for item in client.stream(ASK):
                seen.append(str(getattr(item, "text", "")))
        finally:
            await client.aclose()

    with pytest.raises(ModelCallError) as caught:
        run(consume())
    error = caught.value
    assert error.failure.kind is FailureKind.TRANSIENT
    assert error.partial == STORY[:18] == "".join(seen) and error.chunks == 3


@pytest.mark.parametrize("kind", KINDS)
def test_error_event_in_a_stream(kind: str, server: ScriptedServer) -> None:
    """An error event after two chunks is classified by its type (overloaded: transient)."""
    server.script(ScriptedReply(text=STORY, chunk_chars=6, error_after=2))
    error = _fail(kind, server, streaming=True)
    assert error.failure.kind is FailureKind.TRANSIENT
    assert error.failure.code == "overloaded_error" and error.partial == STORY[:12]


@pytest.mark.parametrize("kind", KINDS)
def test_stream_that_ends_early(kind: str, server: ScriptedServer) -> None:
    """A stream whose body ends cleanly before the reply is complete is not taken as a
    reply: transient, with the partial text."""
    server.script(ScriptedReply(text=STORY, chunk_chars=6, end_after=4))
    error = _fail(kind, server, streaming=True)
    assert error.failure.kind is FailureKind.TRANSIENT
    assert "before the reply was complete" in error.failure.reason
    assert error.partial == STORY[:24]


@pytest.mark.parametrize("params", [ModelParams(store=True),
                                    ModelParams(previous_response_id="resp_0")])
def test_stateful_stream_that_started_is_in_doubt(params: ModelParams,
                                                  server: ScriptedServer) -> None:
    """A Responses stream with stored state that breaks after it started is in doubt:
    not retryable, so it is never silently repeated; before it starts (a 429) it is an
    ordinary rate limit; without stored state a break is transient."""
    stateful = ModelRequest("gpt-4o", ASK.messages, params=params)
    server.script(ScriptedReply(text=STORY, drop_after=2),
                  ScriptedReply(text=STORY, end_after=2),
                  ScriptedFailure(429, retry_after="1"),
                  ScriptedReply(text=STORY, drop_after=2))
    for _ in range(2):
        error = _fail("responses", server, streaming=True, request=stateful)
        assert error.failure.kind is FailureKind.IN_DOUBT and not error.failure.retryable
    assert _fail("responses", server, streaming=True,
                 request=stateful).failure.kind is FailureKind.RATE_LIMITED
    assert _fail("responses", server, streaming=True).failure.kind is FailureKind.TRANSIENT
    assert server.requests[0].body["store"] is bool(params.store)


@pytest.mark.parametrize("kind", KINDS)
def test_slow_stream_arrives_as_it_is_written(kind: str, server: ScriptedServer) -> None:
    """Chunks written 50 ms apart arrive apart: the stream is not buffered anywhere."""
    server.script(ScriptedReply(text="a" * 30, chunk_chars=5, chunk_delay=0.05))
    arrivals: list[float] = []

    async def consume() -> None:
        client = make_client(kind, server)
        try:
            async for _ in client.stream(ASK):
                arrivals.append(time.monotonic())
        finally:
            await client.aclose()

    run(consume())
    assert len(arrivals) == 7  # six chunks and the reply
    assert arrivals[5] - arrivals[0] >= 0.2
