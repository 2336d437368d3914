"""Warming a provider SDK's lazy paths once per process, off the worker's event loop.

The SDKs do slow work the first time they are used, not when imported: a client imports
its resource modules at the first attribute access (``sdk.chat``, ``sdk.responses``),
the request builder resolves the type hints of its parameter types, the HTTP transport
imports its async backend at the first connection. Done on a worker's loop, that holds
it up for a tenth of a second or more: leases go unrenewed and streams unread. So, where
the SDK is imported (on a thread, at a client's first call), ``warm`` sends one whole
request and one stream through the client's own code and a client of the SDK made as
the real one is, to a scripted server on 127.0.0.1 (started for it, stopped after).
Afterwards nothing lazy is left for the loop. All of it is Python that lets go of the
GIL, so the loop keeps running meanwhile. (The SDKs' pydantic models, whose validators
are built at first use inside pydantic-core without letting go of the GIL, are not used
at all: the clients read the replies as plain JSON, see ``_clients._plain``.)

It runs once per process and dialect; a second client waits for the first warm-up
rather than meeting the lazy paths on its loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from perdure.llm._types import Message, ModelParams, ModelRequest, ToolCall, ToolSpec

if TYPE_CHECKING:
    from perdure.llm.scripted import ScriptedFailure, ScriptedReply, ScriptedServer

__all__ = ["sample_request", "warm", "warmed"]

log = logging.getLogger("perdure.llm")


def sample_request(provider: str) -> ModelRequest:
    """A request using every part of a body ``provider``'s dialect builds (messages of
    each role, a tool call and its result, a tool, the parameters it takes)."""
    stop = () if provider == "openai.responses" else ("x",)
    return ModelRequest(
        model="warm-up",
        messages=(Message.system("s"), Message.user("u"),
                  Message.assistant("a", [ToolCall("call_1", "f", '{"x": 1}')]),
                  Message.tool("call_1", "r"), Message.user("u")),
        tools=(ToolSpec("f", "d", {"type": "object",
                                   "properties": {"x": {"type": "integer"}}}),),
        params=ModelParams(temperature=0.5, max_tokens=8, top_p=1.0, stop=stop,
                           seed=1 if provider == "openai.chat" else None,
                           tool_choice="auto"))


_lock = threading.Lock()
_warmed: set[str] = set()
_failed: set[str] = set()


def warmed() -> frozenset[str]:
    """The dialects warmed (without failure) in this process."""
    return frozenset(_warmed - _failed)


def _rehearsal() -> list[tuple[str, ScriptedReply | ScriptedFailure]]:
    """What the rehearsal sends (``complete`` or ``stream``) and how the server answers:
    replies, then the failures a call can meet (errors of status, an error event in a
    stream, a connection dropped mid-stream), each building its exceptions once."""
    from perdure.llm.scripted import ScriptedFailure, ScriptedReply, ScriptedToolCall

    reply = ScriptedReply(text="ok ok ok", chunk_chars=2,
                          tool_calls=(ScriptedToolCall("f", '{"x": 1}'),))
    return [("complete", reply), ("stream", reply),
            ("complete", ScriptedFailure(429)), ("complete", ScriptedFailure(500)),
            ("stream", replace(reply, error_after=1)),
            ("stream", replace(reply, drop_after=1))]


Rehearse = Callable[["ScriptedServer", list[str]], Coroutine[Any, Any, None]]
"""``rehearse(server, calls)``: make each call (``complete`` or ``stream``) of the sample
request, in order, through the client's code to ``server``; failures are expected."""


def warm(provider: str, rehearse: Rehearse) -> bool:
    """Warm ``provider``'s SDK once per process (call on a thread, never on a loop);
    whether it is warm.

    ``rehearse`` sends ``sample_request(provider)`` whole and streamed through the
    client's own code to a scripted server on 127.0.0.1 answering as ``_rehearsal``
    says. A warm-up that fails is logged at WARNING and not repeated:
    calls still work, only their first use may hold up the loop."""
    with _lock:
        if provider in _warmed:
            return provider not in _failed
        try:
            from perdure.llm.scripted import ScriptedServer

            plan = _rehearsal()
            with ScriptedServer(*(step for _, step in plan)) as server:
                asyncio.run(rehearse(server, [call for call, _ in plan]))
        except Exception:
            log.warning("could not warm the %s SDK up; its first call may hold up the "
                        "event loop", provider, exc_info=True)
            _failed.add(provider)
            return False
        finally:
            _warmed.add(provider)
        return provider not in _failed
