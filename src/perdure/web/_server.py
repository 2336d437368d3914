"""The dashboard as an ASGI application (Starlette): its guard, its routes.

Every request passes ``_guard`` first: the Host header must name this server; a request
that changes anything (POST) must come from this server's own pages (Origin and
``Sec-Fetch-Site``) and carry the session's CSRF token; every page but the login needs a
session; acting needs the operator role. A refused request is logged on the
``perdure.web`` logger with why, and changes nothing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hmac
import json
import logging
import secrets
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, quote

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from perdure import describe as view
from perdure.app import App
from perdure.core.approvals import pending_in
from perdure.core.events import APPROVAL_EVENT, is_reserved
from perdure.core.records import Kind
from perdure.errors import (
    ConfigurationError,
    PerdureError,
    RecordDecodeError,
    SealBrokenError,
)
from perdure.follow import follow
from perdure.info import ObjectInfo, info_from_row
from perdure.stores.base import AlertRow
from perdure.telemetry.alerts import NOTIFY
from perdure.web import _actions as actions
from perdure.web import _pages as pages
from perdure.web._api import Api
from perdure.web._auth import ApiTokens, Credentials, Principal, Session, Sessions, Throttle
from perdure.web._openapi import PREFIX
from perdure.web._queries import Filters, Queries

__all__ = ["COOKIE", "Dashboard", "UiSettings"]

log = logging.getLogger("perdure.web")

COOKIE = "perdure_session"
_PRE = "perdure_login"  # the login form's own CSRF cookie (double submit)
_MAX_BODY = 256 * 1024
_MAX_STREAMS = 64  # live streams (a thread each) served at once
_WHOLE_MEMORY = 20_000  # records read whole for an object's page; beyond, the newest only
_TAIL = 1000
_TOP_KEYS = 5  # the keys holding the most slots shown per queue
_RECENT_RUNS = 5  # the newest runs shown per schedule
_SAFE = ("GET", "HEAD")
_HEADERS = {
    "Content-Security-Policy": ("default-src 'self'; script-src 'self'; style-src 'self'; "
                                "img-src 'self' data:; connect-src 'self'; "
                                "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
_LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


@dataclass(frozen=True, slots=True)
class UiSettings:
    """Where the dashboard listens and which names it answers to.

    ``allowed_hosts`` adds Host header names (``dash.example.com``) to this server's own;
    ``https`` marks cookies ``Secure`` (set it when serving TLS, or behind a TLS proxy).
    """

    host: str = "127.0.0.1"
    port: int = 8377
    allowed_hosts: tuple[str, ...] = ()
    https: bool = False
    session_seconds: float = 12 * 3600
    page_size: int = 50

    def hosts(self) -> frozenset[str]:
        """Every Host header value this server accepts (with and without its port)."""
        names = set(self.allowed_hosts)
        if self.host in ("127.0.0.1", "localhost", "::1", "0.0.0.0", "::"):  # noqa: S104
            names.update(_LOOPBACK_NAMES)
        else:
            names.add(f"[{self.host}]" if ":" in self.host else self.host)
        return frozenset({n.lower() for n in names} | {f"{n}:{self.port}".lower()
                                                        for n in names})


@dataclass(slots=True)
class _Flash:
    messages: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def put(self, sid: str, flash: str | None, error: str | None) -> None:
        with self.lock:
            if len(self.messages) > 10_000:
                self.messages.clear()
            self.messages[sid] = (flash, error)

    def take(self, sid: str) -> tuple[str | None, str | None]:
        with self.lock:
            return self.messages.pop(sid, (None, None))


@dataclass(frozen=True, slots=True)
class _Refusal:
    """A request the guard turns away: status, what the client is told, what is logged."""

    status: int
    said: str
    why: str


Handler = Callable[[Request, Session, str], Awaitable[Response]]


class Dashboard:
    """The dashboard of ``app``'s store: build it, then serve ``asgi()`` with uvicorn."""

    def __init__(self, app: App, credentials: Credentials,
                 settings: UiSettings | None = None, api: Api | None = None) -> None:
        self.app = app
        self.credentials = credentials
        self.settings = settings or UiSettings()
        #: The HTTP API, served at ``/api/v1`` beside the pages (bearer tokens only:
        #: the dashboard's sessions and cookies do not reach it).
        self.api = api or Api(app, ApiTokens(app.identity.folder.path))
        self.sessions = Sessions(self.settings.session_seconds)
        self.throttle = Throttle()
        self.queries = Queries(app.store)
        self._hosts = self.settings.hosts()
        self._flash = _Flash()
        self._hour: tuple[float, dict[str, Any]] = (0.0, {})
        self._streams = 0
        self._streams_lock = threading.Lock()
        self._metrics: Any = None  # perdure.telemetry's, made at the first scrape

    # -- the guard -------------------------------------------------------------------

    def _check_host(self, request: Request) -> str | _Refusal:
        host = request.headers.get("host", "").lower()
        if host not in self._hosts:
            return _Refusal(400, "unknown Host: this dashboard answers to its own names only "
                            "(perdure ui --allowed-host NAME adds one)",
                            f"Host header {host!r} is not this server's")
        return host

    def _check_origin(self, request: Request, host: str) -> _Refusal | None:
        site = request.headers.get("sec-fetch-site")
        if site is not None and site not in ("same-origin", "none"):
            return _Refusal(403, "cross-site request refused", f"Sec-Fetch-Site {site}")
        origin = request.headers.get("origin")
        if origin is not None:
            scheme = "https" if self.settings.https else "http"
            if origin.lower() != f"{scheme}://{host}":
                return _Refusal(403, "cross-origin request refused", f"Origin {origin!r}")
        return None

    async def _form(self, request: Request) -> dict[str, str] | _Refusal:
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > _MAX_BODY:
                return _Refusal(413, "request too large", "body over 256 KiB")
        try:
            parsed = parse_qs(body.decode("utf-8"), keep_blank_values=True,
                              max_num_fields=50)
        except (UnicodeDecodeError, ValueError):
            return _Refusal(400, "malformed form", "form body not parseable")
        return {k: v[0] for k, v in parsed.items()}

    def _refuse(self, request: Request, refused: _Refusal, who: str = "-") -> Response:
        log.warning("dashboard refused %s %s from %s (%s): %s", request.method,
                    request.url.path, request.client.host if request.client else "?", who,
                    refused.why, extra={"action": "ui_refused"})
        return PlainTextResponse(refused.said, status_code=refused.status,
                                 headers=_HEADERS)

    async def _admit(self, request: Request, act: bool
                     ) -> tuple[Session, str, dict[str, str]] | _Refusal | Response:
        """The request's session, id and form if the guard lets it through."""
        host = self._check_host(request)
        if isinstance(host, _Refusal):
            return host
        unsafe = request.method not in _SAFE
        if unsafe:
            cross = self._check_origin(request, host)
            if cross is not None:
                return cross
        sid = request.cookies.get(COOKIE, "")
        session = self.sessions.get(sid)
        if session is None:
            if not unsafe and request.headers.get("accept", "").startswith("text/html"):
                return RedirectResponse("/login", 303, headers=_HEADERS)
            return _Refusal(401, "log in first", "no valid session")
        form: dict[str, str] = {}
        if unsafe:
            got = await self._form(request)
            if isinstance(got, _Refusal):
                return got
            form = got
            token = form.get("csrf") or request.headers.get("x-csrf-token", "")
            if not hmac.compare_digest(token.encode(), session.csrf.encode()):
                return _Refusal(403, "missing or wrong CSRF token",
                                f"bad CSRF token ({session.principal.label()})")
        if act and not session.principal.can_act:
            return _Refusal(403, "your role may not act",
                            f"viewer tried to act ({session.principal.label()})")
        return session, sid, form

    def _guarded(self, handler: Handler, *, act: bool = False) -> Callable[
            [Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            admitted = await self._admit(request, act)
            if isinstance(admitted, _Refusal):
                return self._refuse(request, admitted)
            if isinstance(admitted, Response):
                return admitted
            session, sid, form = admitted
            request.state.form = form
            response = await handler(request, session, sid)
            response.headers.update(_HEADERS)
            if self.settings.https:
                response.headers["Strict-Transport-Security"] = "max-age=31536000"
            return response

        return endpoint

    # -- logging in and out ----------------------------------------------------------------

    def _cookie(self, response: Response, name: str, value: str, max_age: int) -> None:
        response.set_cookie(name, value, max_age=max_age, httponly=True, samesite="strict",
                            secure=self.settings.https, path="/")

    async def login_form(self, request: Request) -> Response:
        """GET /login."""
        host = self._check_host(request)
        if isinstance(host, _Refusal):
            return self._refuse(request, host)
        nonce = secrets.token_urlsafe(24)
        response = HTMLResponse(pages.login_page(None, nonce), headers=_HEADERS)
        self._cookie(response, _PRE, nonce, 3600)
        return response

    async def login(self, request: Request) -> Response:
        """POST /login: a name and a token or password open a session."""
        client = request.client.host if request.client else "?"
        host = self._check_host(request)
        if isinstance(host, _Refusal):
            return self._refuse(request, host)
        cross = self._check_origin(request, host)
        if cross is not None:
            return self._refuse(request, cross)
        form = await self._form(request)
        if isinstance(form, _Refusal):
            return self._refuse(request, form)
        pre = request.cookies.get(_PRE, "")
        if not pre or not hmac.compare_digest(form.get("csrf", "").encode(), pre.encode()):
            return self._refuse(request, _Refusal(403, "the login form expired; reload it",
                                                  "bad login CSRF"))
        stamp = self.throttle.attempt(client)  # counted before the hash, while in flight
        if stamp is None:
            return self._refuse(request, _Refusal(429, "too many failed logins; wait a minute",
                                                  "login throttled"))
        name = " ".join("".join(c for c in form.get("name", "") if c.isprintable()
                                ).split())[:80]
        proved = await run_in_threadpool(self.credentials.check, form.get("secret", ""))
        if proved is None or not name:
            log.warning("dashboard login failed from %s (name %r)", client, name,
                        extra={"action": "ui_login_failed"})
            nonce = secrets.token_urlsafe(24)
            response = HTMLResponse(pages.login_page(
                "Wrong token or password." if name else "Say who you are.", nonce),
                status_code=401, headers=_HEADERS)
            self._cookie(response, _PRE, nonce, 3600)
            return response
        self.throttle.succeeded(client, stamp)
        principal = Principal(name, *proved)
        sid, _ = self.sessions.open(principal)
        log.info("dashboard login: %s from %s", principal.label(), client,
                 extra={"action": "ui_login"})
        done = RedirectResponse("/", 303, headers=_HEADERS)
        self._cookie(done, COOKIE, sid, int(self.settings.session_seconds))
        done.delete_cookie(_PRE, path="/")
        return done

    async def logout(self, request: Request, session: Session, sid: str) -> Response:
        """POST /logout."""
        self.sessions.close(sid)
        response = RedirectResponse("/login", 303)
        response.delete_cookie(COOKIE, path="/")
        return response

    # -- pages ---------------------------------------------------------------------------

    def _html(self, text: str, status: int = 200) -> HTMLResponse:
        return HTMLResponse(text, status_code=status)

    def _error(self, session: Session, title: str, text: str, status: int) -> HTMLResponse:
        return self._html(pages.message_page(title, text, session.principal, session.csrf),
                          status)

    async def overview(self, request: Request, session: Session, sid: str) -> Response:
        """GET /: counts, nodes, the last hour."""
        def build() -> str:
            now = time.time()
            at, hour = self._hour
            if now - at > 5:
                hour = self.queries.hour(now)
                self._hour = (now, hour)
            live = len(self.app.store.live_nodes(now))
            return pages.overview_page(self.queries.counts(), hour, live,
                                       who=session.principal, csrf=session.csrf)
        return self._html(await run_in_threadpool(build))

    async def objects(self, request: Request, session: Session, sid: str) -> Response:
        """GET /objects: filtered, paged by key."""
        params = dict(request.query_params)
        try:
            filters = Filters.from_query(params)
            cursor = params.get("cursor") or None
            page = await run_in_threadpool(self.queries.page, filters, cursor=cursor,
                                           limit=self.settings.page_size)
        except ConfigurationError as exc:
            return self._html(pages.list_page([], Filters(), None, None, who=session.principal,
                                              csrf=session.csrf, error=str(exc)), 400)
        now = time.time()
        infos = [info_from_row(row, now) for row in page.rows]
        return self._html(pages.list_page(infos, filters, page.next_cursor, cursor,
                                          who=session.principal, csrf=session.csrf))

    def _questions(self, info: ObjectInfo) -> list[actions.Question]:
        """What the object asks: its questions (prompt, choices), else the plain event
        it waits for."""
        if info.asking:
            return [actions.Question.asked(q) for q in info.asking]
        if not info.waiting_event or is_reserved(info.waiting_event):
            return []
        return [actions.Question(info.object_id, info.agent, info.waiting_event, None,
                                 info.updated_at)]

    async def object(self, request: Request, session: Session, sid: str) -> Response:
        """GET /objects/{id}: everything about one object."""
        oid = request.path_params["oid"]
        want_verify = request.query_params.get("verify") == "1"
        flash, error = self._flash.take(sid)

        def build() -> HTMLResponse:
            try:
                info = self.app.get(oid)
            except (ConfigurationError, PerdureError) as exc:
                return self._error(session, "No such object", str(exc), 404)
            damaged = None
            long = info.records > _WHOLE_MEMORY
            tail = None
            try:
                if long:  # the intent, its refinements, and the newest records only
                    head = self.queries.records_of(oid, (Kind.INSTANTIATED,
                                                         Kind.INTENT_REFINED))
                    tail = self.app.history(oid, after=info.records - _TAIL)
                    records = [r for r in head if r.seq <= info.records - _TAIL] + tail
                else:
                    records = self.app.history(oid)
            except RecordDecodeError as exc:
                records, damaged = [], f"memory cannot be read: {exc}"
            root, hops = info, 0
            while root.parent_id and hops < 64:
                try:
                    root = self.app.get(root.parent_id, explain=False)
                except PerdureError:
                    break
                hops += 1
            tree = view.lineage(root, lambda o: self.app.list(parent=o, limit=50)[::-1])
            children = self.app.list(parent=oid, limit=200)
            usage = lineage_usage = None
            if not damaged and not long:
                usage = view.usage(self.app.usage(oid))
                if children:
                    lineage_usage = view.usage(self.app.usage(oid, lineage=True))
            report = self.app.verify(oid) if want_verify else None
            pending = None
            if info.waiting_event == APPROVAL_EVENT and not damaged:
                try:  # what a person approves, opened with this dashboard's keys
                    pending = pending_in(
                        self.app.client.opener(self.app.open_sealed).records(records))
                except SealBrokenError as exc:
                    log.warning("%s; its tool calls are shown sealed", exc,
                                extra={"action": "seal_broken"})
            return self._html(pages.object_page(
                info, records, tree=tree, children=children, usage=usage,
                lineage_usage=lineage_usage, report=report, questions=self._questions(info),
                who=session.principal, csrf=session.csrf,
                flash=flash,
                error=damaged or error, newest=tail, pending=pending))
        return await run_in_threadpool(build)

    async def inbox(self, request: Request, session: Session, sid: str) -> Response:
        """GET /inbox: approvals and questions."""
        flash, error = self._flash.take(sid)

        def build() -> str:
            now = time.time()
            parked = [info_from_row(r, now) for r in
                      self.queries.page(Filters(status="parked"), limit=100).rows]
            approvals, damaged = actions.pending_approvals(self.app)
            questions = actions.questions(self.app)
            waiting = sorted({q.object_id for q in questions}
                             | {a.object_id for a in approvals})
            refused = {oid: view.refused(recs) for oid, recs in
                       self.queries.refused_while_waiting(waiting).items()}
            return pages.inbox_page(questions, approvals,
                                    who=session.principal, csrf=session.csrf,
                                    flash=flash, error=error, parked=parked,
                                    damaged=damaged, refused=refused)
        return self._html(await run_in_threadpool(build))

    async def nodes(self, request: Request, session: Session, sid: str) -> Response:
        """GET /nodes."""
        def build() -> str:
            now = time.time()
            return pages.nodes_page(self.app.store.live_nodes(now),
                                    self.queries.running_on(now), now,
                                    who=session.principal, csrf=session.csrf)
        return self._html(await run_in_threadpool(build))

    async def alerts(self, request: Request, session: Session, sid: str) -> Response:
        """GET /alerts: the alerts the nodes fired, firing and recently resolved
        (notifications for people left out)."""
        def build() -> str:
            def alerts(state: str) -> list[AlertRow]:
                return [row for row in self.app.store.alerts(state=state, limit=200)
                        if not row.rule.startswith(NOTIFY)][:100]
            return pages.alerts_page(alerts("firing"), alerts("resolved"),
                                     who=session.principal, csrf=session.csrf)
        return self._html(await run_in_threadpool(build))

    async def queues(self, request: Request, session: Session, sid: str) -> Response:
        """GET /queues: every declared queue, its limits and what it holds, and every
        model quota and its window (read-only)."""
        def build() -> str:
            now = time.time()
            stats = self.app.store.queue_stats(now)
            holders = {item.queue.name: self.app.store.queue_key_holders(
                item.queue.name, now, _TOP_KEYS + 1) for item in stats}
            return pages.queues_page(stats, holders, who=session.principal,
                                     csrf=session.csrf, shown=_TOP_KEYS,
                                     quotas=self.app.store.quota_stats(now), now=now)
        return self._html(await run_in_threadpool(build))

    async def schedules(self, request: Request, session: Session, sid: str) -> Response:
        """GET /schedules: every schedule, its state and recent runs; an operator's
        controls."""
        flash, error = self._flash.take(sid)

        def build() -> str:
            infos = self.app.schedules()
            runs = {info.name: self.app.list(parent=info.object_id, limit=_RECENT_RUNS)
                    for info in infos}
            return pages.schedules_page(infos, runs, who=session.principal,
                                        csrf=session.csrf, flash=flash, error=error)
        return self._html(await run_in_threadpool(build))

    async def hour(self, request: Request, session: Session, sid: str) -> Response:
        """GET /api/hour: the overview's figures as JSON."""
        return JSONResponse(await run_in_threadpool(self.queries.hour))

    async def stream(self, request: Request, session: Session, sid: str) -> Response:
        """GET /stream?id=...: the object's memory as server-sent events, from the record
        after ``Last-Event-ID``; model chunks carry their text."""
        oid = request.query_params.get("id", "")
        try:
            after = int(request.headers.get("last-event-id") or
                        request.query_params.get("after") or 0)
            await run_in_threadpool(self.app.get, oid, explain=False)
        except (ValueError, ConfigurationError, PerdureError) as exc:
            return PlainTextResponse(str(exc), status_code=404)
        if self._streams >= _MAX_STREAMS:
            return PlainTextResponse("too many live streams; try again later",
                                     status_code=503)
        stop = threading.Event()
        queue: asyncio.Queue[str | None] = asyncio.Queue(maxsize=1000)
        loop = asyncio.get_running_loop()

        def offer(item: str | None) -> bool:
            """Hand ``item`` to the response; ``False`` once the follower has gone."""
            while not stop.is_set():
                done = asyncio.run_coroutine_threadsafe(
                    asyncio.wait_for(queue.put(item), 1.0), loop)
                try:
                    done.result()
                    return True
                except TimeoutError:
                    continue
                except (RuntimeError, concurrent.futures.CancelledError):
                    return False  # the loop or the response is gone
            return False

        def pump() -> None:
            try:
                for event in follow(self.app, oid, after, every=True, stop=stop,
                                    timeout=600, poll=0.1):
                    doc = {"seq": event.seq, "kind": event.kind,
                           "line": view.describe(event.record).text}
                    if event.kind == Kind.MODEL_CHUNKS:
                        doc["text"] = event.text
                    data = json.dumps(doc, ensure_ascii=False)
                    if not offer(f"id: {event.seq}\ndata: {data}\n\n"):
                        return
                    if event.kind == Kind.TERMINATED:
                        offer("event: end\ndata: {}\n\n")
            except Exception as exc:  # noqa: BLE001 - said to the follower, then ended
                offer(f"event: problem\ndata: {json.dumps({'error': str(exc)})}\n\n")
            finally:
                offer(None)

        async def body() -> AsyncIterator[str]:
            with self._streams_lock:
                self._streams += 1
            thread = threading.Thread(target=pump, daemon=True)
            thread.start()
            try:
                yield "retry: 2000\n\n"
                while True:
                    item = await queue.get()
                    if item is None:
                        return
                    yield item
            finally:
                stop.set()
                with self._streams_lock:
                    self._streams -= 1

        return StreamingResponse(body(), media_type="text/event-stream")

    # -- acting ----------------------------------------------------------------------------

    async def act(self, request: Request, session: Session, sid: str) -> Response:
        """POST /act/{action}: send, pause, resume, cancel, retry, fork."""
        action = request.path_params["action"]
        form: dict[str, str] = request.state.form
        oid = form.get("object_id", "")
        who = session.principal
        back = "/inbox" if form.get("back") == "inbox" else "/objects/" + quote(oid, safe="")

        def run() -> str:
            if action == "send":
                event = form.get("event", "").strip()
                payload = _payload(form.get("payload", ""))
                fresh = actions.send(self.app, who, oid, event, payload,
                                     form.get("nonce") or None)
                return f"event {event!r} sent" + ("" if fresh else " (already sent)")
            if action == "pause":
                actions.pause(self.app, who, oid)
                return "pause asked"
            if action == "resume":
                actions.resume(self.app, who, oid)
                return "resumed"
            if action == "cancel":
                actions.cancel(self.app, who, oid)
                return "cancel asked"
            if action == "retry":
                actions.retry(self.app, who, oid)
                return "retry asked"
            if action == "fork":
                try:
                    at = int(form.get("at", ""))
                except ValueError:
                    raise ConfigurationError("fork needs a record number (seq)") from None
                new = actions.fork(self.app, who, oid, at, form.get("new_id") or None)
                return f"forked as {new}"
            raise ConfigurationError(f"unknown action {action!r}")

        try:
            said = await run_in_threadpool(run)
        except (ConfigurationError, PerdureError, ValueError) as exc:
            log.warning("dashboard action %s on %r by %s failed: %s", action, oid,
                        who.label(), exc, extra={"action": "ui_action_failed"})
            self._flash.put(sid, None, str(exc))
            return RedirectResponse(back, 303)
        log.info("dashboard action %s on %r by %s", action, oid, who.label(),
                 extra={"action": "ui_action"})
        self._flash.put(sid, said, None)
        return RedirectResponse(back, 303)

    async def schedule_act(self, request: Request, session: Session, sid: str) -> Response:
        """POST /schedules/{action}: pause, resume, trigger or delete a schedule (delete
        only with its box ticked), noted in the schedule's memory."""
        action = request.path_params["action"]
        form: dict[str, str] = request.state.form
        name = form.get("name", "")
        who = session.principal

        def run() -> str:
            if action == "delete" and form.get("confirm") != "yes":
                raise ConfigurationError("tick the box to delete a schedule: a deleted "
                                         "schedule starts nothing more, for good")
            actions.schedule_control(self.app, who, name, action)
            return {"pause": "pause asked", "resume": "resume asked",
                    "trigger": "a run asked now", "delete": "delete asked"}.get(action, "")

        try:
            said = await run_in_threadpool(run)
        except (ConfigurationError, PerdureError, ValueError) as exc:
            log.warning("dashboard schedule %s on %r by %s failed: %s", action, name,
                        who.label(), exc, extra={"action": "ui_action_failed"})
            self._flash.put(sid, None, str(exc))
            return RedirectResponse("/schedules", 303)
        log.info("dashboard schedule %s on %r by %s", action, name, who.label(),
                 extra={"action": "ui_action"})
        self._flash.put(sid, f"schedule {name!r}: {said}", None)
        return RedirectResponse("/schedules", 303)

    async def decide(self, request: Request, session: Session, sid: str) -> Response:
        """POST /inbox/approve, /inbox/reject."""
        verdict = request.path_params["verdict"]
        if verdict not in ("approve", "reject"):
            return PlainTextResponse("no such page", status_code=404)
        form: dict[str, str] = request.state.form
        oid, pid = form.get("object_id", ""), form.get("proposal_id", "")
        who = session.principal
        back = "/objects/" + quote(oid, safe="") if form.get("back") == "object" else "/inbox"

        def run() -> str:
            if verdict == "approve":
                edit = form.get("edit", "").strip()
                try:
                    edited = json.loads(edit) if edit else None
                except ValueError as exc:
                    raise ConfigurationError(f"the edited arguments are not JSON: {exc}"
                                             ) from None
                done = actions.approve(self.app, who, oid, pid, edit=edited)
                if edited is not None:
                    return (f"proposal {pid} ({done.tool}) edited: the new arguments go "
                            "through the gate again")
                return f"proposal {pid} ({done.tool}) approved"
            done = actions.reject(self.app, who, oid, pid, form.get("reason", ""))
            return f"proposal {pid} ({done.tool}) rejected"

        try:
            said = await run_in_threadpool(run)
        except (ConfigurationError, PerdureError, ValueError) as exc:
            log.warning("dashboard %s %s of %r by %s refused: %s", verdict, pid, oid,
                        who.label(), exc, extra={"action": "ui_action_failed"})
            self._flash.put(sid, None, str(exc))
            return RedirectResponse(back, 303)
        log.info("dashboard %s %s of %r by %s", verdict, pid, oid, who.label(),
                 extra={"action": "ui_action"})
        self._flash.put(sid, said, None)
        return RedirectResponse(back, 303)

    # -- metrics -------------------------------------------------------------------------

    async def metrics(self, request: Request) -> Response:
        """GET /metrics: the store's figures for Prometheus (objects by agent and status,
        approvals waiting, queues, schedules), and the node's own when this dashboard
        runs beside a worker. A bearer API token with the ``read`` scope, as for the API
        (``perdure api-token create prometheus --scope read``); needs perdure[prometheus]."""
        host = self._check_host(request)
        if isinstance(host, _Refusal):
            return self._refuse(request, host)
        refused = await self.api.refusal(request, "read")
        if refused is not None:
            return refused
        if self._metrics is None:
            from perdure import telemetry

            try:
                self._metrics = telemetry.prometheus_metrics(self.app)
            except ConfigurationError as exc:
                return PlainTextResponse(str(exc), status_code=501, headers=_HEADERS)
        from perdure.telemetry.prometheus import CONTENT_TYPE

        body = await run_in_threadpool(self._metrics.exposition)
        return Response(body, media_type=CONTENT_TYPE, headers=_HEADERS)

    # -- the application ---------------------------------------------------------------------

    def asgi(self) -> Starlette:
        """The Starlette application serving the dashboard."""
        from importlib.resources import files

        static = str(files("perdure.web") / "static")
        g = self._guarded

        async def store_trouble(request: Request, exc: Exception) -> Response:
            log.error("dashboard %s %s: %s", request.method, request.url.path, exc,
                      extra={"action": "ui_store_error"})
            return HTMLResponse(pages.message_page(
                "The store could not answer", f"{exc}", None), status_code=503,
                headers=_HEADERS)

        return Starlette(exception_handlers={PerdureError: store_trouble}, routes=[
            Route("/login", self.login_form, methods=["GET"]),
            Route("/login", self.login, methods=["POST"]),
            Route("/logout", g(self.logout), methods=["POST"]),
            Route("/", g(self.overview), methods=["GET"]),
            Route("/objects", g(self.objects), methods=["GET"]),
            Route("/objects/{oid:path}", g(self.object), methods=["GET"]),
            Route("/inbox", g(self.inbox), methods=["GET"]),
            Route("/nodes", g(self.nodes), methods=["GET"]),
            Route("/alerts", g(self.alerts), methods=["GET"]),
            Route("/queues", g(self.queues), methods=["GET"]),
            Route("/schedules", g(self.schedules), methods=["GET"]),
            Route("/schedules/{action:str}", g(self.schedule_act, act=True),
                  methods=["POST"]),
            Route("/api/hour", g(self.hour), methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
            Route("/stream", g(self.stream), methods=["GET"]),
            Route("/act/{action}", g(self.act, act=True), methods=["POST"]),
            Route("/inbox/{verdict:str}", g(self.decide, act=True), methods=["POST"]),
            Mount("/static", StaticFiles(directory=static), name="static"),
            Mount(PREFIX, app=self.api),
        ])


def _payload(text: str) -> Any:
    """A form's payload: JSON when it parses, else the text itself; empty is null."""
    text = text.strip()
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text
