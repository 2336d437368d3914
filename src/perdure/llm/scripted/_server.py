"""The scripted model server: real HTTP on 127.0.0.1, standard library only.

It answers ``POST .../chat/completions``, ``.../responses`` and ``.../messages`` (the
OpenAI Chat Completions, OpenAI Responses and Anthropic Messages APIs) in JSON or, when
the body asks to stream, as server-sent events in a chunked body: a connection dropped
mid-stream is then an incomplete body to the client, as it is from a real provider.

    with ScriptedServer(ScriptedReply(text="hello")) as server:
        client = ChatCompletionsClient(base_url=server.openai_base_url, api_key=...)
        ...
        assert server.requests[0].body["model"] == "m"
"""

from __future__ import annotations

import hashlib
import json
import math
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from email.message import Message as HeaderMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from perdure.llm.scripted._render import (
    RENDERERS,
    Frame,
    error_body,
    error_frame,
    token_counts,
)
from perdure.llm.scripted._script import (
    RecordedRequest,
    ScriptedFailure,
    ScriptedReply,
    Step,
    echo,
)

__all__ = ["Responder", "ScriptedServer"]

Responder = Callable[[RecordedRequest], Step]
"""Answers a request when the script is empty."""

_ROUTES = (("/chat/completions", "chat"), ("/responses", "responses"),
           ("/messages", "anthropic"))
_SECRET_HEADERS = ("authorization", "x-api-key", "api-key")


def _api_of(path: str) -> str | None:
    bare = path.split("?", 1)[0].rstrip("/")
    for suffix, api in _ROUTES:
        if bare.endswith(suffix):
            return api
    return None


def _credential(headers: HeaderMessage) -> str | None:
    for name in _SECRET_HEADERS:
        value = headers.get(name)
        if value:
            token = value.removeprefix("Bearer ").strip()
            return hashlib.sha256(token.encode()).hexdigest()
    return None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        """Quiet: the requests are in ``ScriptedServer.requests``."""

    def do_POST(self) -> None:
        """Answer one API call with the next scripted step."""
        api = _api_of(self.path)
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if api is None:
            self._json(404, {"error": {"message": f"no such path {self.path}",
                                       "type": "not_found"}})
            return
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self._json(400, {"error": {"message": "body is not JSON",
                                       "type": "invalid_request_error"}})
            return
        headers = {k.lower(): v for k, v in self.headers.items()
                   if k.lower() not in _SECRET_HEADERS}
        request = RecordedRequest(api, self.path, body, bool(body.get("stream")), headers,
                                  _credential(self.headers), time.monotonic())
        step, n = self.server.scripted.take(request)
        if isinstance(step, ScriptedFailure):
            self._failure(api, step)
        elif request.stream:
            self._stream(api, step, request, n)
        else:
            self._reply(api, step, request, n)

    def _ids(self, api: str, n: int) -> dict[str, str]:
        return {("request-id" if api == "anthropic" else "x-request-id"): f"req_{n}"}

    def _json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        try:
            self.wfile.write(data)
        except OSError:  # the client went away: nothing to answer
            self.close_connection = True

    def _failure(self, api: str, failure: ScriptedFailure) -> None:
        headers = dict(failure.headers)
        if failure.retry_after is not None:
            headers["retry-after"] = failure.retry_after
        if failure.retry_after_ms is not None:
            headers["retry-after-ms"] = failure.retry_after_ms
        if failure.should_retry is not None:
            headers["x-should-retry"] = "true" if failure.should_retry else "false"
        self._json(failure.status, error_body(api, failure), headers)

    def _drop(self) -> None:
        """Close the connection abruptly, mid-answer."""
        self.close_connection = True
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _reply(self, api: str, reply: ScriptedReply, request: RecordedRequest,
               n: int) -> None:
        if reply.delay:
            time.sleep(reply.delay)
        if reply.drop_after is not None:
            self._drop()
            return
        rendered = RENDERERS[api](reply, request, n)
        self._json(200, rendered.body, {**self._ids(api, n), **reply.headers})

    def _stream(self, api: str, reply: ScriptedReply, request: RecordedRequest,
                n: int) -> None:
        if reply.delay:
            time.sleep(reply.delay)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        for name, value in {**self._ids(api, n), **reply.headers}.items():
            self.send_header(name, value)
        self.end_headers()
        sent = 0
        try:
            for frame in RENDERERS[api](reply, request, n).frames:
                if frame.content:
                    if reply.drop_after is not None and sent >= reply.drop_after:
                        self._drop()
                        return
                    if reply.error_after is not None and sent >= reply.error_after:
                        self._write(error_frame(api, reply.error_type, "scripted error"))
                        break
                    if reply.end_after is not None and sent >= reply.end_after:
                        break
                    if reply.chunk_delay:
                        time.sleep(reply.chunk_delay)
                    sent += 1
                self._write(frame)
                if frame.content:
                    self.server.scripted._wrote_chunk(n)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:  # the client went away: nothing to answer
            self.close_connection = True

    def _write(self, frame: Frame) -> None:
        self.wfile.write(b"%X\r\n%s\r\n" % (len(frame.data), frame.data))
        self.wfile.flush()


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    scripted: ScriptedServer


class ScriptedServer:
    """A local model server answering from a script; see the module docstring.

    ``steps`` are the first answers (more with ``script``); ``responder`` answers when
    the script is empty (default: echo the last user text). ``port=0`` takes a free port.

    ``tokens_per_minute`` makes it enforce a quota as a provider does: a reply whose
    tokens (input plus output, as its usage reports them) would take the tokens of the
    last ``quota_window`` seconds past ``tokens_per_minute * quota_window / 60`` is not
    given; the request is answered 429 with ``retry-after`` and ``retry-after-ms`` saying
    when it would fit (``quota`` has the figures).
    """

    def __init__(self, *steps: Step, host: str = "127.0.0.1", port: int = 0,
                 responder: Responder = echo, tokens_per_minute: int | None = None,
                 quota_window: float = 60.0) -> None:
        self._steps: deque[Step] = deque(steps)
        self._requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._responder = responder
        self._count = 0
        self._streamed: dict[int, int] = {}
        self._tpm = tokens_per_minute
        self._quota_window = quota_window
        self._served: deque[tuple[float, int]] = deque()  # (when, tokens) in the window
        self._served_log: list[tuple[float, int]] = []  # every reply given: (when, tokens)
        self._quota = {"served_tokens": 0, "served": 0, "throttled": 0, "peak_window": 0}
        self._httpd = _HTTPServer((host, port), _Handler)
        self._httpd.scripted = self
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``http://host:port``: the base URL for Anthropic clients."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def openai_base_url(self) -> str:
        """``http://host:port/v1``: the base URL for OpenAI clients."""
        return self.url + "/v1"

    @property
    def anthropic_base_url(self) -> str:
        """``http://host:port``: the base URL for Anthropic clients."""
        return self.url

    @property
    def requests(self) -> list[RecordedRequest]:
        """The requests received so far, in order (a copy)."""
        with self._lock:
            return list(self._requests)

    def streamed(self, number: int) -> int:
        """How many content chunks the stream answering request ``number`` (from 1, the
        order of ``requests``) has written so far: a count of what was sent, not of time."""
        with self._lock:
            return self._streamed.get(number, 0)

    def _wrote_chunk(self, number: int) -> None:
        with self._lock:
            self._streamed[number] = self._streamed.get(number, 0) + 1

    @property
    def pending(self) -> int:
        """Scripted steps not yet used."""
        with self._lock:
            return len(self._steps)

    def script(self, *steps: Step) -> None:
        """Queue more answers."""
        with self._lock:
            self._steps.extend(steps)

    def extend(self, steps: Iterable[Step]) -> None:
        """Queue more answers from an iterable."""
        self.script(*steps)

    def take(self, request: RecordedRequest) -> tuple[Step, int]:
        """Record ``request``; the step that answers it and its number (from 1)."""
        with self._lock:
            self._requests.append(request)
            self._count += 1
            step = self._steps.popleft() if self._steps else None
            n = self._count
            scripted = step is not None
            if step is None:
                step = self._responder(request)
            refused = self._over_quota(step, request)
            if refused is not None and scripted:
                self._steps.appendleft(step)  # the scripted answer waits for the next
        return (refused if refused is not None else step), n

    def _over_quota(self, step: Step, request: RecordedRequest) -> ScriptedFailure | None:
        """Count ``step``'s tokens in the quota's window, or refuse it (429) when they do
        not fit (the caller holds the lock)."""
        if self._tpm is None or not isinstance(step, ScriptedReply):
            return None
        inp, out, _ = token_counts(step, request)
        tokens = inp + out
        now = time.monotonic()
        window = self._served
        while window and window[0][0] <= now - self._quota_window:
            window.popleft()
        cap = max(1, int(self._tpm * self._quota_window / 60))
        used = sum(n for _, n in window)
        if used + tokens > cap and window:
            free, wait = used, self._quota_window
            for at, n in window:
                free -= n
                if free + tokens <= cap:
                    wait = at + self._quota_window - now
                    break
            self._quota["throttled"] += 1
            wait = max(0.001, wait)
            return ScriptedFailure(429, f"Rate limit reached: {cap} tokens per "
                                        f"{self._quota_window:g} s, used {used}, requested "
                                        f"{tokens}", error_type="tokens",
                                   code="rate_limit_exceeded",
                                   retry_after=str(max(1, math.ceil(wait))),
                                   retry_after_ms=str(math.ceil(wait * 1000)))
        window.append((now, tokens))
        self._served_log.append((now, tokens))
        self._quota["served_tokens"] += tokens
        self._quota["served"] += 1
        self._quota["peak_window"] = max(self._quota["peak_window"], used + tokens)
        return None

    @property
    def served(self) -> list[tuple[float, int]]:
        """Each reply given under the quota: when its request came (``time.monotonic()``)
        and its tokens."""
        with self._lock:
            return list(self._served_log)

    @property
    def quota(self) -> dict[str, int]:
        """The quota's figures so far: replies given (``served``) and their tokens
        (``served_tokens``), requests answered 429 (``throttled``), the most tokens the
        window held at once (``peak_window``) and what it holds now (``window``)."""
        with self._lock:
            now = time.monotonic()
            held = sum(n for at, n in self._served if at > now - self._quota_window)
            return {**self._quota, "window": held}

    def start(self) -> ScriptedServer:
        """Serve in a background thread; returns the server."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.02,),
                                            name="perdure-scripted-llm", daemon=True)
            self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve in this thread until ``stop`` (from another thread) or an interrupt."""
        self._httpd.serve_forever()

    def stop(self) -> None:
        """Stop serving and close the listening socket."""
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> ScriptedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
