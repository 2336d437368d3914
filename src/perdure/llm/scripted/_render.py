"""The three dialects as the scripted server writes them: JSON bodies and SSE frames.

Each renderer turns a ``ScriptedReply`` into what a provider would send: a JSON body for
a plain request, or a list of ``Frame``s for a streamed one, where ``content`` marks the
frames that carry text or tool-call arguments (what ``drop_after``, ``error_after`` and
``chunk_delay`` count). The shapes follow the providers' published wire formats, only
as far as the official SDKs and perdure's clients read them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from perdure.llm.scripted._script import RecordedRequest, ScriptedFailure, ScriptedReply

__all__ = ["RENDERERS", "Frame", "Rendered", "error_body", "error_frame", "token_counts"]


@dataclass(frozen=True, slots=True)
class Frame:
    """One SSE event as bytes; ``content`` if it carries a piece of the reply."""

    data: bytes
    content: bool = False


@dataclass(frozen=True, slots=True)
class Rendered:
    """A reply in one dialect: the JSON body and the stream frames."""

    body: dict[str, Any]
    frames: list[Frame]


def _sse(data: Any, event: str | None = None, content: bool = False) -> Frame:
    head = f"event: {event}\n" if event else ""
    return Frame(f"{head}data: {json.dumps(data)}\n\n".encode(), content)


def _pieces(text: str, size: int) -> list[str]:
    size = max(1, size)
    return [text[i:i + size] for i in range(0, len(text), size)]


def _call_id(reply: ScriptedReply, i: int, n: int, prefix: str) -> str:
    given = reply.tool_calls[i].id
    return given if given is not None else f"{prefix}_{n}_{i}"


def token_counts(reply: ScriptedReply, request: RecordedRequest) -> tuple[int, int, int]:
    """The input, output and cached tokens the reply's usage reports."""
    sent = json.dumps(request.body.get("messages") or request.body.get("input") or "")
    written = len(reply.text) + sum(len(c.arguments) + len(c.name) for c in reply.tool_calls)
    inp = reply.input_tokens if reply.input_tokens is not None else max(1, len(sent) // 4)
    out = reply.output_tokens if reply.output_tokens is not None else max(1, written // 4)
    return inp, out, reply.cached_tokens


_CHAT_FINISH = {"stop": "stop", "length": "length", "tool_calls": "tool_calls",
                "content_filter": "content_filter"}


def render_chat(reply: ScriptedReply, request: RecordedRequest, n: int) -> Rendered:
    """Chat Completions: a ``chat.completion`` body and ``chat.completion.chunk`` frames."""
    model = reply.model or str(request.body.get("model", "scripted"))
    inp, out, cached = token_counts(reply, request)
    usage = {"prompt_tokens": inp, "completion_tokens": out, "total_tokens": inp + out,
             "prompt_tokens_details": {"cached_tokens": cached}}
    finish = _CHAT_FINISH.get(reply.finish, reply.finish)
    calls: list[dict[str, Any]] = [{"id": _call_id(reply, i, n, "call"), "type": "function",
              "function": {"name": c.name, "arguments": c.arguments}}
             for i, c in enumerate(reply.tool_calls)]
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
    if calls:
        message["tool_calls"] = calls
    base = {"id": f"chatcmpl-{n}", "created": int(time.time()), "model": model}
    body = {**base, "object": "chat.completion", "usage": usage,
            "choices": [{"index": 0, "message": message, "finish_reason": finish,
                         "logprobs": None}]}

    def chunk(delta: dict[str, Any], finish_reason: str | None = None,
              content: bool = False) -> Frame:
        return _sse({**base, "object": "chat.completion.chunk", "choices": [
            {"index": 0, "delta": delta, "finish_reason": finish_reason}]}, content=content)

    frames = [chunk({"role": "assistant", "content": ""})]
    frames += [chunk({"content": p}, content=True) for p in _pieces(reply.text,
                                                                     reply.chunk_chars)]
    for i, call in enumerate(calls):
        function = call["function"]
        frames.append(chunk({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                             "function": {"name": function["name"],
                                                          "arguments": ""}}]}))
        frames += [chunk({"tool_calls": [{"index": i, "function": {"arguments": p}}]},
                         content=True)
                   for p in _pieces(function["arguments"], reply.chunk_chars)]
    frames.append(chunk({}, finish))
    if (request.body.get("stream_options") or {}).get("include_usage"):
        frames.append(_sse({**base, "object": "chat.completion.chunk", "choices": [],
                            "usage": usage}))
    frames.append(Frame(b"data: [DONE]\n\n"))
    return Rendered(body, frames)


def _response(reply: ScriptedReply, request: RecordedRequest, n: int,
              status: str) -> dict[str, Any]:
    inp, out, cached = token_counts(reply, request)
    output: list[dict[str, Any]] = []
    if reply.text or not reply.tool_calls:
        kind = "refusal" if reply.finish == "content_filter" else "output_text"
        part = ({"type": "refusal", "refusal": reply.text} if kind == "refusal"
                else {"type": "output_text", "text": reply.text, "annotations": []})
        output.append({"type": "message", "id": f"msg_{n}", "status": "completed",
                       "role": "assistant", "content": [part]})
    for i, call in enumerate(reply.tool_calls):
        output.append({"type": "function_call", "id": f"fc_{n}_{i}",
                       "call_id": _call_id(reply, i, n, "call"), "name": call.name,
                       "arguments": call.arguments, "status": "completed"})
    incomplete = {"length": {"reason": "max_output_tokens"}}.get(reply.finish)
    return {"id": f"resp_{n}", "object": "response", "created_at": int(time.time()),
            "status": "incomplete" if incomplete and status == "completed" else status,
            "incomplete_details": incomplete,
            "model": reply.model or str(request.body.get("model", "scripted")),
            "output": output if status == "completed" else [],
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "usage": {"input_tokens": inp, "input_tokens_details": {"cached_tokens": cached},
                      "output_tokens": out, "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": inp + out}}


def render_responses(reply: ScriptedReply, request: RecordedRequest, n: int) -> Rendered:
    """The Responses API: a ``response`` object and its typed stream events."""
    body = _response(reply, request, n, "completed")
    seq = iter(range(1_000_000))

    def event(kind: str, content: bool = False, **data: Any) -> Frame:
        return _sse({"type": kind, "sequence_number": next(seq), **data}, kind, content)

    frames = [event("response.created", response=_response(reply, request, n, "in_progress"))]
    for index, item in enumerate(body["output"]):
        if item["type"] == "message":
            part = item["content"][0]
            empty = {**part, "text": ""} if part["type"] == "output_text" else part
            frames.append(event("response.output_item.added", output_index=index,
                                item={**item, "content": [], "status": "in_progress"}))
            frames.append(event("response.content_part.added", item_id=item["id"],
                                output_index=index, content_index=0, part=empty))
            kind = ("response.refusal.delta" if part["type"] == "refusal"
                    else "response.output_text.delta")
            frames += [event(kind, True, item_id=item["id"], output_index=index,
                             content_index=0, delta=p)
                       for p in _pieces(reply.text, reply.chunk_chars)]
            frames.append(event("response.content_part.done", item_id=item["id"],
                                output_index=index, content_index=0, part=part))
        else:
            frames.append(event("response.output_item.added", output_index=index,
                                item={**item, "arguments": "", "status": "in_progress"}))
            frames += [event("response.function_call_arguments.delta", True,
                             item_id=item["id"], output_index=index, delta=p)
                       for p in _pieces(item["arguments"], reply.chunk_chars)]
            frames.append(event("response.function_call_arguments.done", item_id=item["id"],
                                output_index=index, arguments=item["arguments"]))
        frames.append(event("response.output_item.done", output_index=index, item=item))
    final = "response.incomplete" if body["status"] == "incomplete" else "response.completed"
    frames.append(event(final, response=body))
    return Rendered(body, frames)


_ANTHROPIC_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                   "content_filter": "refusal"}


def render_anthropic(reply: ScriptedReply, request: RecordedRequest, n: int) -> Rendered:
    """Anthropic Messages: a ``message`` body and its stream events."""
    inp, out, cached = token_counts(reply, request)
    usage = {"input_tokens": inp - cached, "output_tokens": out,
             "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}
    blocks: list[dict[str, Any]] = []
    if reply.text:
        blocks.append({"type": "text", "text": reply.text})
    for i, call in enumerate(reply.tool_calls):
        blocks.append({"type": "tool_use", "id": _call_id(reply, i, n, "toolu"),
                       "name": call.name, "input": json.loads(call.arguments or "{}")})
    stop = _ANTHROPIC_STOP.get(reply.finish, reply.finish)
    head = {"id": f"msg_{n}", "type": "message", "role": "assistant",
            "model": reply.model or str(request.body.get("model", "scripted"))}
    body = {**head, "content": blocks, "stop_reason": stop, "stop_sequence": None,
            "usage": usage}
    frames = [_sse({"type": "message_start", "message": {
        **head, "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {**usage, "output_tokens": 1}}}, "message_start"),
        _sse({"type": "ping"}, "ping")]
    for index, block in enumerate(blocks):
        if block["type"] == "text":
            start: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": p}
                      for p in _pieces(block["text"], reply.chunk_chars)]
        else:
            start = {**block, "input": {}}
            arguments = reply.tool_calls[index - (1 if reply.text else 0)].arguments
            deltas = [{"type": "input_json_delta", "partial_json": p}
                      for p in _pieces(arguments, reply.chunk_chars)]
        frames.append(_sse({"type": "content_block_start", "index": index,
                            "content_block": start}, "content_block_start"))
        frames += [_sse({"type": "content_block_delta", "index": index, "delta": d},
                        "content_block_delta", True) for d in deltas]
        frames.append(_sse({"type": "content_block_stop", "index": index},
                           "content_block_stop"))
    frames.append(_sse({"type": "message_delta", "delta": {"stop_reason": stop,
                                                           "stop_sequence": None},
                        "usage": {"output_tokens": out}}, "message_delta"))
    frames.append(_sse({"type": "message_stop"}, "message_stop"))
    return Rendered(body, frames)


RENDERERS: dict[str, Callable[[ScriptedReply, RecordedRequest, int], Rendered]] = {
    "chat": render_chat, "responses": render_responses, "anthropic": render_anthropic}

_OPENAI_TYPES = {400: "invalid_request_error", 401: "invalid_request_error",
                 403: "permission_denied", 404: "invalid_request_error",
                 429: "rate_limit_exceeded"}
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                    403: "permission_error", 404: "not_found_error",
                    413: "request_too_large", 429: "rate_limit_error",
                    529: "overloaded_error"}


def error_body(api: str, failure: ScriptedFailure) -> dict[str, Any]:
    """The JSON error body of ``failure`` in ``api``'s dialect."""
    if api == "anthropic":
        kind = failure.error_type or _ANTHROPIC_TYPES.get(failure.status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": failure.message}}
    kind = failure.error_type or _OPENAI_TYPES.get(failure.status, "server_error")
    return {"error": {"message": failure.message, "type": kind, "param": None,
                      "code": failure.code}}


def error_frame(api: str, error_type: str, message: str) -> Frame:
    """An error event inside a stream, in ``api``'s dialect."""
    if api == "anthropic":
        return _sse({"type": "error", "error": {"type": error_type, "message": message}},
                    "error")
    if api == "responses":
        return _sse({"type": "error", "code": error_type, "message": message,
                     "param": None, "sequence_number": 0}, "error")
    return _sse({"error": {"message": message, "type": error_type, "param": None,
                           "code": None}})
