"""Failure classification, pure: statuses, retry-after, x-should-retry, streams in doubt."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from perdure.core.backoff import ErrorClass, classify
from perdure.llm import (
    CallFailure,
    FailureKind,
    ModelCallError,
    ModelReply,
    broken_stream,
    classify_exception,
    classify_status,
    parse_retry_after,
    reply_failure,
)

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(("headers", "expected"), [
    ({"retry-after-ms": "1500"}, 1.5),
    ({"Retry-After-Ms": "250.5"}, 0.2505),
    ({"retry-after": "7"}, 7.0),
    ({"retry-after": "0.5"}, 0.5),
    ({"retry-after-ms": "200", "retry-after": "9"}, 0.2),
    ({"retry-after-ms": "soon", "retry-after": "9"}, 9.0),
    ({"retry-after": "Sun, 01 Mar 2026 12:00:30 GMT"}, 30.0),
    ({"retry-after": "Sun, 01 Mar 2026 11:00:00 GMT"}, 0.0),
    ({"retry-after": "-3"}, None),
    ({"retry-after": "whenever"}, None),
    ({}, None),
])
def test_retry_after(headers: dict[str, str], expected: float | None) -> None:
    """``retry-after-ms`` first, then ``retry-after`` as seconds or an HTTP date (a date
    in the past is no wait); unreadable values are no hint."""
    assert parse_retry_after(headers, NOW) == expected


@pytest.mark.parametrize(("status", "kind", "error_class"), [
    (429, FailureKind.RATE_LIMITED, ErrorClass.RATE_LIMITED),
    (408, FailureKind.TRANSIENT, ErrorClass.TIMEOUT),
    (409, FailureKind.TRANSIENT, ErrorClass.TRANSIENT),
    (500, FailureKind.TRANSIENT, ErrorClass.TRANSIENT),
    (502, FailureKind.TRANSIENT, ErrorClass.TRANSIENT),
    (503, FailureKind.TRANSIENT, ErrorClass.TRANSIENT),
    (504, FailureKind.TRANSIENT, ErrorClass.TIMEOUT),
    (529, FailureKind.TRANSIENT, ErrorClass.TRANSIENT),
    (400, FailureKind.PERMANENT, ErrorClass.PERMANENT),
    (401, FailureKind.PERMANENT, ErrorClass.PERMANENT),
    (403, FailureKind.PERMANENT, ErrorClass.PERMANENT),
    (404, FailureKind.PERMANENT, ErrorClass.PERMANENT),
    (413, FailureKind.PERMANENT, ErrorClass.PERMANENT),
    (422, FailureKind.PERMANENT, ErrorClass.PERMANENT),
])
def test_status_classes(status: int, kind: FailureKind, error_class: ErrorClass) -> None:
    """Each status gets its kind and backoff class."""
    failure = classify_status(status, {}, now=NOW)
    assert (failure.kind, failure.error_class, failure.status) == (kind, error_class, status)
    assert failure.retryable == (kind in (FailureKind.RATE_LIMITED, FailureKind.TRANSIENT))


def test_rate_limit_carries_the_delay() -> None:
    """A 429's delay is the provider's; a 503 with retry-after keeps it too."""
    assert classify_status(429, {"retry-after": "12"}, now=NOW).retry_after == 12.0
    assert classify_status(503, {"retry-after-ms": "800"}, now=NOW).retry_after == 0.8
    assert classify_status(429, {}, now=NOW).retry_after is None


def test_should_retry_header_wins() -> None:
    """``x-should-retry: true`` makes a 400 transient; ``false`` makes a 503 or a 429
    permanent."""
    assert classify_status(400, {"x-should-retry": "true"}, now=NOW).kind is \
        FailureKind.TRANSIENT
    assert classify_status(503, {"X-Should-Retry": "false"}, now=NOW).kind is \
        FailureKind.PERMANENT
    assert classify_status(429, {"x-should-retry": "false"}, now=NOW).kind is \
        FailureKind.PERMANENT


@pytest.mark.parametrize("body", [
    {"error": {"message": "flagged", "type": "invalid_request_error",
               "code": "content_policy_violation"}},
    {"error": {"message": "filtered", "type": "content_filter", "code": None}},
])
def test_content_policy_is_permanent(body: dict[str, object]) -> None:
    """A content-policy refusal is permanent, with the provider's code and message."""
    failure = classify_status(400, {}, body, now=NOW)
    assert failure.kind is FailureKind.PERMANENT
    assert "content policy" in failure.reason
    assert failure.detail in ("flagged", "filtered")


def test_exhausted_quota_is_not_a_rate_limit() -> None:
    """OpenAI's 429 ``insufficient_quota`` cannot be waited out: permanent."""
    body = {"error": {"type": "insufficient_quota", "code": "insufficient_quota",
                      "message": "You exceeded your current quota"}}
    assert classify_status(429, {"retry-after": "1"}, body, now=NOW).kind is \
        FailureKind.PERMANENT


def test_stateful_stream_that_started_is_in_doubt() -> None:
    """A failure after a stateful stream started is in doubt, whatever it was; before it
    started, or for a stateless request, it keeps its kind."""
    started = classify_status(500, {}, now=NOW, stream_started=True, stateful=True)
    assert started.kind is FailureKind.IN_DOUBT and not started.retryable
    assert classify_status(500, {}, now=NOW, stream_started=False, stateful=True).kind is \
        FailureKind.TRANSIENT
    assert classify_status(500, {}, now=NOW, stream_started=True, stateful=False).kind is \
        FailureKind.TRANSIENT
    assert classify_exception(ConnectionResetError(), now=NOW, stream_started=True,
                              stateful=True).kind is FailureKind.IN_DOUBT
    assert broken_stream("cut", stateful=True).kind is FailureKind.IN_DOUBT
    assert broken_stream("cut", stateful=False).kind is FailureKind.TRANSIENT


class FakeRateLimitError(Exception):
    """Shaped like an SDK status error: ``status_code``, ``body``, ``response.headers``."""

    def __init__(self) -> None:
        super().__init__("rate limited")
        self.status_code = 429
        self.body = {"type": "error", "error": {"type": "rate_limit_error",
                                                "message": "slow down"}}
        self.response = type("R", (), {"headers": {"retry-after": "3"}})()


class APIConnectionError(Exception):
    """Named like the SDKs' connection error."""


class RemoteProtocolError(Exception):
    """Named like httpx's, but without its lineage: not recognised (unknown)."""


class TransportError(Exception):
    """Named like httpx's base transport error."""


class ReadError(TransportError):
    """A subclass, found through the class lineage."""


@pytest.mark.parametrize(("exc", "kind", "error_class"), [
    (FakeRateLimitError(), FailureKind.RATE_LIMITED, ErrorClass.RATE_LIMITED),
    (TimeoutError(), FailureKind.TRANSIENT, ErrorClass.TIMEOUT),
    (ConnectionResetError(), FailureKind.TRANSIENT, ErrorClass.TRANSIENT),
    (APIConnectionError(), FailureKind.TRANSIENT, ErrorClass.TRANSIENT),
    (ReadError(), FailureKind.TRANSIENT, ErrorClass.TRANSIENT),
    (RemoteProtocolError(), FailureKind.TRANSIENT, ErrorClass.UNKNOWN),
    (KeyError("x"), FailureKind.TRANSIENT, ErrorClass.UNKNOWN),
])
def test_exceptions(exc: BaseException, kind: FailureKind, error_class: ErrorClass) -> None:
    """Exceptions are read by their attributes and class names (any SDK version)."""
    failure = classify_exception(exc, now=NOW)
    assert (failure.kind, failure.error_class) == (kind, error_class)


def test_error_event_in_a_stream() -> None:
    """An error event (status 200, an error body) is classified by its error type."""
    exc = Exception("overloaded")
    exc.status_code = 200  # type: ignore[attr-defined]
    exc.body = {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}  # type: ignore[attr-defined]
    failure = classify_exception(exc, now=NOW)
    assert failure.kind is FailureKind.TRANSIENT and failure.code == "overloaded_error"
    exc.body = {"error": {"type": "invalid_request_error", "message": "bad"}}  # type: ignore[attr-defined]
    assert classify_exception(exc, now=NOW).kind is FailureKind.PERMANENT


def test_model_call_error_feeds_the_step_retry() -> None:
    """``ModelCallError`` carries ``error_class`` and ``retry_after``: what perdure's step
    retry reads, so a model call inside ``run.step`` backs off as the provider asked."""
    failure = classify_status(429, {"retry-after": "4"}, now=NOW)
    error = ModelCallError(failure, model="m", provider="openai.chat", partial="ab", chunks=2)
    assert classify(error) is ErrorClass.RATE_LIMITED
    assert error.retry_after == 4.0
    assert "rate limited" in str(error) and "m" in str(error)
    assert classify_exception(error, now=NOW) == failure


def test_failure_json_round_trip() -> None:
    """A failure round-trips through its JSON form."""
    failure = classify_status(429, {"retry-after": "2"}, {"error": {"message": "x",
                                                                    "code": "rl"}}, now=NOW)
    assert CallFailure.from_json(failure.to_json()) == failure


def test_refusal_reply_is_a_permanent_failure() -> None:
    """A reply finished by the content filter is a permanent failure; others are not."""
    refused = reply_failure(ModelReply(text="I can't", finish_reason="content_filter"))
    assert refused is not None and refused.kind is FailureKind.PERMANENT
    assert reply_failure(ModelReply(text="ok")) is None


def test_http_date_is_measured_from_now() -> None:
    """The same HTTP date gives a shorter wait later on."""
    header = {"retry-after": "Sun, 01 Mar 2026 12:01:00 GMT"}
    assert parse_retry_after(header, NOW) == 60.0
    assert parse_retry_after(header, NOW + timedelta(seconds=45)) == 15.0
