"""The OpenAI Responses API dialect: request body, reply and stream events (pure).

``store`` is sent as ``false`` unless the request asks for stored state (the API's own
default is to store), so a call is stateful only when the agent says so. The API has no
stop sequences and no seed: asking for them is a ``ConfigurationError``, not a silent drop.
A continuation is always an explicit turn (the API has no prefill).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from perdure.errors import ConfigurationError
from perdure.llm._reply import ModelReply, StreamChunk, Usage
from perdure.llm._stream import Continuation, StreamAssembler, continuation_messages
from perdure.llm._types import ImagePart, Message, ModelRequest, TextPart, ToolCall

__all__ = [
    "ResponsesStreamError",
    "ResponsesStreamState",
    "responses_body",
    "responses_event",
    "responses_input",
    "responses_reply",
    "responses_usage",
]


def _content(message: Message) -> str | list[dict[str, Any]]:
    if all(isinstance(p, TextPart) for p in message.content):
        return message.text
    parts: list[dict[str, Any]] = []
    for part in message.content:
        if isinstance(part, TextPart):
            parts.append({"type": "input_text", "text": part.text})
        elif isinstance(part, ImagePart):
            parts.append({"type": "input_image", "image_url": part.url})
    return parts


def responses_input(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Messages as Responses input items (tool calls and results as items of their own)."""
    items: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "tool":
            items.append({"type": "function_call_output", "call_id": message.tool_call_id,
                          "output": message.text})
            continue
        if message.content:
            items.append({"role": message.role, "content": _content(message)})
        for call in message.tool_calls:
            items.append({"type": "function_call", "call_id": call.id, "name": call.name,
                          "arguments": call.arguments})
    return items


def responses_body(request: ModelRequest, *, stream: bool) -> dict[str, Any]:
    """The JSON body of a Responses call for ``request``."""
    params = request.params
    if params.stop or params.seed is not None:
        raise ConfigurationError("the Responses API takes no stop sequences or seed; leave "
                                 "ModelParams.stop and seed unset, or use the chat client")
    body: dict[str, Any] = {
        "model": request.model,
        "input": responses_input(continuation_messages(request, Continuation.TURN)),
        "store": bool(params.store),
    }
    if request.tools:
        body["tools"] = [{"type": "function", "name": t.name, "description": t.description,
                          "parameters": dict(t.parameters), "strict": False}
                         for t in request.tools]
    for name in ("temperature", "top_p", "previous_response_id"):
        if getattr(params, name) is not None:
            body[name] = getattr(params, name)
    if params.max_tokens is not None:
        body["max_output_tokens"] = params.max_tokens
    if params.tool_choice is not None:
        body["tool_choice"] = (params.tool_choice
                               if params.tool_choice in ("auto", "none", "required")
                               else {"type": "function", "name": params.tool_choice})
    if stream:
        body["stream"] = True
    body.update(params.extra)
    return body


def responses_usage(data: Mapping[str, Any] | None) -> Usage:
    """A Responses ``usage`` object as ``Usage``."""
    if not data:
        return Usage()
    details = data.get("input_tokens_details") or {}
    output = data.get("output_tokens_details") or {}
    return Usage(input_tokens=int(data.get("input_tokens") or 0),
                 output_tokens=int(data.get("output_tokens") or 0),
                 cached_input_tokens=int(details.get("cached_tokens") or 0),
                 reasoning_tokens=int(output.get("reasoning_tokens") or 0))


def _finish(data: Mapping[str, Any], has_calls: bool, refused: bool) -> str:
    if refused:
        return "content_filter"
    if data.get("status") == "incomplete":
        reason = (data.get("incomplete_details") or {}).get("reason")
        return {"max_output_tokens": "length", "content_filter": "content_filter"}.get(
            str(reason), str(reason or "incomplete"))
    return "tool_calls" if has_calls else "stop"


def responses_reply(data: Mapping[str, Any], request: ModelRequest, *,
                    request_id: str | None, latency: float) -> ModelReply:
    """A Responses response object as a ``ModelReply`` (the continuation prefix joined in
    front of the text)."""
    texts: list[str] = []
    calls: list[ToolCall] = []
    refused = False
    for item in data.get("output") or ():
        if item.get("type") == "message":
            for part in item.get("content") or ():
                if part.get("type") == "output_text":
                    texts.append(str(part.get("text") or ""))
                elif part.get("type") == "refusal":
                    texts.append(str(part.get("refusal") or ""))
                    refused = True
        elif item.get("type") == "function_call":
            calls.append(ToolCall(str(item.get("call_id") or item.get("id") or ""),
                                  str(item.get("name") or ""),
                                  str(item.get("arguments") or "{}")))
    return ModelReply(
        text=request.prefix + "".join(texts), tool_calls=tuple(calls),
        finish_reason=_finish(data, bool(calls), refused),
        usage=responses_usage(data.get("usage")), model=str(data.get("model") or ""),
        provider="openai.responses", request_id=request_id, response_id=data.get("id"),
        latency=latency)


class ResponsesStreamState:
    """What a Responses stream needs to remember between events: which output item is
    which tool call, and whether a refusal was seen."""

    def __init__(self) -> None:
        self.tool_index: dict[str, int] = {}
        self.refused = False
        self.done = False


def responses_event(data: Mapping[str, Any], assembler: StreamAssembler,
                    state: ResponsesStreamState) -> list[StreamChunk]:
    """Feed one Responses stream event to ``assembler``; the chunks it made. An ``error``
    or ``response.failed`` event raises ``ResponsesStreamError``."""
    kind = data.get("type")
    chunk: StreamChunk | None = None
    if kind == "response.output_text.delta":
        chunk = assembler.text(str(data.get("delta") or ""))
    elif kind == "response.refusal.delta":
        state.refused = True
        chunk = assembler.text(str(data.get("delta") or ""))
    elif kind == "response.output_item.added":
        item = data.get("item") or {}
        if item.get("type") == "function_call":
            index = len(state.tool_index)
            state.tool_index[str(item.get("id") or item.get("call_id"))] = index
            chunk = assembler.tool(index, call_id=item.get("call_id"), name=item.get("name"),
                                   arguments=str(item.get("arguments") or ""))
    elif kind == "response.function_call_arguments.delta":
        index = state.tool_index.get(str(data.get("item_id")), 0)
        chunk = assembler.tool(index, arguments=str(data.get("delta") or ""))
    elif kind in ("response.created", "response.in_progress", "response.completed",
                  "response.incomplete"):
        response = data.get("response") or {}
        assembler.model = str(response.get("model") or assembler.model)
        assembler.response_id = response.get("id") or assembler.response_id
        if kind in ("response.completed", "response.incomplete"):
            assembler.usage = responses_usage(response.get("usage"))
            assembler.finish_reason = _finish(response, assembler.has_tool_calls,
                                              state.refused)
            state.done = True
    elif kind in ("error", "response.failed"):
        response = data.get("response") or {}
        raise ResponsesStreamError(data.get("error") or response.get("error") or data)
    return [chunk] if chunk is not None else []


class ResponsesStreamError(Exception):
    """An error event inside a Responses stream; ``body`` holds what it said (its
    ``code``/``type`` is what classification reads)."""

    def __init__(self, body: Mapping[str, Any]) -> None:
        code = body.get("code")
        kind = code if code is not None else body.get("type")
        message = str(body.get("message") or "error event in the stream")
        self.body = {"error": {"type": kind, "code": code, "message": message}}
        super().__init__(message)
