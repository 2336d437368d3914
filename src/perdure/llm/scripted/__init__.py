"""A scripted local model server, for tests and the offline demo.

A real HTTP server on 127.0.0.1 that speaks the OpenAI Chat Completions, OpenAI Responses
and Anthropic Messages APIs, in JSON and as SSE streams, and answers each request with
the next step of a script: a reply (text, tool calls, finish reason, usage; streamed in
chunks of a chosen size and pace, dropped or broken by an error event after a number of
chunks) or a failure (any status, ``retry-after``/``retry-after-ms``, ``x-should-retry``).
It records every request it got (credentials only as a hash), so a test can check what
the SDK sent. The model is scripted because the model is not what is tested; the SDK,
HTTP and streaming are real.

Run one from a shell with ``python -m perdure.llm.scripted [--port N] [--script FILE]``.
"""

from __future__ import annotations

from perdure.llm.scripted._script import (
    RecordedRequest,
    ScriptedFailure,
    ScriptedReply,
    ScriptedToolCall,
    Step,
    echo,
    load_script,
    step_from_json,
)
from perdure.llm.scripted._server import Responder, ScriptedServer

__all__ = [
    "RecordedRequest",
    "Responder",
    "ScriptedFailure",
    "ScriptedReply",
    "ScriptedServer",
    "ScriptedToolCall",
    "Step",
    "echo",
    "load_script",
    "step_from_json",
]
