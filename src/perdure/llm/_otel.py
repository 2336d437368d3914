"""OpenTelemetry GenAI attributes of a call, derived from its request and reply.

The names are those of the OpenTelemetry semantic conventions for generative AI
(``gen_ai.*``, still marked *development* there). A call's record holds every field
they come from, so ``recorded_calls`` gives them from memory alone and a span can be
exported later without asking the provider again; only attributes with a value are
present. No message content is included (the conventions make it opt-in).
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

from perdure.llm._failures import CallFailure
from perdure.llm._reply import ModelReply
from perdure.llm._types import ModelRequest

__all__ = ["AttributeValue", "genai_attributes", "provider_name"]

AttributeValue = str | int | float | bool | list[str]

_PROVIDERS = {"openai.chat": "openai", "openai.responses": "openai", "anthropic": "anthropic"}


def provider_name(provider: str) -> str:
    """The ``gen_ai.provider.name`` of one of perdure's client kinds (``openai.chat`` and
    ``openai.responses`` are ``openai``); an unknown kind is passed through."""
    return _PROVIDERS.get(provider, provider)


def _server(base_url: str | None) -> dict[str, AttributeValue]:
    if not base_url:
        return {}
    parts = urlsplit(base_url)
    out: dict[str, AttributeValue] = {}
    if parts.hostname:
        out["server.address"] = parts.hostname
    port = parts.port or {"https": 443, "http": 80}.get(parts.scheme)
    if port is not None:
        out["server.port"] = port
    return out


def genai_attributes(request: ModelRequest, reply: ModelReply | None = None, *,
                     provider: str = "", base_url: str | None = None,
                     failure: CallFailure | None = None) -> dict[str, AttributeValue]:
    """The ``gen_ai.*`` (and ``server.*``, ``error.type``) attributes of one call.

    ``provider`` is the client kind (``openai.chat``, ``openai.responses``,
    ``anthropic``; the reply's own is used when it has one); ``failure`` adds
    ``error.type`` for a call that failed.
    """
    kind = (reply.provider if reply is not None and reply.provider else provider)
    out: dict[str, AttributeValue] = {"gen_ai.operation.name": "chat",
                                      "gen_ai.request.model": request.model}
    if kind:
        out["gen_ai.provider.name"] = provider_name(kind)
    params = request.params
    optional: Mapping[str, object] = {
        "gen_ai.request.temperature": params.temperature,
        "gen_ai.request.top_p": params.top_p,
        "gen_ai.request.max_tokens": params.max_tokens,
        "gen_ai.request.seed": params.seed,
    }
    for name, value in optional.items():
        if isinstance(value, int | float):
            out[name] = value
    if params.stop:
        out["gen_ai.request.stop_sequences"] = list(params.stop)
    out.update(_server(base_url))
    if reply is not None:
        out["gen_ai.output.type"] = "text"
        if reply.model:
            out["gen_ai.response.model"] = reply.model
        if reply.response_id:
            out["gen_ai.response.id"] = reply.response_id
        out["gen_ai.response.finish_reasons"] = [reply.finish_reason]
        out["gen_ai.usage.input_tokens"] = reply.usage.input_tokens
        out["gen_ai.usage.output_tokens"] = reply.usage.output_tokens
        if reply.usage.cached_input_tokens:
            out["gen_ai.usage.cache_read.input_tokens"] = reply.usage.cached_input_tokens
        if reply.usage.cache_write_input_tokens:
            out["gen_ai.usage.cache_creation.input_tokens"] = (
                reply.usage.cache_write_input_tokens)
    if failure is not None:
        out["error.type"] = failure.code or (str(failure.status) if failure.status
                                             else str(failure.kind))
    return out
