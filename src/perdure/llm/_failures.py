"""Why a model call failed, and whether trying again can help: pure classification.

Provider SDK retries are off; perdure decides. From an SDK exception (or an HTTP status,
headers and error body) ``classify_exception`` / ``classify_status`` give a
``CallFailure``:

- ``rate_limited``: 429 (except an exhausted quota), with the delay the provider asked
  for in ``retry-after-ms``, ``retry-after`` seconds or a ``retry-after`` HTTP date;
- ``transient``: 408, 409, 5xx (and 529), connection errors, timeouts, a stream that
  broke, an ``overloaded``/``api_error`` event in a stream; retried with semantic
  backoff (``error_class`` is what ``perdure.core.backoff.next_delay`` reads);
- ``permanent``: 400, 401, 403, 404, 413, 422 and other 4xx, a content-policy refusal,
  an exhausted quota; trying again cannot help;
- ``in_doubt``: a stream that had started for a *stateful* request (Responses API with
  ``store=True`` or a ``previous_response_id``) broke: the provider may hold a response
  we never saw, so the call is never silently repeated.

``x-should-retry: true`` makes any status retryable and ``x-should-retry: false`` makes
it permanent, as the provider says. Functions take ``now`` (for HTTP-date delays) rather
than reading a clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from enum import StrEnum
from typing import Any

from perdure.core.backoff import ErrorClass
from perdure.errors import PerdureError
from perdure.llm._reply import ModelReply

__all__ = [
    "CallFailure",
    "FailureKind",
    "ModelCallError",
    "broken_stream",
    "classify_exception",
    "classify_status",
    "parse_retry_after",
    "reply_failure",
]


class FailureKind(StrEnum):
    """What a failure means for trying again."""

    RATE_LIMITED = "rate_limited"
    TRANSIENT = "transient"
    PERMANENT = "permanent"
    IN_DOUBT = "in_doubt"


@dataclass(frozen=True, slots=True)
class CallFailure:
    """A classified failure: its kind, the backoff class, the HTTP status (if any), the
    delay the provider asked for (seconds), the provider's error type or code, and a
    short reason for people."""

    kind: FailureKind
    error_class: ErrorClass
    reason: str
    status: int | None = None
    retry_after: float | None = None
    code: str | None = None
    detail: str | None = None

    @property
    def retryable(self) -> bool:
        """Whether calling again may succeed (rate limited or transient)."""
        return self.kind in (FailureKind.RATE_LIMITED, FailureKind.TRANSIENT)

    def to_json(self) -> dict[str, Any]:
        """The JSON form, for memory."""
        out: dict[str, Any] = {"kind": str(self.kind), "error_class": str(self.error_class),
                               "reason": self.reason}
        for name in ("status", "retry_after", "code", "detail"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return dict(sorted(out.items()))  # keys in memory's order: held as a plain object

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> CallFailure:
        """Rebuild from ``to_json()``."""
        return cls(FailureKind(value["kind"]), ErrorClass(value["error_class"]),
                   str(value["reason"]), value.get("status"), value.get("retry_after"),
                   value.get("code"), value.get("detail"))


class ModelCallError(PerdureError):
    """A model call failed; ``failure`` says whether and when to try again.

    ``partial`` holds the text a stream delivered before it broke and ``chunks`` how many
    chunks that was. ``error_class`` and ``retry_after`` are what perdure's step retry
    reads, so a model call made inside ``run.step`` backs off as the provider asked; the
    failure is kept as JSON (``failure_json``), so a step's failure record holds all of
    it and the error rebuilt from memory is the same.
    """

    def __init__(self, failure: CallFailure, *, model: str = "", provider: str = "",
                 partial: str = "", chunks: int = 0) -> None:
        # kept as JSON, so that a step failure record holds it and rebuilds it
        self.failure_json = failure.to_json()
        self.model = model
        self.provider = provider
        self.partial = partial
        self.chunks = chunks
        what = {
            FailureKind.RATE_LIMITED: "rate limited; retry after the delay it asked for",
            FailureKind.TRANSIENT: "transient; retrying may succeed",
            FailureKind.PERMANENT: "permanent; fix the request, key or model before retrying",
            FailureKind.IN_DOUBT: "in doubt: a stateful request may have reached the "
                                  "provider (a stream broke after it started, or its "
                                  "worker died while it was in flight); the provider may "
                                  "hold a response, so it is not repeated",
        }[failure.kind]
        super().__init__(f"model call to {model or '?'} via {provider or '?'} failed: "
                         f"{failure.reason} ({what})")

    @property
    def failure(self) -> CallFailure:
        """The classified failure."""
        return CallFailure.from_json(self.failure_json)

    @property
    def error_class(self) -> ErrorClass:
        """The backoff class (read by ``perdure.core.backoff.classify``)."""
        return self.failure.error_class

    @property
    def retry_after(self) -> float | None:
        """Seconds the provider asked to wait, if it said."""
        return self.failure.retry_after


def parse_retry_after(headers: Mapping[str, str], now: datetime) -> float | None:
    """Seconds to wait from ``retry-after-ms``, else ``retry-after`` (seconds or an
    HTTP date, measured from ``now``); ``None`` when neither is there or readable.
    Header names are matched without regard to case."""
    lowered = {k.lower(): v for k, v in headers.items()}
    raw_ms = lowered.get("retry-after-ms")
    if raw_ms is not None:
        try:
            ms = float(raw_ms)
        except ValueError:
            ms = -1.0
        if 0 <= ms < float("inf"):
            return ms / 1000.0
    raw = lowered.get("retry-after")
    if raw is None:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        pass
    else:
        return seconds if 0 <= seconds < float("inf") else None
    try:
        when = parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    base = now if now.tzinfo is not None else now.replace(tzinfo=UTC)
    return max(0.0, (when - base).total_seconds())


def _error_info(body: object) -> tuple[str | None, str | None, str | None]:
    """The provider's error ``type``, ``code`` and message from an error body in any
    dialect (the message cut to 300 characters)."""
    if isinstance(body, Mapping):
        inner = body.get("error")
        if isinstance(inner, Mapping):
            body = inner
        kind, code, message = body.get("type"), body.get("code"), body.get("message")
        return (str(kind) if kind is not None else None,
                str(code) if code is not None else None,
                str(message)[:300] if message else None)
    return None, None, None


# in an error's type, code or message (spaces read as underscores): a content-policy
# refusal ("Output blocked by content filtering policy", "content_policy_violation")
_POLICY_WORDS = ("content_policy", "content_filter", "policy_violation")
_TRANSIENT_TYPES = {"overloaded_error", "api_error", "server_error", "timeout_error"}
# httpx's transport errors (by name: any httpx major version), which an SDK may let
# through while a stream is read
_TRANSPORT_ERRORS = {"TransportError", "NetworkError", "ProtocolError", "StreamError"}
_RATE_TYPES = {"rate_limit_error", "rate_limit_exceeded"}
_PERMANENT_TYPES = {"invalid_request_error", "authentication_error", "permission_error",
                    "not_found_error", "request_too_large", "billing_error"}


def _stream_state(failure: CallFailure, stream_started: bool, stateful: bool) -> CallFailure:
    if stream_started and stateful:
        return CallFailure(FailureKind.IN_DOUBT, ErrorClass.PERMANENT,
                           f"stateful stream broke after it started: {failure.reason}",
                           failure.status, None, failure.code, failure.detail)
    return failure


def classify_status(status: int, headers: Mapping[str, str], body: object = None, *,
                    now: datetime, stream_started: bool = False,
                    stateful: bool = False) -> CallFailure:
    """Classify an HTTP error answer (status, headers, decoded error body if any).

    ``stream_started``/``stateful``: the answer ended a stream that had already delivered
    output for a stateful request, which makes it ``in_doubt``.
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    delay = parse_retry_after(lowered, now)
    kind, code, message = _error_info(body)
    label = code or kind
    should = lowered.get("x-should-retry", "").strip().lower()
    words = f"{kind or ''} {code or ''} {message or ''}".lower().replace(" ", "_")
    if should == "false":
        failure = CallFailure(FailureKind.PERMANENT, ErrorClass.PERMANENT,
                              f"HTTP {status}; the provider said x-should-retry: false",
                              status, None, label)
    elif status == 429 and "insufficient_quota" not in words:
        failure = CallFailure(FailureKind.RATE_LIMITED, ErrorClass.RATE_LIMITED,
                              "HTTP 429 rate limited", status, delay, label)
    elif 400 <= status < 500 and any(w in words for w in _POLICY_WORDS):
        failure = CallFailure(FailureKind.PERMANENT, ErrorClass.PERMANENT,
                              f"HTTP {status} content policy refusal", status, None, label)
    elif should == "true" or status in (408, 409) or status >= 500:
        error_class = (ErrorClass.TIMEOUT if status in (408, 504) else ErrorClass.TRANSIENT)
        failure = CallFailure(FailureKind.TRANSIENT, error_class,
                              f"HTTP {status} {kind or 'transient error'}", status, delay,
                              label)
    elif status == 429:
        failure = CallFailure(FailureKind.PERMANENT, ErrorClass.PERMANENT,
                              "HTTP 429 quota exhausted (insufficient_quota)", status, None,
                              label)
    else:
        failure = CallFailure(FailureKind.PERMANENT, ErrorClass.PERMANENT,
                              f"HTTP {status} {kind or 'client error'}", status, None, label)
    if message:
        failure = replace(failure, detail=message)
    return _stream_state(failure, stream_started, stateful)


def _headers_of(exc: BaseException) -> dict[str, str]:
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return {}
    try:
        return {str(k): str(v) for k, v in headers.items()}
    except (AttributeError, TypeError):
        return {}


def classify_exception(exc: BaseException, *, now: datetime, stream_started: bool = False,
                       stateful: bool = False) -> CallFailure:
    """Classify an exception raised by the ``openai`` or ``anthropic`` SDK (read by its
    attributes, so any version of either works), or a plain connection or timeout error.

    An error event inside a stream (status 200 with an error body) is classified by the
    error type it names; anything unrecognised is transient with the ``unknown`` backoff
    class (tried again at the base pace, a bounded number of times).
    """
    if isinstance(exc, ModelCallError):
        return exc.failure
    status = getattr(exc, "status_code", None)
    body = getattr(exc, "body", None)
    if isinstance(status, int) and status >= 400:
        return classify_status(status, _headers_of(exc), body, now=now,
                               stream_started=stream_started, stateful=stateful)
    name = type(exc).__name__.lower()
    lineage = {cls.__name__ for cls in type(exc).__mro__}
    kind, code, message = _error_info(body)
    if kind is not None and (kind in _TRANSIENT_TYPES or kind in _PERMANENT_TYPES
                             or kind in _RATE_TYPES):
        synthetic = 429 if kind in _RATE_TYPES else 500 if kind in _TRANSIENT_TYPES else 400
        failure = classify_status(synthetic, {}, body, now=now)
        failure = CallFailure(failure.kind, failure.error_class,
                              f"error event in the stream: {kind}", None, None,
                              code or kind, message)
    elif isinstance(exc, TimeoutError) or "timeout" in name or "TimeoutException" in lineage:
        failure = CallFailure(FailureKind.TRANSIENT, ErrorClass.TIMEOUT, "timed out")
    elif (isinstance(exc, ConnectionError | OSError) or "connection" in name
          or lineage & _TRANSPORT_ERRORS):
        failure = CallFailure(FailureKind.TRANSIENT, ErrorClass.TRANSIENT,
                              "connection error")
    else:
        failure = CallFailure(FailureKind.TRANSIENT, ErrorClass.UNKNOWN,
                              f"unexpected {type(exc).__name__}")
    return _stream_state(failure, stream_started, stateful)


def broken_stream(reason: str, *, stateful: bool) -> CallFailure:
    """A stream that had started and then broke or ended early: transient (the text it
    delivered can be continued), or in doubt for a stateful request."""
    failure = CallFailure(FailureKind.TRANSIENT, ErrorClass.TRANSIENT, reason)
    return _stream_state(failure, True, stateful)


def reply_failure(reply: ModelReply) -> CallFailure | None:
    """A reply the model refused on content policy (finish reason ``content_filter``) as
    a permanent failure; ``None`` for any other reply (a proposal to decide on)."""
    if reply.finish_reason == "content_filter":
        return CallFailure(FailureKind.PERMANENT, ErrorClass.PERMANENT,
                           "content policy refusal", None, None, "content_filter")
    return None
