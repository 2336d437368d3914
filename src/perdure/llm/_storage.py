"""Content hashes, and a request stored as references to messages stored once.

A conversation resends every earlier message with each call, so a record holding each
call's whole request grows with the square of the turns. Here a message (and a tool
spec) is a *blob* named by the SHA-256 of its canonical JSON, stored once; a call's
request is a small *body* that lists the blobs it sent. The list itself is written as a
delta against the previous call's list (``base``): runs it shares with the base become
``[start, stop]`` slices, and only new hashes are spelled out, so a body's size does not
grow with the conversation either.

    split = split_request(request, base=previous.refs if previous else None)
    # store split.blobs not stored yet, and split.body in the call's record
    request = join_request(split.body, blobs, base=previous.refs if previous else None)

``join_request`` rebuilds the request and checks it against the hash in the body; it
fails closed (``ValueError``) on a missing blob, a wrong base or a hash that differs.
A reply is split the same way (``split_reply``): its assistant message is a blob, which
the next request names instead of carrying it again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from perdure.core.codec import encode
from perdure.llm._reply import ModelReply
from perdure.llm._types import Message, ModelParams, ModelRequest, ToolSpec

__all__ = [
    "RequestRefs",
    "SplitReply",
    "SplitRequest",
    "canonical",
    "content_hash",
    "join_reply",
    "join_request",
    "message_hash",
    "request_hash",
    "request_refs",
    "split_reply",
    "split_request",
    "tool_hash",
]


def canonical(value: Any) -> bytes:
    """The canonical JSON bytes of a JSON value (sorted keys, no spaces, UTF-8)."""
    return encode(value, what="model call value")


def content_hash(value: Any) -> str:
    """The SHA-256 hex digest of a JSON value's canonical bytes."""
    return hashlib.sha256(canonical(value)).hexdigest()


def message_hash(message: Message) -> str:
    """The content hash of a message (of its ``to_json()``)."""
    return content_hash(message.to_json())


def tool_hash(tool: ToolSpec) -> str:
    """The content hash of a tool spec (of its ``to_json()``)."""
    return content_hash(tool.to_json())


def _request_identity(model: str, messages: Sequence[str], tools: Sequence[str],
                      params: Mapping[str, Any], prefix: str) -> str:
    return content_hash({"model": model, "messages": list(messages), "tools": list(tools),
                         "params": dict(params), "prefix": prefix})


def request_hash(request: ModelRequest) -> str:
    """The content hash of a request: model, parameters, prefix and the hashes of its
    messages and tools in order. Two requests that would send the same thing have the
    same hash, however they are stored."""
    return _request_identity(request.model, [message_hash(m) for m in request.messages],
                             [tool_hash(t) for t in request.tools], request.params.to_json(),
                             request.prefix)


@dataclass(frozen=True, slots=True)
class RequestRefs:
    """A stored request's hash and the blob hashes it lists: the base of the next one."""

    hash: str
    messages: tuple[str, ...]
    tools: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SplitRequest:
    """A request split for storage: ``blobs`` (hash → JSON of every message and tool it
    sends; store the ones not stored yet), ``body`` (the compact JSON for the call's
    record) and ``refs`` (pass as ``base`` when splitting the next request)."""

    blobs: dict[str, Any]
    body: dict[str, Any]
    refs: RequestRefs


def _encode_refs(hashes: Sequence[str], base: Sequence[str]) -> list[str | list[int]]:
    """``hashes`` as items: a hash, or ``[start, stop]`` for a run of two or more that
    sits in ``base`` at ``base[start:stop]``."""
    where: dict[str, int] = {}
    for i, h in enumerate(base):
        where.setdefault(h, i)
    out: list[str | list[int]] = []
    i = 0
    while i < len(hashes):
        start = where.get(hashes[i])
        if start is not None:
            run = 1
            while (i + run < len(hashes) and start + run < len(base)
                   and base[start + run] == hashes[i + run]):
                run += 1
            if run >= 2:
                out.append([start, start + run])
                i += run
                continue
        out.append(hashes[i])
        i += 1
    return out


def _decode_refs(items: Sequence[Any], base: Sequence[str]) -> tuple[str, ...]:
    out: list[str] = []
    for item in items:
        if isinstance(item, str):
            out.append(item)
        elif (isinstance(item, list) and len(item) == 2
              and all(isinstance(n, int) for n in item) and 0 <= item[0] < item[1] <= len(base)):
            out.extend(base[item[0]:item[1]])
        else:
            raise ValueError(f"bad reference {item!r} in a stored model request")
    return tuple(out)


def split_request(request: ModelRequest, base: RequestRefs | None = None) -> SplitRequest:
    """Split ``request`` into blobs and a compact body, as a delta against ``base``
    (the previous call's ``refs``; ``None`` for the first call)."""
    blobs: dict[str, Any] = {}
    message_hashes: list[str] = []
    for message in request.messages:
        value = message.to_json()
        h = content_hash(value)
        blobs[h] = value
        message_hashes.append(h)
    tool_hashes: list[str] = []
    for tool in request.tools:
        value = tool.to_json()
        h = content_hash(value)
        blobs[h] = value
        tool_hashes.append(h)
    params = request.params.to_json()
    digest = _request_identity(request.model, message_hashes, tool_hashes, params,
                               request.prefix)
    body: dict[str, Any] = {
        "hash": digest,
        "model": request.model,
        "messages": _encode_refs(message_hashes, base.messages if base else ()),
    }
    if tool_hashes:
        body["tools"] = _encode_refs(tool_hashes, base.tools if base else ())
    if params:
        body["params"] = params
    if request.prefix:
        body["prefix"] = request.prefix
    if base is not None:
        body["base"] = base.hash
    return SplitRequest(blobs, body, RequestRefs(digest, tuple(message_hashes),
                                                 tuple(tool_hashes)))


def request_refs(body: Mapping[str, Any], base: RequestRefs | None = None) -> RequestRefs:
    """The refs a ``split_request`` body names (the base of the next one), read without
    the blobs and taking its recorded hash as it is (``join_request`` checks it).
    ``ValueError`` when the base is not the one the body was split against."""
    named_base = body.get("base")
    if named_base != (base.hash if base is not None else None):
        raise ValueError(f"stored model request was split against base {named_base!r}, "
                         f"not {base.hash if base else None!r}")
    return RequestRefs(str(body["hash"]),
                       _decode_refs(body.get("messages", ()), base.messages if base else ()),
                       _decode_refs(body.get("tools", ()), base.tools if base else ()))


def join_request(body: Mapping[str, Any], blobs: Mapping[str, Any],
                 base: RequestRefs | None = None) -> tuple[ModelRequest, RequestRefs]:
    """Rebuild the request a ``split_request`` body names, and its refs (the base of the
    next one). ``ValueError`` when the base is not the one the body was split against,
    a blob is missing, or the rebuilt request's hash is not the recorded one."""
    named_base = body.get("base")
    if named_base != (base.hash if base is not None else None):
        raise ValueError(f"stored model request was split against base {named_base!r}, "
                         f"not {base.hash if base else None!r}")
    message_hashes = _decode_refs(body.get("messages", ()), base.messages if base else ())
    tool_hashes = _decode_refs(body.get("tools", ()), base.tools if base else ())
    try:
        messages = tuple(Message.from_json(blobs[h]) for h in message_hashes)
        tools = tuple(ToolSpec.from_json(blobs[h]) for h in tool_hashes)
    except KeyError as exc:
        raise ValueError(f"stored model request names a missing blob {exc.args[0]}") from exc
    request = ModelRequest(str(body["model"]), messages, tools,
                           ModelParams.from_json(body.get("params", {})),
                           str(body.get("prefix", "")))
    refs = RequestRefs(request_hash(request), message_hashes, tool_hashes)
    if refs.hash != body.get("hash"):
        raise ValueError(f"stored model request rebuilds to hash {refs.hash}, "
                         f"not the recorded {body.get('hash')}")
    return request, refs


@dataclass(frozen=True, slots=True)
class SplitReply:
    """A reply split for storage: its assistant message as one blob (``message_hash`` →
    ``message``) and the rest as a compact ``body``."""

    message_hash: str
    message: dict[str, Any]
    body: dict[str, Any]


def split_reply(reply: ModelReply) -> SplitReply:
    """Split ``reply`` so that its text and tool calls are stored once, as the assistant
    message blob the next request will name."""
    message = reply.message().to_json()
    digest = content_hash(message)
    body = reply.to_json()
    body.pop("text", None)
    body.pop("tool_calls", None)
    body["message"] = digest
    return SplitReply(digest, message, body)


def join_reply(body: Mapping[str, Any], blobs: Mapping[str, Any]) -> ModelReply:
    """Rebuild the reply a ``split_reply`` body names (``ValueError`` if its message blob
    is missing)."""
    digest = body.get("message")
    if not isinstance(digest, str) or digest not in blobs:
        raise ValueError(f"stored model reply names a missing message blob {digest!r}")
    message = Message.from_json(blobs[digest])
    rest = {k: v for k, v in body.items() if k != "message"}
    rest["text"] = message.text
    rest["tool_calls"] = [c.to_json() for c in message.tool_calls]
    return ModelReply.from_json(rest)
