"""The HTTP API (``/api/v1``): perdure for callers in other languages.

An ASGI application of its own (``Api``), mounted by the dashboard at ``/api/v1`` and
served alone by ``perdure api``. Every request but the OpenAPI document needs a bearer
token (``ApiTokens``) holding the scope its route needs (``read``, ``operate`` or
``approve``); every action goes through ``_actions``, as the dashboard's do, so it is
noted in the object's memory with the token's name, and a tool-call decision is signed
with this server's key and refused by the one approval policy
(``perdure.approvals.waiting_decision``).

Every answer that is not a success is a problem document (``application/problem+json``:
``type``, ``title``, ``status``, ``detail``, and ``field`` for a bad input), and a
refused request changes nothing. Routes are matched on the raw path, segment by segment,
so an object id holding ``/`` (sent as ``%2F``) reaches its own object.

No handler blocks the event loop: the App's calls run in the thread pool
(``run_in_threadpool``), and what waits (the result's long poll, the event stream) waits
on the store's pushes, handed to the loop with ``call_soon_threadsafe``, holding no
thread (the long poll is ``AsyncHandle.result``, ``app.aio``). A caller that goes away
ends its wait or stream at once, and with it its subscription (``Api.open_waits``
counts those open).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast
from urllib.parse import quote, unquote

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from perdure import describe as view
from perdure.aio import AsyncHandle
from perdure.app import App
from perdure.core.approvals import PendingApproval
from perdure.core.events import is_reserved
from perdure.core.lifecycle import Status
from perdure.core.names import check_labels, check_name, check_object_id
from perdure.core.questions import Question
from perdure.core.records import Kind
from perdure.core.sealing import sealed_shown
from perdure.core.secret import Secret
from perdure.errors import (
    AgentCancelledError,
    AgentFailedError,
    AgentParkedError,
    ApprovalError,
    ConfigurationError,
    DataKeyError,
    IntegrityError,
    NotParkedError,
    ObjectConflictError,
    ObjectNotFoundError,
    ObjectTerminatedError,
    PerdureError,
    QueryFailedError,
    RecordDecodeError,
    ResultTimeoutError,
    SerializationError,
    StoreError,
    UnknownAgentError,
    UnknownQueryError,
    UnknownUpdateError,
    UpdateFailedError,
    UpdateRefusedError,
    WebhookRefusedError,
)
from perdure.follow import StreamEvent, afollow
from perdure.handle import Handle
from perdure.info import ObjectInfo, info_from_row
from perdure.triggers import Message, Outcome, Triggers, deliver
from perdure.updates import await_reply, send_update
from perdure.web import _actions as actions
from perdure.web._auth import APPROVE, OPERATE, READ, ApiToken, ApiTokens, Principal, Throttle
from perdure.web._openapi import PREFIX, document
from perdure.web._queries import Filters, Queries

__all__ = ["Api", "ApiSettings", "object_json", "wait_for_end"]

log = logging.getLogger("perdure.web")

T = TypeVar("T")

_PROBLEM = "application/problem+json"
_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
_FILTERS = ("status", "phase", "agent", "version", "label", "parent", "node", "since",
            "until", "q")


@dataclass(frozen=True, slots=True)
class ApiSettings:
    """Limits of the API: the longest ``wait`` of a result's long poll (seconds), how
    often an idle event stream says it is alive, how many long polls and streams may be
    open at once, the largest request body, and the objects list's page sizes."""

    max_wait: float = 60.0
    keepalive: float = 15.0
    max_open: int = 256
    max_body: int = 1024 * 1024
    page_size: int = 50
    max_page: int = 200


class _Problem(Exception):  # noqa: N818 - never leaves this module: it becomes a response
    """A request the API refuses: status, short title, what went wrong, the input field."""

    def __init__(self, status: int, kind: str, title: str, detail: str,
                 field: str | None = None, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.kind = kind
        self.title = title
        self.detail = detail
        self.field = field
        self.headers = dict(headers or {})


def _invalid(field: str, detail: str) -> _Problem:
    return _Problem(422, "invalid-field", "Invalid input", detail, field)


def _default(value: Any) -> Any:
    """What JSON cannot hold as it is: a ``Secret`` is never shown, a tuple is a list."""
    if isinstance(value, Secret):
        return repr(value)
    if isinstance(value, tuple | set | frozenset):
        return list(value)
    return str(value)


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc, ensure_ascii=False, default=_default,
                      separators=(",", ":")).encode("utf-8")


def _json(doc: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return Response(_dumps(doc), status_code=status, media_type="application/json",
                    headers={**_HEADERS, **(headers or {})})


def _problem_response(problem: _Problem) -> Response:
    doc: dict[str, Any] = {"type": f"urn:perdure:problem:{problem.kind}",
                           "title": problem.title, "status": problem.status,
                           "detail": problem.detail}
    if problem.field is not None:
        doc["field"] = problem.field
    return Response(_dumps(doc), status_code=problem.status, media_type=_PROBLEM,
                    headers={**_HEADERS, **problem.headers})


def _shown(value: Any) -> Any:
    """A value read from memory, for a caller: sealed values as ``"<sealed>"``."""
    return sealed_shown(value)


# -- the documents the API answers with ------------------------------------------------------


def _question_json(q: Question) -> dict[str, Any]:
    doc = q.to_json()
    doc["prompt"] = _shown(doc["prompt"])
    doc["choices"] = None if doc["choices"] is None else _shown(doc["choices"])
    return doc


def object_json(info: ObjectInfo) -> dict[str, Any]:
    """An object as the API shows it (the ``Object`` schema)."""
    return {"object_id": info.object_id, "agent": info.agent,
            "agent_version": info.agent_version, "status": str(info.status),
            "phase": info.phase, "epoch": info.epoch, "lease_owner": info.lease_owner,
            "ready_at": info.ready_at, "waiting_event": info.waiting_event,
            "records": info.records, "note": info.note, "parent_id": info.parent_id,
            "created_at": info.created_at, "updated_at": info.updated_at,
            "requires": list(info.requires), "asking": [_question_json(q) for q in info.asking],
            "forked_from": info.forked_from, "avoid": list(info.avoid),
            "terminal": info.terminal}


def _approval_json(p: PendingApproval) -> dict[str, Any]:
    doc = p.to_json()
    doc["arguments"] = _shown(doc["arguments"])
    return doc


def _event_json(event: StreamEvent) -> dict[str, Any]:
    """One record of a stream (the ``StreamEvent`` schema)."""
    doc: dict[str, Any] = {"seq": event.seq, "kind": event.kind, "ts": event.record.ts,
                           "line": view.describe(event.record).text}
    if event.kind == "emitted":
        doc.update(name=event.name, pos=event.pos, data=_shown(event.data))
    elif event.name is not None:
        doc.update(name=event.name, pos=event.pos, attempt=event.attempt)
    if event.kind == "model_chunks":
        doc["text"] = event.text
    if event.recovery is not None:
        doc["recovery"] = event.recovery
    if event.ended:
        outcome = event.record.body.get("outcome")
        doc["outcome"] = outcome if isinstance(outcome, str) else None
    return doc


def _sse(event: StreamEvent) -> str:
    data = _dumps(_event_json(event)).decode("utf-8")
    return f"id: {event.seq}\nevent: {event.kind}\ndata: {data}\n\n"


# -- waiting without holding a thread -------------------------------------------------------


async def wait_for_end(app: App, object_id: str, timeout: float) -> ObjectInfo:
    """The object's info once it ended or was parked, or when ``timeout`` seconds have
    passed, whichever comes first; ``ObjectNotFoundError`` if there is none.

    ``AsyncHandle.result`` waits (``app.aio``): the store's push of the object's end
    wakes it, and no thread is held meanwhile. Cancelled (its caller went away), it lets
    its subscription go.
    """
    handle = AsyncHandle(app.aio, Handle(app, object_id))
    with contextlib.suppress(ResultTimeoutError, AgentFailedError, AgentCancelledError,
                             AgentParkedError):
        await handle.result(timeout)
    return await app.aio.get(object_id, explain=False)


async def _disconnected(receive: Receive) -> None:
    """Return when the client has gone (its connection closed)."""
    while (await receive())["type"] != "http.disconnect":
        pass


# -- reading a request ---------------------------------------------------------------------


class _Fields:
    """A JSON object's fields, read by name and type; a bad one is a 422 naming it."""

    def __init__(self, doc: dict[str, Any], known: tuple[str, ...]) -> None:
        unknown = sorted(set(doc) - set(known))
        if unknown:
            raise _invalid(unknown[0], f"unknown field {unknown[0]!r}; the fields are "
                                       f"{', '.join(known)}")
        self.doc = doc

    def has(self, name: str) -> bool:
        return self.doc.get(name) is not None

    def value(self, name: str, default: Any = None) -> Any:
        return self.doc.get(name, default)

    def text(self, name: str, *, required: bool = False) -> str | None:
        value = self.doc.get(name)
        if value is None:
            if required:
                raise _invalid(name, f"field {name!r} is required (a string)")
            return None
        if not isinstance(value, str):
            raise _invalid(name, f"field {name!r} must be a string, not {_kind(value)}")
        return value

    def number(self, name: str, *, above: float | None = None) -> float | None:
        value = self.doc.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(
                value):
            raise _invalid(name, f"field {name!r} must be a number, not {_kind(value)}")
        if above is not None and value <= above:
            raise _invalid(name, f"field {name!r} must be more than {above:g}")
        return float(value)

    def integer(self, name: str, *, least: int = 0) -> int | None:
        value = self.doc.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise _invalid(name, f"field {name!r} must be a whole number, not {_kind(value)}")
        if value < least:
            raise _invalid(name, f"field {name!r} must be at least {least}")
        return value

    def array(self, name: str) -> list[Any]:
        value = self.doc.get(name)
        if value is None:
            return []
        if not isinstance(value, list):
            raise _invalid(name, f"field {name!r} must be an array, not {_kind(value)}")
        return value

    def mapping(self, name: str) -> dict[str, Any] | None:
        value = self.doc.get(name)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise _invalid(name, f"field {name!r} must be an object, not {_kind(value)}")
        return value


def _kind(value: Any) -> str:
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string",
            list: "an array", dict: "an object"}.get(type(value), "null")


def _checked(field: str, check: Callable[[], T]) -> T:
    """``check()``, its ``ConfigurationError`` a 422 naming ``field``."""
    try:
        return check()
    except (ConfigurationError, ValueError) as exc:
        raise _invalid(field, str(exc)) from None


def _query_number(request: Request, name: str, default: float, *, least: float,
                  most: float) -> float:
    text = request.query_params.get(name)
    if text is None or text == "":
        return default
    try:
        value = float(text)
    except ValueError:
        raise _invalid(name, f"parameter {name!r} must be a number, not {text[:40]!r}"
                       ) from None
    if not math.isfinite(value) or not least <= value <= most:
        raise _invalid(name, f"parameter {name!r} must be between {least:g} and {most:g}")
    return value


def _query_int(request: Request, name: str, default: int, *, least: int, most: int) -> int:
    text = request.query_params.get(name)
    if text is None or text == "":
        return default
    if not text.isdigit():
        raise _invalid(name, f"parameter {name!r} must be a whole number, not {text[:40]!r}")
    value = int(text)
    if not least <= value <= most:
        raise _invalid(name, f"parameter {name!r} must be between {least} and {most}")
    return value


def _query_bool(request: Request, name: str) -> bool:
    text = request.query_params.get(name, "").lower()
    if text in ("", "false", "0"):
        return False
    if text in ("true", "1"):
        return True
    raise _invalid(name, f"parameter {name!r} must be true or false")


# -- routing --------------------------------------------------------------------------------

Handler = Callable[[Request, Principal | None, dict[str, str]], Awaitable[Response]]


@dataclass(frozen=True, slots=True)
class _Route:
    method: str
    segments: tuple[str, ...]  # "{name}" for a parameter
    scope: str | None  # None: no token needed
    handler: Handler

    @property
    def path(self) -> str:
        return "/" + "/".join(self.segments)

    def match(self, parts: list[str]) -> dict[str, str] | None:
        if len(parts) != len(self.segments):
            return None
        params: dict[str, str] = {}
        for want, got in zip(self.segments, parts, strict=True):
            if want.startswith("{"):
                if not got:
                    return None
                params[want[1:-1]] = got
            elif want != got:
                return None
        return params


class Api:
    """The HTTP API over ``app``'s store (see the module): an ASGI application."""

    def __init__(self, app: App, tokens: ApiTokens,
                 settings: ApiSettings | None = None,
                 triggers: Triggers | None = None) -> None:
        self.app = app
        #: The webhooks served at ``/hooks/{name}`` are this object's (default: the
        #: App's, ``Triggers.of(app)``).
        self.triggers = triggers if triggers is not None else Triggers.of(app)
        self.tokens = tokens
        self.settings = settings or ApiSettings()
        self.queries = Queries(app.store)
        self.throttle = Throttle(allowed=20, window=60.0)
        self._open = 0
        self._document = _dumps(document())
        oid = "{object_id}"
        self.routes = [
            _Route("GET", ("openapi.json",), None, self.openapi),
            _Route("POST", ("objects",), OPERATE, self.start),
            _Route("GET", ("objects",), READ, self.list_objects),
            _Route("GET", ("objects", oid), READ, self.get_object),
            _Route("GET", ("objects", oid, "result"), READ, self.result),
            _Route("GET", ("objects", oid, "stream"), READ, self.stream),
            _Route("POST", ("objects", oid, "events"), OPERATE, self.send),
            _Route("POST", ("objects", oid, "answer"), OPERATE, self.answer),
            *(_Route("POST", ("objects", oid, verb), OPERATE, self._control(verb))
              for verb in ("pause", "resume", "cancel", "retry")),
            _Route("POST", ("objects", oid, "queries", "{name}"), READ, self.query),
            _Route("POST", ("objects", oid, "updates", "{name}"), OPERATE, self.update),
            _Route("GET", ("questions",), READ, self.questions),
            _Route("GET", ("approvals",), READ, self.approvals),
            _Route("POST", ("objects", oid, "approvals", "{proposal_id}"), APPROVE,
                   self.decide),
            _Route("POST", ("hooks", "{name}"), None, self.webhook),
        ]

    @property
    def open_waits(self) -> int:
        """Long polls and event streams open now."""
        return self._open

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """Count a long poll or an event stream as open while the block runs."""
        self._open += 1
        try:
            yield
        finally:
            self._open -= 1

    # -- ASGI -------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":  # served alone, not mounted
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        response = await self.handle(request)
        await response(scope, receive, send)

    def _parts(self, request: Request) -> list[str] | None:
        raw = request.scope.get("raw_path")
        path = (raw.decode("latin-1") if isinstance(raw, bytes)
                else quote(request.scope.get("path", ""), safe="/%"))
        at = path.find(PREFIX)
        if at < 0:
            return None
        rest = path[at + len(PREFIX):]
        if not rest.startswith("/"):
            return None
        try:
            return [unquote(part, errors="strict") for part in rest[1:].split("/")]
        except UnicodeDecodeError:
            return None

    async def handle(self, request: Request) -> Response:
        """Answer one request (see the module)."""
        who = "-"
        try:
            route, params = self._route(request)
            principal = None
            if route.scope is not None:
                principal = await self._admit(request, route.scope)
                who = f"{principal.name} (token {principal.credential})"
            return await route.handler(request, principal, params)
        except _Problem as problem:
            if problem.status in (401, 403, 429):
                log.warning("api refused %s %s from %s (%s): %s", request.method,
                            request.url.path, _client(request), who, problem.detail,
                            extra={"action": "api_refused"})
            return _problem_response(problem)
        except PerdureError as exc:
            return _problem_response(_problem_of(exc))
        except Exception:
            log.exception("api %s %s failed", request.method, request.url.path,
                          extra={"action": "api_error"})
            return _problem_response(_Problem(500, "internal", "Internal error",
                                              "the server failed; see its log"))

    def _route(self, request: Request) -> tuple[_Route, dict[str, str]]:
        parts = self._parts(request)
        if parts is None:
            raise _Problem(404, "not-found", "Not found", "no such path in this API")
        allowed = []
        for route in self.routes:
            params = route.match(parts)
            if params is None:
                continue
            if route.method == request.method or (route.method == "GET"
                                                  and request.method == "HEAD"):
                return route, params
            allowed.append(route.method)
        if allowed:
            raise _Problem(405, "method-not-allowed", "Method not allowed",
                           f"{request.method} is not allowed here; use {', '.join(allowed)}",
                           headers={"Allow": ", ".join(allowed)})
        raise _Problem(404, "not-found", "Not found",
                       f"no such path in this API: {request.url.path}; see "
                       f"{PREFIX}/openapi.json")

    async def refusal(self, request: Request, scope: str) -> Response | None:
        """``None`` when the request's bearer token holds ``scope``; else the response
        that refuses it (logged as the API's refusals are). For routes served beside the
        API, such as the dashboard's ``/metrics``."""
        try:
            await self._admit(request, scope)
        except _Problem as problem:
            log.warning("refused %s %s from %s: %s", request.method, request.url.path,
                        _client(request), problem.detail, extra={"action": "api_refused"})
            return _problem_response(problem)
        return None

    async def _admit(self, request: Request, scope: str) -> Principal:
        """The caller the request's bearer token proves, if it holds ``scope``."""
        header = request.headers.get("authorization", "")
        kind, _, token = header.partition(" ")
        if kind.lower() != "bearer" or not token.strip():
            raise _Problem(401, "unauthorized", "Unauthorized",
                           "send a token: Authorization: Bearer TOKEN (perdure api-token "
                           "create NAME --scope read)",
                           headers={"WWW-Authenticate": 'Bearer realm="perdure"'})
        client = _client(request)
        if self.throttle.blocked(client):
            raise _Problem(429, "too-many-requests", "Too many requests",
                           "too many requests with a wrong token; wait a minute",
                           headers={"Retry-After": "60"})
        try:
            found: ApiToken | None = await run_in_threadpool(self.tokens.check,
                                                             token.strip())
        except ConfigurationError as exc:  # the server's token file, not the caller
            log.error("api tokens: %s", exc, extra={"action": "api_error"})
            raise _Problem(500, "internal", "Internal error",
                           "the server cannot read its API tokens; see its log") from None
        if found is None:
            self.throttle.failed(client)
            raise _Problem(401, "unauthorized", "Unauthorized",
                           "the token is unknown, revoked or expired",
                           headers={"WWW-Authenticate":
                                    'Bearer realm="perdure", error="invalid_token"'})
        if scope not in found.scopes:
            raise _Problem(403, "forbidden", "Forbidden",
                           f"this token ({found.name}, scopes {', '.join(found.scopes)}) "
                           f"lacks the scope {scope!r} this request needs",
                           headers={"WWW-Authenticate":
                                    f'Bearer realm="perdure", error="insufficient_scope", '
                                    f'scope="{scope}"'})
        return Principal(found.name, scope, "token", via="api", credential=found.token_id)

    async def _body(self, request: Request, known: tuple[str, ...], *,
                    optional: bool = False) -> _Fields:
        """The request's JSON object (``optional``: an empty body is ``{}``)."""
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > self.settings.max_body:
                raise _Problem(413, "too-large", "Request too large",
                               f"the body is over {self.settings.max_body} bytes")
        if not body.strip():
            if optional:
                return _Fields({}, known)
            raise _Problem(400, "malformed", "Malformed request",
                           "the body is empty; send a JSON object")
        try:
            doc = json.loads(bytes(body))
        except ValueError as exc:
            raise _Problem(400, "malformed", "Malformed request",
                           f"the body is not JSON: {exc}") from None
        except RecursionError:
            raise _Problem(400, "malformed", "Malformed request",
                           "the body is nested too deeply") from None
        if not isinstance(doc, dict):
            raise _invalid("body", f"the body must be a JSON object, not {_kind(doc)}")
        return _Fields(doc, known)

    async def _while_connected(self, request: Request, work: Awaitable[T]) -> T | None:
        """``work``'s outcome, or ``None`` when the client went away first (``work`` is
        cancelled then)."""
        task = asyncio.ensure_future(work)
        gone = asyncio.ensure_future(_disconnected(request.receive))
        with self.waiting():
            try:
                await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pending in (task, gone):
                    pending.cancel()
                await asyncio.gather(task, gone, return_exceptions=True)
        if task.cancelled():
            return None
        return task.result()

    def _busy(self) -> None:
        if self._open >= self.settings.max_open:
            raise _Problem(503, "busy", "Busy",
                           "too many long polls and streams are open; try again later",
                           headers={"Retry-After": "5"})

    # -- handlers ----------------------------------------------------------------------------

    async def openapi(self, request: Request, who: Principal | None,
                      params: dict[str, str]) -> Response:
        """GET /openapi.json: this API's OpenAPI document."""
        return Response(self._document, media_type="application/json", headers=_HEADERS)

    async def start(self, request: Request, who: Principal | None,
                    params: dict[str, str]) -> Response:
        """POST /objects: start an object."""
        assert who is not None
        body = await self._body(request, ("agent", "args", "kwargs", "object_id", "deadline",
                                          "max_failures", "labels", "budget"))
        agent = body.text("agent", required=True)
        assert agent is not None
        args = body.array("args")
        kwargs = body.mapping("kwargs") or {}
        object_id = body.text("object_id")
        if object_id is not None:
            _checked("object_id", lambda: check_object_id(object_id))
        deadline = body.number("deadline", above=0)
        max_failures = body.integer("max_failures")
        labels = body.mapping("labels")
        if labels is not None:
            labels = _checked("labels", lambda: check_labels(labels))
        budget = body.mapping("budget")
        _checked("budget", lambda: self.app.options(budget=budget))
        known = self.app.agents
        if agent not in known:
            shown = ", ".join(sorted(known)) or ("none: serve the API with --app "
                                                 "module:app to start objects")
            raise _invalid("agent", f"agent {agent!r} is not one this server can start "
                                    f"(its agents: {shown})")

        def run() -> tuple[dict[str, Any], bool, str | None]:
            try:
                handle = actions.start(self.app, who, agent, args, kwargs,
                                       object_id=object_id, deadline=deadline,
                                       max_failures=max_failures, labels=labels,
                                       budget=budget)
            except (ConfigurationError, SerializationError) as exc:
                raise _invalid("kwargs" if kwargs and not args else "args", str(exc)
                               ) from None
            return object_json(self.app.get(handle.object_id)), handle.created, handle.differs

        doc, created, differs = await run_in_threadpool(run)
        log.info("api action start (%s) of %r by %s", agent, doc["object_id"],
                 _label(who), extra={"action": "api_action"})
        where = f"{PREFIX}/objects/{quote(doc['object_id'], safe='')}"
        return _json({"object": doc, "created": created, "differs": differs},
                     201 if created else 200, {"Location": where})

    async def list_objects(self, request: Request, who: Principal | None,
                           params: dict[str, str]) -> Response:
        """GET /objects: objects, newest first, filtered, a page at a time."""
        query = dict(request.query_params)
        for name in sorted(set(query) - {*_FILTERS, "limit", "cursor"}):
            raise _invalid(name, f"unknown parameter {name!r}; the parameters are "
                                 f"{', '.join((*_FILTERS, 'limit', 'cursor'))}")
        for name in _FILTERS:
            if name in query:
                try:
                    Filters.from_query({name: query[name]})
                except ConfigurationError as exc:
                    raise _invalid(name, str(exc)) from None
        filters = Filters.from_query(query)
        limit = _query_int(request, "limit", self.settings.page_size, least=1,
                           most=self.settings.max_page)
        cursor = query.get("cursor") or None

        def run() -> dict[str, Any]:
            page = _checked("cursor", lambda: self.queries.page(filters, cursor=cursor,
                                                                limit=limit))
            now = time.time()
            return {"objects": [object_json(info_from_row(row, now)) for row in page.rows],
                    "next_cursor": page.next_cursor}

        return _json(await run_in_threadpool(run))

    async def get_object(self, request: Request, who: Principal | None,
                         params: dict[str, str]) -> Response:
        """GET /objects/{object_id}."""
        oid = params["object_id"]
        return _json(object_json(await run_in_threadpool(self.app.get, oid)))

    def _result_doc(self, info: ObjectInfo) -> dict[str, Any]:
        doc: dict[str, Any] = {"object_id": info.object_id, "status": str(info.status),
                               "done": info.terminal, "note": info.note}
        if info.status is Status.COMPLETED:
            doc["result"] = _shown(self.app.outcome(info.object_id).get("result"))
        elif info.status is Status.FAILED:
            body = self.app.outcome(info.object_id)
            found = body.get("error")
            error: dict[str, Any] = found if isinstance(found, dict) else {}
            doc["error"] = {"type": str(error.get("type", "unknown")),
                            "message": _shown(str(error.get("message",
                                                            body.get("reason", ""))))}
        return doc

    async def result(self, request: Request, who: Principal | None,
                     params: dict[str, str]) -> Response:
        """GET /objects/{object_id}/result?wait=S: the result, waiting up to ``wait``
        seconds for the object to end; its status when it has not."""
        oid = params["object_id"]
        wait = _query_number(request, "wait", 0.0, least=0.0, most=self.settings.max_wait)
        info = await run_in_threadpool(self.app.get, oid, explain=False)
        if wait > 0 and not info.terminal and info.status is not Status.PARKED:
            self._busy()
            waited = await self._while_connected(request, wait_for_end(self.app, oid, wait))
            if waited is None:
                return Response(status_code=499)  # nobody reads it
            info = waited
        return _json(await run_in_threadpool(self._result_doc, info))

    async def stream(self, request: Request, who: Principal | None,
                     params: dict[str, str]) -> Response:
        """GET /objects/{object_id}/stream: the object's emitted events, model records
        and end as server-sent events, after ``Last-Event-ID`` (or ``after``)."""
        oid = params["object_id"]
        every = _query_bool(request, "every")
        last = request.headers.get("last-event-id")
        if last is not None and last.strip():
            if not last.strip().isdigit():
                raise _invalid("Last-Event-ID", "the Last-Event-ID header must be the seq of "
                                                "the last event received (a whole number)")
            after = int(last.strip())
        else:
            after = _query_int(request, "after", 0, least=0, most=2**62)
        await run_in_threadpool(self.app.get, oid, explain=False)
        self._busy()

        async def events() -> AsyncGenerator[str, None]:
            follow = cast(AsyncGenerator[StreamEvent, None],
                          afollow(self.app, oid, after, every=every, opened=True))
            try:
                async with contextlib.aclosing(follow) as follower:
                    async for event in follower:
                        yield _sse(event)
            except PerdureError as exc:
                problem = _problem_of(exc)
                data = _dumps({"type": f"urn:perdure:problem:{problem.kind}",
                               "title": problem.title, "status": problem.status,
                               "detail": problem.detail}).decode()
                yield f"event: problem\ndata: {data}\n\n"

        return _EventStream(self, events)

    async def send(self, request: Request, who: Principal | None,
                   params: dict[str, str]) -> Response:
        """POST /objects/{object_id}/events: send an event."""
        assert who is not None
        oid = params["object_id"]
        body = await self._body(request, ("name", "payload", "dedupe_key"))
        name = body.text("name", required=True)
        assert name is not None
        _checked("name", lambda: check_name(name, "event name"))
        if is_reserved(name):
            raise _invalid("name", f"event name {name!r} is reserved (the prefix perdure: "
                                   "is perdure's own); use another name")
        dedupe = body.text("dedupe_key")
        if dedupe is not None:
            _checked("dedupe_key", lambda: check_name(dedupe, "dedupe key"))
        payload = body.value("payload")
        sent = await run_in_threadpool(self._send, who, oid, name, payload, dedupe)
        return _json({"sent": sent, "event": name}, 202)

    def _send(self, who: Principal, oid: str, name: str, payload: Any,
              dedupe: str | None) -> bool:
        try:
            sent = actions.send(self.app, who, oid, name, payload, dedupe_key=dedupe)
        except SerializationError as exc:
            raise _invalid("payload", str(exc)) from None
        log.info("api action send %r to %r by %s%s", name, oid, _label(who),
                 "" if sent else " (dedupe key seen before)", extra={"action": "api_action"})
        return sent

    async def answer(self, request: Request, who: Principal | None,
                     params: dict[str, str]) -> Response:
        """POST /objects/{object_id}/answer: answer the question the object asks."""
        assert who is not None
        oid = params["object_id"]
        body = await self._body(request, ("answer", "event", "dedupe_key"))
        if "answer" not in body.doc:
            raise _invalid("answer", "field 'answer' is required (any JSON value)")
        event = body.text("event")
        dedupe = body.text("dedupe_key")
        if dedupe is not None:
            _checked("dedupe_key", lambda: check_name(dedupe, "dedupe key"))

        def run() -> tuple[bool, str]:
            info = self.app.get(oid, explain=False)
            waiting = info.waiting_event
            if (info.status is not Status.DORMANT or waiting is None or is_reserved(waiting)
                    or (event is not None and event != waiting)):
                asked = (f"waits for event {waiting!r}" if waiting and not is_reserved(waiting)
                         else f"is {info.status} and asks nothing")
                raise _Problem(409, "not-asking", "Not asking",
                               f"object {oid!r} {asked}; send an event with "
                               f"POST {PREFIX}/objects/{{object_id}}/events instead")
            return self._send(who, oid, waiting, body.value("answer"), dedupe), waiting

        sent, name = await run_in_threadpool(run)
        return _json({"sent": sent, "event": name}, 202)

    def _control(self, verb: str) -> Handler:
        act = {"pause": actions.pause, "resume": actions.resume, "cancel": actions.cancel,
               "retry": actions.retry}[verb]

        async def control(request: Request, who: Principal | None,
                          params: dict[str, str]) -> Response:
            assert who is not None
            oid = params["object_id"]
            await self._body(request, (), optional=True)
            await run_in_threadpool(act, self.app, who, oid)
            log.info("api action %s on %r by %s", verb, oid, _label(who),
                     extra={"action": "api_action"})
            return _json(object_json(await run_in_threadpool(self.app.get, oid)))

        control.__doc__ = f"POST /objects/{{object_id}}/{verb}."
        return control

    async def query(self, request: Request, who: Principal | None,
                    params: dict[str, str]) -> Response:
        """POST /objects/{object_id}/queries/{name}: a query over the object's memory."""
        oid, name = params["object_id"], params["name"]
        body = await self._body(request, ("args",), optional=True)
        args = body.array("args")
        answer = await run_in_threadpool(self.app.query, oid, name, *args)
        return _json({"answer": _shown(answer)})

    async def update(self, request: Request, who: Principal | None,
                     params: dict[str, str]) -> Response:
        """POST /objects/{object_id}/updates/{name}: send an update, wait for its reply."""
        assert who is not None
        oid, name = params["object_id"], params["name"]
        body = await self._body(request, ("args", "timeout"), optional=True)
        args = body.array("args")
        timeout = min(body.number("timeout", above=0) or 30.0, self.settings.max_wait)
        self._busy()
        sent = await run_in_threadpool(send_update, self.app, oid, name, args)
        log.info("api action update %r of %r by %s", name, oid, _label(who),
                 extra={"action": "api_action"})
        async def reply() -> tuple[Any]:  # a tuple: a reply of None is still a reply
            return (await await_reply(self.app, oid, sent, timeout),)

        try:
            waited = await self._while_connected(request, reply())
        except ResultTimeoutError:
            raise _Problem(504, "timeout", "No reply in time",
                           f"object {oid!r} did not reply within {timeout:g} s; the update "
                           "stays queued and is applied when it next waits") from None
        if waited is None:
            return Response(status_code=499)  # nobody reads it
        return _json({"reply": _shown(waited[0])})

    async def questions(self, request: Request, who: Principal | None,
                        params: dict[str, str]) -> Response:
        """GET /questions: what waiting objects ask, newest first."""
        agent = request.query_params.get("agent") or None
        limit = _query_int(request, "limit", 100, least=1, most=1000)
        found = await run_in_threadpool(self.app.questions, agent=agent, limit=limit)
        return _json({"questions": [_question_json(q) for q in found]})

    async def approvals(self, request: Request, who: Principal | None,
                        params: dict[str, str]) -> Response:
        """GET /approvals: tool calls waiting for a person, newest first."""
        oid = request.query_params.get("object_id") or None
        found, problems = await run_in_threadpool(actions.pending_approvals, self.app)
        return _json({"approvals": [_approval_json(p) for p in found
                                    if oid is None or p.object_id == oid],
                      "problems": problems})

    async def decide(self, request: Request, who: Principal | None,
                     params: dict[str, str]) -> Response:
        """POST /objects/{object_id}/approvals/{proposal_id}: approve or reject."""
        assert who is not None
        oid, pid = params["object_id"], params["proposal_id"]
        body = await self._body(request, ("decision", "reason", "edit"))
        decision = body.text("decision", required=True)
        if decision not in ("approve", "reject"):
            raise _invalid("decision", "field 'decision' must be 'approve' or 'reject'")
        reason = body.text("reason") or ""
        edit = body.mapping("edit")
        if decision == "reject":
            if edit is not None:
                raise _invalid("edit", "a rejection takes no edited arguments")
            if not reason.strip():
                raise _invalid("reason", "say why the proposal is rejected (field 'reason')")
        if len(reason) > 2000:
            raise _invalid("reason", "the reason is longer than 2000 characters")

        def run() -> PendingApproval:
            try:
                if decision == "approve":
                    return actions.approve(self.app, who, oid, pid, edit=edit, reason=reason)
                return actions.reject(self.app, who, oid, pid, reason)
            except ApprovalError as exc:
                raise self._refused(oid, pid, exc) from None

        done = await run_in_threadpool(run)
        said = "edit" if decision == "approve" and edit is not None else decision
        log.info("api %s %s of %r by %s", said, pid, oid, _label(who),
                 extra={"action": "api_action"})
        return _json({"decision": said, "approval": _approval_json(done)})

    async def webhook(self, request: Request, who: Principal | None,
                      params: dict[str, str]) -> Response:
        """POST /hooks/{name}: a signed webhook starts or signals one object (the
        webhook's signature is its authentication: no token)."""
        name = params["name"]
        hook = self.triggers.webhooks().get(name)
        if hook is None:
            raise _Problem(404, "unknown-webhook", "Not found",
                           f"no webhook named {name!r} is declared here")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > hook.max_body:
                raise _Problem(413, "too-large", "Request too large",
                               f"the body is over {hook.max_body} bytes")
        headers = {k.lower(): v for k, v in request.headers.items()}
        try:
            delivery = hook.verify(headers, bytes(body), time.time())
        except WebhookRefusedError as exc:  # logged by handle() (401) or not at all (400)
            raise _Problem(exc.status, exc.kind, "Refused", str(exc)) from None
        except ConfigurationError as exc:  # the server lacks the secret, not the caller
            log.error("webhook %s: %s", name, exc, extra={"action": "api_error"})
            raise _Problem(500, "internal", "Internal error",
                           "this server cannot check the webhook's signature; see its log"
                           ) from None
        message = Message(bytes(body), dict(request.headers.items()), delivery,
                          f"webhook {name}")
        result = await deliver(self.app, hook, message)
        if result.outcome is Outcome.DONE:
            log.info("webhook %s: delivery %s %s object %s", name, delivery,
                     ("started" if hook.mode == "start" else "signalled") if result.applied
                     else "was applied before to", result.object_id,
                     extra={"action": "webhook_done"})
            return _json({"object_id": result.object_id, "applied": result.applied,
                          "delivery": delivery})
        log.warning("webhook %s: delivery %s refused: %s", name, delivery, result.reason,
                    extra={"action": "webhook_refused"})
        status, kind, title = _WEBHOOK_PROBLEMS.get(
            result.cause, (422, "invalid", "Invalid input"))
        raise _Problem(status, kind, title, result.reason,
                       headers={"Retry-After": "5"} if status == 503 else None)

    def _proposed(self, oid: str, pid: str) -> bool:
        """Whether the object's memory holds proposal ``pid`` (decided or not)."""
        try:
            return any(r.kind == Kind.TOOL_PROPOSED and r.body.get("proposal") == pid
                       for r in self.app.history(oid))
        except PerdureError:
            return False

    def _refused(self, oid: str, pid: str, exc: ApprovalError) -> _Problem:
        """The problem of a refused decision: 404 when the object never proposed it, 403
        when this server's identity may not decide on it, else 409 (decided, expired,
        memory that does not verify)."""
        try:
            waiting = {p.proposal_id: p for p in actions.pending_approvals(self.app)[0]
                       if p.object_id == oid}
        except PerdureError:
            waiting = {}
        target = waiting.get(pid)
        if target is None and "no proposal" in str(exc) and not self._proposed(oid, pid):
            # Never proposed; one the object's memory holds was decided or expired (409),
            # whether or not a worker has recorded the decision yet.
            return _Problem(404, "not-found", "Not found", str(exc))
        if target is not None and target.approvers and self.app.node_id not in target.approvers:
            return _Problem(403, "identity-may-not-decide", "Forbidden", str(exc))
        return _Problem(409, "conflict", "Conflict", str(exc))


# What a webhook delivery that cannot apply is answered with, by ``Result.cause``.
_WEBHOOK_PROBLEMS = {
    "undecodable": (400, "malformed", "Malformed request"),
    "invalid": (422, "invalid", "Invalid input"),
    "not-found": (404, "not-found", "Not found"),
    "ended": (409, "conflict", "Conflict"),
    "conflict": (409, "conflict", "Conflict"),
    "unavailable": (503, "store-unavailable", "Store unavailable"),
}


class _EventStream(Response):
    """Server-sent events from ``events()``, with a comment line every ``keepalive``
    seconds while nothing comes; when the client goes away, the events' source is
    cancelled (and closed) at once."""

    media_type = "text/event-stream"

    def __init__(self, api: Api, events: Callable[[], AsyncGenerator[str, None]]) -> None:
        # Not Response.__init__: a stream has no body to measure (no Content-Length).
        self.status_code = 200
        self.background = None
        self.init_headers({**_HEADERS, "X-Accel-Buffering": "no"})
        self.api = api
        self.events = events

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        queue: asyncio.Queue[str | None] = asyncio.Queue(maxsize=64)
        keepalive = self.api.settings.keepalive

        async def pump() -> None:
            async with contextlib.aclosing(self.events()) as events:
                async for chunk in events:
                    await queue.put(chunk)
            await queue.put(None)

        async def write() -> None:
            await send({"type": "http.response.start", "status": 200,
                        "headers": self.raw_headers})
            await send({"type": "http.response.body", "body": b"retry: 2000\n\n",
                        "more_body": True})
            while True:
                try:
                    item = await asyncio.wait_for(queue.get(), keepalive)
                except TimeoutError:
                    item = ": keep-alive\n\n"
                if item is None:
                    break
                await send({"type": "http.response.body", "body": item.encode("utf-8"),
                            "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        with self.api.waiting():
            tasks = [asyncio.ensure_future(pump()), asyncio.ensure_future(write()),
                     asyncio.ensure_future(_disconnected(receive))]
            try:
                await asyncio.wait(tasks[1:], return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in tasks:
                    task.cancel()
                outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        for failed in outcomes[:2]:
            if isinstance(failed, Exception) and not isinstance(failed, OSError):
                log.error("api stream failed: %r", failed, extra={"action": "api_error"})


def _problem_of(exc: PerdureError) -> _Problem:
    """The problem a ``PerdureError`` from the App is."""
    detail = str(exc)
    if isinstance(exc, ObjectNotFoundError):
        return _Problem(404, "not-found", "Not found", detail)
    if isinstance(exc, UnknownQueryError):
        return _Problem(404, "unknown-query", "Not found", detail)
    if isinstance(exc, UnknownUpdateError):
        return _Problem(404, "unknown-update", "Not found", detail)
    if isinstance(exc, UpdateRefusedError):
        return _Problem(422, "update-refused", "Refused", detail)
    if isinstance(exc, UpdateFailedError):
        return _Problem(409, "update-failed", "Update failed", detail)
    if isinstance(exc, ObjectConflictError | ObjectTerminatedError | NotParkedError
                  | ApprovalError):
        return _Problem(409, "conflict", "Conflict", detail)
    if isinstance(exc, UnknownAgentError):
        return _invalid("agent", detail)
    if isinstance(exc, ConfigurationError | SerializationError):
        return _Problem(422, "invalid", "Invalid input", detail)
    if isinstance(exc, StoreError):
        return _Problem(503, "store-unavailable", "Store unavailable", detail,
                        headers={"Retry-After": "5"})
    if isinstance(exc, IntegrityError | RecordDecodeError | DataKeyError):
        return _Problem(500, "integrity", "Memory does not verify", detail)
    if isinstance(exc, QueryFailedError):
        return _Problem(500, "query-failed", "Query failed", detail)
    return _Problem(500, "internal", "Internal error", detail)


def _client(request: Request) -> str:
    return request.client.host if request.client else "?"


def _label(who: Principal) -> str:
    return f"{who.name} (token {who.credential})"
