"""Model clients over the official SDKs: Chat Completions, Responses, Anthropic Messages.

Each client sends a ``ModelRequest`` through the provider's own SDK (imported on a thread
at the first call, so never on a worker's event loop, and ``import perdure.llm`` stays
light), with the SDK's retries off (``max_retries=0``: perdure decides about retrying,
from memory), and hands back a ``ModelReply``, or a stream of ``StreamChunk`` ending in the
``ModelReply``. Any failure comes out as one ``ModelCallError`` whose ``failure`` classifies it; SDK
exceptions never escape (they are chained as the cause).

A client reaches any compatible server through ``base_url``. The API key comes from the
environment variable ``api_key_env`` or from ``api_key``, a callable (plain or async)
that returns it, called for each request so a rotated secret is picked up. A node
without the key (or the SDK) raises ``NodeLacksError``: a worker leaves the object to a
node that has it. The key is never kept on the client, never part of a reply, a chunk
or an error (a provider message that quotes it has it replaced by ``***``).

    client = ChatCompletionsClient(base_url="http://127.0.0.1:8000/v1")
    reply = await client.complete(request)
    async for item in client.stream(request):
        ...  # StreamChunk, StreamChunk, ..., then the ModelReply
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import importlib
import inspect
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, Self

from perdure.errors import ConfigurationError, NodeLacksError
from perdure.llm._failures import ModelCallError, broken_stream, classify_exception
from perdure.llm._reply import ModelReply, StreamChunk
from perdure.llm._stream import Continuation, StreamAssembler, joined_prefix
from perdure.llm._types import ModelRequest
from perdure.llm._warm import sample_request, warm

if TYPE_CHECKING:
    from perdure.llm.scripted import ScriptedServer
from perdure.llm._wire_anthropic import (
    AnthropicStreamState,
    anthropic_body,
    anthropic_event,
    anthropic_reply,
)
from perdure.llm._wire_chat import chat_body, chat_event, chat_reply
from perdure.llm._wire_responses import (
    ResponsesStreamState,
    responses_body,
    responses_event,
    responses_reply,
)

__all__ = [
    "AnthropicClient",
    "ApiKey",
    "ChatCompletionsClient",
    "ModelClient",
    "ResponsesClient",
]

ApiKey = Callable[[], str | Awaitable[str]]
"""A callable returning the API key, plain or async; called for every request."""

_EventHandler = Callable[[Mapping[str, Any], StreamAssembler], list[StreamChunk]]


class ModelClient(Protocol):
    """What the engine calls: one request in, one reply (or a stream of chunks) out."""

    @property
    def provider(self) -> str:
        """``openai.chat``, ``openai.responses`` or ``anthropic``."""
        ...

    @property
    def base_url(self) -> str | None:
        """The server's base URL (``None``: the SDK's default or its environment)."""
        ...

    @property
    def continuation(self) -> Continuation:
        """How this client continues salvaged text (``ModelRequest.prefix``)."""
        ...

    async def complete(self, request: ModelRequest) -> ModelReply:
        """Send ``request`` and return the whole reply (``ModelCallError`` on failure)."""
        ...

    def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk | ModelReply]:
        """Send ``request`` streaming: chunks as they come, then the ``ModelReply``."""
        ...

    async def aclose(self) -> None:
        """Close the connections the client holds."""
        ...


_WARM_KEY = "warm-up"


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


async def _plain(raw: Any, package: str, *, stream: bool) -> Any:
    """An SDK's raw response (``with_raw_response``) read as plain JSON: the reply as a
    dict, or the SDK's stream (it still parses the server-sent events and raises on an
    error event) yielding each event as a dict.

    Not the SDK's own models: building them validates through pydantic, whose validators
    and serializers are built at first use (for the Responses events, half a second or
    more of work holding the GIL), which would stall a worker's loop, and costs time on
    every event after. The dialects read the JSON as the API documents it."""
    sdk = importlib.import_module(package)
    parsed = raw.parse(to=sdk.AsyncStream[object] if stream else object)
    return await parsed if inspect.isawaitable(parsed) else parsed


class _SdkClient:
    """What the three clients share: key handling, timing, error translation, streams."""

    _provider: ClassVar[str]
    _default_env: ClassVar[str]
    _request_id_header: ClassVar[str]

    def __init__(self, *, base_url: str | None = None, api_key_env: str | None = None,
                 api_key: ApiKey | None = None, timeout: float = 600.0,
                 headers: Mapping[str, str] | None = None) -> None:
        if api_key is not None and not callable(api_key):
            raise ConfigurationError("api_key must be a callable returning the key (so it "
                                     "is read when needed and never stored); or set "
                                     "api_key_env to an environment variable's name")
        self._base_url = base_url
        self._api_key_env = api_key_env or self._default_env
        self._api_key = api_key
        self._timeout = timeout
        self._headers = dict(headers or {})
        self._sdk: Any = None
        self._key_digest: str | None = None
        # The SDK is imported, and its client made, at the first call, on a thread:
        # importing ``openai`` takes a second or more, and a client is often made inside
        # an agent, on a worker's event loop, where that would hold up lease renewals.

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={self._base_url!r})"

    @property
    def provider(self) -> str:
        """The client kind: ``openai.chat``, ``openai.responses`` or ``anthropic``."""
        return self._provider

    @property
    def base_url(self) -> str | None:
        """The server's base URL (``None``: the SDK's default or its environment)."""
        return self._base_url

    @property
    def _package(self) -> str:
        """The SDK's package: ``openai`` or ``anthropic``."""
        return self._provider.partition(".")[0]

    @property
    def continuation(self) -> Continuation:
        """How this client continues salvaged text."""
        return Continuation.TURN

    async def _key(self) -> str:
        if self._api_key is not None:
            value = self._api_key()
            key = await value if inspect.isawaitable(value) else value
        else:
            key = os.environ.get(self._api_key_env, "")
        if not isinstance(key, str) or not key:
            # This node's setting, not the call's: a worker leaves the object to a node
            # that has the key (``NodeLacksError`` is a ``CannotDo``).
            raise NodeLacksError(
                f"no API key for {self._provider} on this node: set the environment "
                f"variable {self._api_key_env} or pass api_key= (a callable); a local "
                "server that needs none takes any non-empty string")
        return key

    def _make_sdk(self, key: str, http_client: Any = None) -> Any:
        raise NotImplementedError

    def _imported_sdk(self, key: str) -> Any:
        """The SDK imported, warmed up and its client made (on a thread: see
        ``__init__``)."""
        package = self._package
        try:
            importlib.import_module(package)
        except ModuleNotFoundError:
            raise NodeLacksError(f"the {package!r} package is not installed on this node: "
                                 f"pip install 'perdure[llm]'") from None
        warm(self._provider, self._rehearse)
        return self._make_sdk(key)

    async def _rehearse(self, server: ScriptedServer, calls: list[str]) -> None:
        """Make ``calls`` (``complete``, ``stream``) of the sample request through this
        client's code and a client of the SDK made as ours are, to ``server``: the SDK's
        first-use work is done here, on the warm-up's thread, not on a worker's loop
        (see ``_warm``). The failures the server is scripted to answer are expected."""
        twin = copy.copy(self)
        twin._base_url = (server.anthropic_base_url if self._provider == "anthropic"
                          else server.openai_base_url)
        twin._api_key, twin._headers, twin._sdk = (lambda: _WARM_KEY), {}, None
        # trust_env off: no proxy between it and 127.0.0.1
        http = importlib.import_module(self._package).DefaultAsyncHttpxClient(trust_env=False)
        twin._sdk, twin._key_digest = twin._make_sdk(_WARM_KEY, http), _digest(_WARM_KEY)
        request = sample_request(self._provider)
        try:
            for call in calls:
                with contextlib.suppress(ModelCallError):
                    if call == "complete":
                        await twin.complete(request)
                    else:
                        async for _ in twin.stream(request):
                            pass
        finally:
            await twin.aclose()

    async def _client(self) -> tuple[Any, str]:
        """The SDK client for the current key (made once, re-keyed when the key changes,
        sharing its connections)."""
        key = await self._key()
        digest = _digest(key)
        if self._sdk is None:
            self._sdk = await asyncio.to_thread(self._imported_sdk, key)
        elif digest != self._key_digest:
            self._sdk = self._sdk.with_options(api_key=key)
        self._key_digest = digest
        return self._sdk, key

    async def aclose(self) -> None:
        """Close the connections the client holds (it opens new ones if used again)."""
        if self._sdk is not None:
            await self._sdk.close()
            self._sdk = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _error(self, exc: BaseException, request: ModelRequest, key: str, *,
               started: bool, assembler: StreamAssembler | None = None) -> ModelCallError:
        failure = classify_exception(exc, now=datetime.now(UTC), stream_started=started,
                                     stateful=request.stateful)
        if failure.detail and key and key in failure.detail:
            failure = replace(failure, detail=failure.detail.replace(key, "***"))
        return ModelCallError(failure, model=request.model, provider=self._provider,
                              partial=assembler.partial_text if assembler else "",
                              chunks=assembler.chunks if assembler else 0)

    # what each dialect fills in
    def _body(self, request: ModelRequest, *, stream: bool) -> dict[str, Any]:
        raise NotImplementedError

    async def _send(self, sdk: Any, body: dict[str, Any]) -> Any:
        raise NotImplementedError

    def _reply(self, data: Mapping[str, Any], request: ModelRequest,
               request_id: str | None, latency: float) -> ModelReply:
        raise NotImplementedError

    def _stream_handler(self) -> tuple[_EventHandler, Callable[[StreamAssembler], bool]]:
        raise NotImplementedError

    async def complete(self, request: ModelRequest) -> ModelReply:
        """Send ``request`` and return the whole reply; ``ModelCallError`` on failure."""
        body = self._body(request, stream=False)
        sdk, key = await self._client()
        started = time.monotonic()
        try:
            raw = await self._send(sdk, body)
            data = await _plain(raw, self._package, stream=False)
        except Exception as exc:
            raise self._error(exc, request, key, started=False) from exc
        if not isinstance(data, Mapping):
            failure = classify_exception(TypeError(f"the server answered {type(data).__name__}"
                                                   ", not a JSON object"),
                                         now=datetime.now(UTC), stream_started=False,
                                         stateful=request.stateful)
            raise ModelCallError(failure, model=request.model, provider=self._provider)
        request_id = raw.http_response.headers.get(self._request_id_header)
        return self._reply(data, request, request_id, time.monotonic() - started)

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk | ModelReply]:
        """Send ``request`` streaming: ``StreamChunk``s as they arrive, then the whole
        ``ModelReply``. A stream that breaks raises ``ModelCallError`` with the text it
        delivered (``partial``); for a stateful request it is in doubt."""
        body = self._body(request, stream=True)
        sdk, key = await self._client()
        assembler = StreamAssembler(joined_prefix(request.prefix, self.continuation)
                                    if request.prefix else "")
        handle, finished = self._stream_handler()
        started = time.monotonic()
        try:
            raw = await self._send(sdk, body)
            events = await _plain(raw, self._package, stream=True)
        except Exception as exc:
            raise self._error(exc, request, key, started=False) from exc
        request_id = raw.http_response.headers.get(self._request_id_header)
        try:
            async for event in events:
                for chunk in handle(event, assembler):
                    yield chunk
        except Exception as exc:
            raise self._error(exc, request, key, started=True, assembler=assembler) from exc
        finally:
            await events.close()
        if not finished(assembler):
            failure = broken_stream("the stream ended before the reply was complete",
                                    stateful=request.stateful)
            raise ModelCallError(failure, model=request.model, provider=self._provider,
                                 partial=assembler.partial_text, chunks=assembler.chunks)
        yield assembler.reply(provider=self._provider, request_id=request_id,
                              latency=time.monotonic() - started)


def _split(body: dict[str, Any], *keys: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``body`` as the SDK's named arguments (``keys``, and ``stream``) and the rest,
    which goes as ``extra_body`` (so every SDK version sends it as it is)."""
    named = {k: body[k] for k in (*keys, "stream") if k in body}
    rest = {k: v for k, v in body.items() if k not in named}
    return named, rest


class ChatCompletionsClient(_SdkClient):
    """OpenAI Chat Completions, or any server that speaks it (vLLM, llama.cpp, Ollama,
    LiteLLM). ``continuation`` is ``turn`` (any server) or ``continue_final_message``
    (servers that support it); ``max_tokens_field`` names the body field for
    ``ModelParams.max_tokens`` (OpenAI's newer models want ``max_completion_tokens``)."""

    _provider = "openai.chat"
    _default_env = "OPENAI_API_KEY"
    _request_id_header = "x-request-id"

    def __init__(self, *, base_url: str | None = None, api_key_env: str | None = None,
                 api_key: ApiKey | None = None, timeout: float = 600.0,
                 headers: Mapping[str, str] | None = None,
                 continuation: Continuation | str = Continuation.TURN,
                 max_tokens_field: str = "max_tokens") -> None:
        super().__init__(base_url=base_url, api_key_env=api_key_env, api_key=api_key,
                         timeout=timeout, headers=headers)
        mode = Continuation(continuation)
        if mode is Continuation.PREFILL:
            raise ConfigurationError("Chat Completions has no prefill; use "
                                     "'continue_final_message' or 'turn'")
        self._continuation = mode
        self._max_tokens_field = max_tokens_field

    @property
    def continuation(self) -> Continuation:
        """``turn`` or ``continue_final_message``, as configured."""
        return self._continuation

    def _make_sdk(self, key: str, http_client: Any = None) -> Any:
        import openai  # imported already, when the client was made

        return openai.AsyncOpenAI(api_key=key, base_url=self._base_url, max_retries=0,
                                  timeout=self._timeout, default_headers=self._headers,
                                  http_client=http_client)

    def _body(self, request: ModelRequest, *, stream: bool) -> dict[str, Any]:
        return chat_body(request, stream=stream, continuation=self._continuation,
                         max_tokens_field=self._max_tokens_field)

    async def _send(self, sdk: Any, body: dict[str, Any]) -> Any:
        named, rest = _split(body, "model", "messages")
        return await sdk.chat.completions.with_raw_response.create(
            **named, extra_body=rest, timeout=self._timeout)

    def _reply(self, data: Mapping[str, Any], request: ModelRequest,
               request_id: str | None, latency: float) -> ModelReply:
        return chat_reply(data, request, continuation=self._continuation,
                          request_id=request_id, latency=latency)

    def _stream_handler(self) -> tuple[_EventHandler, Callable[[StreamAssembler], bool]]:
        return chat_event, lambda assembler: assembler.finish_reason is not None


class ResponsesClient(_SdkClient):
    """The OpenAI Responses API (or a compatible server). Requests are sent with
    ``store: false`` unless ``ModelParams.store`` asks for stored state."""

    _provider = "openai.responses"
    _default_env = "OPENAI_API_KEY"
    _request_id_header = "x-request-id"

    def _make_sdk(self, key: str, http_client: Any = None) -> Any:
        import openai  # imported already, when the client was made

        return openai.AsyncOpenAI(api_key=key, base_url=self._base_url, max_retries=0,
                                  timeout=self._timeout, default_headers=self._headers,
                                  http_client=http_client)

    def _body(self, request: ModelRequest, *, stream: bool) -> dict[str, Any]:
        return responses_body(request, stream=stream)

    async def _send(self, sdk: Any, body: dict[str, Any]) -> Any:
        named, rest = _split(body, "model", "input")
        return await sdk.responses.with_raw_response.create(**named, extra_body=rest,
                                                            timeout=self._timeout)

    def _reply(self, data: Mapping[str, Any], request: ModelRequest,
               request_id: str | None, latency: float) -> ModelReply:
        return responses_reply(data, request, request_id=request_id, latency=latency)

    def _stream_handler(self) -> tuple[_EventHandler, Callable[[StreamAssembler], bool]]:
        state = ResponsesStreamState()

        def handle(data: Mapping[str, Any], assembler: StreamAssembler) -> list[StreamChunk]:
            return responses_event(data, assembler, state)

        return handle, lambda _: state.done


class AnthropicClient(_SdkClient):
    """Anthropic Messages (or a compatible server). A request without
    ``ModelParams.max_tokens`` gets ``default_max_tokens`` (the API requires one)."""

    _provider = "anthropic"
    _default_env = "ANTHROPIC_API_KEY"
    _request_id_header = "request-id"

    def __init__(self, *, base_url: str | None = None, api_key_env: str | None = None,
                 api_key: ApiKey | None = None, timeout: float = 600.0,
                 headers: Mapping[str, str] | None = None,
                 default_max_tokens: int = 4096) -> None:
        super().__init__(base_url=base_url, api_key_env=api_key_env, api_key=api_key,
                         timeout=timeout, headers=headers)
        self._default_max_tokens = default_max_tokens

    @property
    def continuation(self) -> Continuation:
        """``prefill``: the salvaged text is sent as the start of the reply."""
        return Continuation.PREFILL

    def _make_sdk(self, key: str, http_client: Any = None) -> Any:
        import anthropic  # imported already, when the client was made

        return anthropic.AsyncAnthropic(api_key=key, base_url=self._base_url, max_retries=0,
                                        timeout=self._timeout, default_headers=self._headers,
                                        http_client=http_client)

    def _body(self, request: ModelRequest, *, stream: bool) -> dict[str, Any]:
        return anthropic_body(request, stream=stream,
                              default_max_tokens=self._default_max_tokens)

    async def _send(self, sdk: Any, body: dict[str, Any]) -> Any:
        named, rest = _split(body, "model", "messages", "max_tokens")
        return await sdk.messages.with_raw_response.create(**named, extra_body=rest,
                                                           timeout=self._timeout)

    def _reply(self, data: Mapping[str, Any], request: ModelRequest,
               request_id: str | None, latency: float) -> ModelReply:
        return anthropic_reply(data, request, request_id=request_id, latency=latency)

    def _stream_handler(self) -> tuple[_EventHandler, Callable[[StreamAssembler], bool]]:
        state = AnthropicStreamState()

        def handle(data: Mapping[str, Any], assembler: StreamAssembler) -> list[StreamChunk]:
            return anthropic_event(data, assembler, state)

        return handle, lambda _: state.done

