"""The OpenAI Chat Completions dialect: request body, reply and stream events (pure).

Works with any server that speaks it (OpenAI, vLLM, llama.cpp server, Ollama, LiteLLM).
Replies and stream events are read as plain JSON objects (the wire form, or the SDK's
objects dumped to it), by key and with defaults, so fields a server leaves out do no harm.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from perdure.llm._reply import ModelReply, StreamChunk, Usage
from perdure.llm._stream import Continuation, StreamAssembler, continuation_messages, joined_prefix
from perdure.llm._types import ImagePart, Message, ModelRequest, TextPart, ToolCall

__all__ = ["chat_body", "chat_event", "chat_messages", "chat_reply", "chat_usage",
           "finish_from_chat"]

_FINISH = {"stop": "stop", "length": "length", "tool_calls": "tool_calls",
           "function_call": "tool_calls", "content_filter": "content_filter"}


def finish_from_chat(reason: str | None) -> str | None:
    """The normalised finish reason for a Chat Completions one."""
    return None if reason is None else _FINISH.get(reason, reason)


def _content(message: Message) -> str | list[dict[str, Any]]:
    if all(isinstance(p, TextPart) for p in message.content):
        return message.text
    parts: list[dict[str, Any]] = []
    for part in message.content:
        if isinstance(part, TextPart):
            parts.append({"type": "text", "text": part.text})
        elif isinstance(part, ImagePart):
            parts.append({"type": "image_url", "image_url": {"url": part.url}})
    return parts


def chat_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Messages in the Chat Completions form."""
    out: list[dict[str, Any]] = []
    for message in messages:
        item: dict[str, Any] = {"role": message.role}
        if message.role == "assistant":
            item["content"] = message.text or None
            if message.tool_calls:
                item["tool_calls"] = [
                    {"id": c.id, "type": "function",
                     "function": {"name": c.name, "arguments": c.arguments}}
                    for c in message.tool_calls]
        else:
            item["content"] = _content(message)
        if message.tool_call_id is not None:
            item["tool_call_id"] = message.tool_call_id
        out.append(item)
    return out


def _tool_choice(choice: str) -> str | dict[str, Any]:
    if choice in ("auto", "none", "required"):
        return choice
    return {"type": "function", "function": {"name": choice}}


def chat_body(request: ModelRequest, *, stream: bool, continuation: Continuation,
              max_tokens_field: str = "max_tokens") -> dict[str, Any]:
    """The JSON body of a Chat Completions call for ``request``."""
    body: dict[str, Any] = {
        "model": request.model,
        "messages": chat_messages(continuation_messages(request, continuation)),
    }
    if request.tools:
        body["tools"] = [{"type": "function", "function": {
            "name": t.name, "description": t.description, "parameters": dict(t.parameters)}}
            for t in request.tools]
    params = request.params
    for name in ("temperature", "top_p", "seed"):
        if getattr(params, name) is not None:
            body[name] = getattr(params, name)
    if params.max_tokens is not None:
        body[max_tokens_field] = params.max_tokens
    if params.stop:
        body["stop"] = list(params.stop)
    if params.tool_choice is not None:
        body["tool_choice"] = _tool_choice(params.tool_choice)
    if params.store is not None:
        body["store"] = params.store
    if request.prefix and continuation is Continuation.CONTINUE_FINAL_MESSAGE:
        body["continue_final_message"] = True
        body["add_generation_prompt"] = False
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    body.update(params.extra)
    return body


def chat_usage(data: Mapping[str, Any] | None) -> Usage:
    """A Chat Completions ``usage`` object as ``Usage``."""
    if not data:
        return Usage()
    prompt = data.get("prompt_tokens_details") or {}
    completion = data.get("completion_tokens_details") or {}
    return Usage(input_tokens=int(data.get("prompt_tokens") or 0),
                 output_tokens=int(data.get("completion_tokens") or 0),
                 cached_input_tokens=int(prompt.get("cached_tokens") or 0),
                 reasoning_tokens=int(completion.get("reasoning_tokens") or 0))


def chat_reply(data: Mapping[str, Any], request: ModelRequest, *, continuation: Continuation,
               request_id: str | None, latency: float) -> ModelReply:
    """A Chat Completions response body as a ``ModelReply`` (the continuation prefix
    joined in front of the text)."""
    choices = data.get("choices") or [{}]
    message = choices[0].get("message") or {}
    text = message.get("content") or ""
    if isinstance(text, list):
        text = "".join(str(p.get("text", "")) for p in text if isinstance(p, Mapping))
    finish = finish_from_chat(choices[0].get("finish_reason")) or "stop"
    if message.get("refusal") and not text:
        text, finish = str(message["refusal"]), "content_filter"
    calls = tuple(ToolCall(str(c.get("id") or ""), str((c.get("function") or {}).get("name")),
                           str((c.get("function") or {}).get("arguments") or "{}"))
                  for c in message.get("tool_calls") or ())
    prefix = joined_prefix(request.prefix, continuation) if request.prefix else ""
    return ModelReply(text=prefix + text, tool_calls=calls, finish_reason=finish,
                      usage=chat_usage(data.get("usage")), model=str(data.get("model") or ""),
                      provider="openai.chat", request_id=request_id,
                      response_id=data.get("id"), latency=latency)


def chat_event(data: Mapping[str, Any], assembler: StreamAssembler) -> list[StreamChunk]:
    """Feed one streamed ``chat.completion.chunk`` to ``assembler``; the chunks it made."""
    out: list[StreamChunk] = []
    if data.get("model"):
        assembler.model = str(data["model"])
    if data.get("id"):
        assembler.response_id = str(data["id"])
    if data.get("usage"):
        assembler.usage = chat_usage(data["usage"])
    for choice in data.get("choices") or ():
        delta = choice.get("delta") or {}
        text = delta.get("content") or delta.get("refusal") or ""
        chunk = assembler.text(text)
        if chunk is not None:
            out.append(chunk)
        if delta.get("refusal"):
            assembler.finish_reason = "content_filter"
        for call in delta.get("tool_calls") or ():
            function = call.get("function") or {}
            chunk = assembler.tool(int(call.get("index") or 0), call_id=call.get("id"),
                                   name=function.get("name"),
                                   arguments=function.get("arguments") or "")
            if chunk is not None:
                out.append(chunk)
        finish = finish_from_chat(choice.get("finish_reason"))
        if finish is not None and assembler.finish_reason != "content_filter":
            assembler.finish_reason = finish
    return out
