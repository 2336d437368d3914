"""Helpers for the ``perdure.llm`` tests (imported only when the extra is installed)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from perdure.llm import (
    AnthropicClient,
    ChatCompletionsClient,
    ModelClient,
    ModelReply,
    ModelRequest,
    ResponsesClient,
    StreamChunk,
)
from perdure.llm.scripted import ScriptedServer

T = TypeVar("T")

KEY = "sk-perdure-test-0123456789"
KINDS = ("chat", "responses", "anthropic")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run one coroutine to its end on a fresh event loop."""
    return asyncio.run(coro)


def make_client(kind: str, server: ScriptedServer, **options: Any) -> ModelClient:
    """A client of ``kind`` pointed at ``server``, with the test key from a callable."""
    options.setdefault("api_key", lambda: KEY)
    if kind == "chat":
        return ChatCompletionsClient(base_url=server.openai_base_url, **options)
    if kind == "responses":
        return ResponsesClient(base_url=server.openai_base_url, **options)
    return AnthropicClient(base_url=server.anthropic_base_url, **options)


async def complete(client: ModelClient, request: ModelRequest) -> ModelReply:
    """``client.complete(request)``, then close the client."""
    try:
        return await client.complete(request)
    finally:
        await client.aclose()


async def stream(client: ModelClient,
                 request: ModelRequest) -> tuple[list[StreamChunk], ModelReply]:
    """Everything ``client.stream(request)`` yields, split into chunks and the final reply;
    the client is closed after."""
    items: list[StreamChunk | ModelReply] = []
    try:
        async for item in client.stream(request):
            items.append(item)
    finally:
        await client.aclose()
    *chunks, reply = items
    assert isinstance(reply, ModelReply)
    assert all(isinstance(c, StreamChunk) for c in chunks)
    return [c for c in chunks if isinstance(c, StreamChunk)], reply
