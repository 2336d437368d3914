"""The Anthropic Messages dialect: request body, reply and stream events (pure).

System messages become the ``system`` parameter (joined, in order). Tool results become
``tool_result`` blocks of a user turn, and consecutive turns of one role are merged (the
API wants the results of one assistant turn's calls together in the next user turn).
``max_tokens`` is required by the API: a request without one gets the client's default.
Usage is normalised: ``input_tokens`` counts cached and cache-written tokens too (the API
reports the three apart). A continuation is a prefill.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from perdure.errors import ConfigurationError
from perdure.llm._reply import ModelReply, StreamChunk, Usage
from perdure.llm._stream import Continuation, StreamAssembler, continuation_messages, joined_prefix
from perdure.llm._types import ImagePart, Message, ModelRequest, TextPart, ToolCall

__all__ = ["anthropic_body", "anthropic_event", "anthropic_messages", "anthropic_reply",
           "anthropic_usage", "finish_from_anthropic"]

_FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
           "tool_use": "tool_calls", "refusal": "content_filter"}


def finish_from_anthropic(reason: str | None) -> str | None:
    """The normalised finish reason for an Anthropic ``stop_reason``."""
    return None if reason is None else _FINISH.get(reason, reason)


def _image(part: ImagePart) -> dict[str, Any]:
    if part.url.startswith("data:"):
        header, _, data = part.url.partition(",")
        media = part.media_type or header[5:].split(";", 1)[0]
        return {"type": "image", "source": {"type": "base64", "media_type": media,
                                            "data": data}}
    return {"type": "image", "source": {"type": "url", "url": part.url}}


def _blocks(message: Message) -> list[dict[str, Any]]:
    if message.role == "tool":
        return [{"type": "tool_result", "tool_use_id": message.tool_call_id,
                 "content": message.text}]
    blocks: list[dict[str, Any]] = []
    for part in message.content:
        if isinstance(part, TextPart):
            if part.text:
                blocks.append({"type": "text", "text": part.text})
        elif isinstance(part, ImagePart):
            blocks.append(_image(part))
    for call in message.tool_calls:
        try:
            arguments = json.loads(call.arguments or "{}")
        except ValueError as exc:
            raise ConfigurationError(f"tool call {call.id} has arguments that are not JSON; "
                                     "Anthropic needs a JSON object") from exc
        blocks.append({"type": "tool_use", "id": call.id, "name": call.name,
                       "input": arguments})
    return blocks


def anthropic_messages(messages: Sequence[Message]) -> tuple[str, list[dict[str, Any]]]:
    """The ``system`` text and the ``messages`` list for ``messages``."""
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "system":
            system.append(message.text)
            continue
        role = "assistant" if message.role == "assistant" else "user"
        blocks = _blocks(message)
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    return "\n\n".join(system), turns


def _tool_choice(choice: str) -> dict[str, Any]:
    named = {"auto": {"type": "auto"}, "none": {"type": "none"}, "required": {"type": "any"}}
    return named.get(choice, {"type": "tool", "name": choice})


def anthropic_body(request: ModelRequest, *, stream: bool,
                   default_max_tokens: int) -> dict[str, Any]:
    """The JSON body of a Messages call for ``request``."""
    params = request.params
    if params.seed is not None or params.store is not None or params.previous_response_id:
        raise ConfigurationError("Anthropic Messages takes no seed, store or "
                                 "previous_response_id; leave them unset")
    system, turns = anthropic_messages(continuation_messages(request, Continuation.PREFILL))
    body: dict[str, Any] = {
        "model": request.model,
        "messages": turns,
        "max_tokens": params.max_tokens if params.max_tokens is not None
        else default_max_tokens,
    }
    if system:
        body["system"] = system
    if request.tools:
        body["tools"] = [{"name": t.name, "description": t.description,
                          "input_schema": dict(t.parameters)} for t in request.tools]
    for name in ("temperature", "top_p"):
        if getattr(params, name) is not None:
            body[name] = getattr(params, name)
    if params.stop:
        body["stop_sequences"] = list(params.stop)
    if params.tool_choice is not None:
        body["tool_choice"] = _tool_choice(params.tool_choice)
    if stream:
        body["stream"] = True
    body.update(params.extra)
    return body


def anthropic_usage(data: Mapping[str, Any] | None, before: Usage | None = None) -> Usage:
    """An Anthropic ``usage`` object as ``Usage`` (fields it lacks kept from ``before``:
    a stream's ``message_delta`` carries only some)."""
    base = before or Usage()
    if not data:
        return base
    read = data.get("cache_read_input_tokens")
    written = data.get("cache_creation_input_tokens")
    fresh = data.get("input_tokens")
    cached = int(read) if read is not None else base.cached_input_tokens
    creating = int(written) if written is not None else base.cache_write_input_tokens
    plain = (int(fresh) if fresh is not None
             else base.input_tokens - base.cached_input_tokens - base.cache_write_input_tokens)
    output = data.get("output_tokens")
    return Usage(input_tokens=plain + cached + creating,
                 output_tokens=int(output) if output is not None else base.output_tokens,
                 cached_input_tokens=cached, cache_write_input_tokens=creating)


def _arguments(value: Any) -> str:
    return json.dumps(value if value is not None else {}, ensure_ascii=False,
                      separators=(",", ":"))


def anthropic_reply(data: Mapping[str, Any], request: ModelRequest, *,
                    request_id: str | None, latency: float) -> ModelReply:
    """A Messages response body as a ``ModelReply`` (a prefill's text joined in front)."""
    texts: list[str] = []
    calls: list[ToolCall] = []
    for block in data.get("content") or ():
        if block.get("type") == "text":
            texts.append(str(block.get("text") or ""))
        elif block.get("type") == "tool_use":
            calls.append(ToolCall(str(block.get("id") or ""), str(block.get("name") or ""),
                                  _arguments(block.get("input"))))
    prefix = joined_prefix(request.prefix, Continuation.PREFILL) if request.prefix else ""
    return ModelReply(
        text=prefix + "".join(texts), tool_calls=tuple(calls),
        finish_reason=finish_from_anthropic(data.get("stop_reason")) or "stop",
        usage=anthropic_usage(data.get("usage")), model=str(data.get("model") or ""),
        provider="anthropic", request_id=request_id, response_id=data.get("id"),
        latency=latency)


class AnthropicStreamState:
    """Which content block is which tool call, and whether the message has stopped."""

    def __init__(self) -> None:
        self.tool_index: dict[int, int] = {}
        self.done = False


def anthropic_event(data: Mapping[str, Any], assembler: StreamAssembler,
                    state: AnthropicStreamState) -> list[StreamChunk]:
    """Feed one Messages stream event to ``assembler``; the chunks it made."""
    kind = data.get("type")
    chunk: StreamChunk | None = None
    if kind == "message_start":
        message = data.get("message") or {}
        assembler.model = str(message.get("model") or "")
        assembler.response_id = message.get("id")
        assembler.usage = anthropic_usage(message.get("usage"))
    elif kind == "content_block_start":
        block = data.get("content_block") or {}
        if block.get("type") == "tool_use":
            index = len(state.tool_index)
            state.tool_index[int(data.get("index") or 0)] = index
            chunk = assembler.tool(index, call_id=block.get("id"), name=block.get("name"))
        elif block.get("type") == "text":
            chunk = assembler.text(str(block.get("text") or ""))
    elif kind == "content_block_delta":
        delta = data.get("delta") or {}
        if delta.get("type") == "text_delta":
            chunk = assembler.text(str(delta.get("text") or ""))
        elif delta.get("type") == "input_json_delta":
            index = state.tool_index.get(int(data.get("index") or 0), 0)
            chunk = assembler.tool(index, arguments=str(delta.get("partial_json") or ""))
    elif kind == "message_delta":
        delta = data.get("delta") or {}
        finish = finish_from_anthropic(delta.get("stop_reason"))
        if finish is not None:
            assembler.finish_reason = finish
        assembler.usage = anthropic_usage(data.get("usage"), assembler.usage)
    elif kind == "message_stop":
        state.done = True
    return [chunk] if chunk is not None else []
