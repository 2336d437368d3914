"""Model calls as recorded, advisory values: ``pip install 'perdure[llm]'``.

The pieces, each usable on its own and none touching a store:

- shapes (``Message``, ``ToolSpec``, ``ModelRequest``, ``ModelReply``, ``Usage``,
  ``StreamChunk``), JSON-able for memory, with content hashes; ``split_request`` /
  ``join_request`` store a request as references to messages stored once;
- clients over the official SDKs (``ChatCompletionsClient``, ``ResponsesClient``,
  ``AnthropicClient``), retries off, any compatible server by base URL;
- failure classification (``classify_exception``, ``classify_status``, ``CallFailure``,
  ``ModelCallError``): rate limited with the provider's delay, transient, permanent, or in
  doubt;
- prices and cost (``PriceTable``, ``Price``: exact ``Decimal`` dollars, unknown is
  ``None``) and offline token counting (``counter_for_model``);
- the context window (``prompt_view``, ``plan_compaction``, ``Summary``), pure;
- OpenTelemetry GenAI attributes (``genai_attributes``);
- a scripted local model server for tests and the offline demo
  (``perdure.llm.scripted``).

Importing this package without the extra raises ``ConfigurationError`` naming it.
"""

from __future__ import annotations

import importlib.util

from perdure.errors import ConfigurationError


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:
        return False


for _module, _package in (("openai", "openai"), ("anthropic", "anthropic"),
                          ("bpe_openai", "bpe-openai")):
    if not _installed(_module):
        raise ConfigurationError(
            f"perdure.llm needs the {_package!r} package, which is not installed: "
            "pip install 'perdure[llm]'"
        )

from perdure.llm._clients import (  # noqa: E402 - after the check for the extra
    AnthropicClient,
    ApiKey,
    ChatCompletionsClient,
    ModelClient,
    ResponsesClient,
)
from perdure.llm._failures import (  # noqa: E402
    CallFailure,
    FailureKind,
    ModelCallError,
    broken_stream,
    classify_exception,
    classify_status,
    parse_retry_after,
    reply_failure,
)
from perdure.llm._otel import genai_attributes, provider_name  # noqa: E402
from perdure.llm._prices import Price, PriceTable, cost_of, micro_dollars  # noqa: E402
from perdure.llm._storage import (  # noqa: E402
    RequestRefs,
    SplitReply,
    SplitRequest,
    canonical,
    content_hash,
    join_reply,
    join_request,
    message_hash,
    request_hash,
    split_reply,
    split_request,
    tool_hash,
)
from perdure.llm._stream import Continuation, StreamAssembler  # noqa: E402
from perdure.llm._tokens import (  # noqa: E402
    APPROXIMATION_FACTOR,
    BpeTokenCounter,
    ScaledTokenCounter,
    TokenCounter,
    counter_for_model,
)
from perdure.llm._types import (  # noqa: E402
    ImagePart,
    Message,
    ModelParams,
    ModelReply,
    ModelRequest,
    Part,
    Role,
    StreamChunk,
    TextPart,
    ToolCall,
    ToolCallDelta,
    ToolSpec,
    Usage,
)
from perdure.llm._window import (  # noqa: E402
    CompactionPlan,
    PromptView,
    Summary,
    plan_compaction,
    prompt_view,
)

__all__ = [
    "APPROXIMATION_FACTOR",
    "AnthropicClient",
    "ApiKey",
    "BpeTokenCounter",
    "CallFailure",
    "ChatCompletionsClient",
    "CompactionPlan",
    "Continuation",
    "FailureKind",
    "ImagePart",
    "Message",
    "ModelCallError",
    "ModelClient",
    "ModelParams",
    "ModelReply",
    "ModelRequest",
    "Part",
    "Price",
    "PriceTable",
    "PromptView",
    "RequestRefs",
    "ResponsesClient",
    "Role",
    "ScaledTokenCounter",
    "SplitReply",
    "SplitRequest",
    "StreamAssembler",
    "StreamChunk",
    "Summary",
    "TextPart",
    "TokenCounter",
    "ToolCall",
    "ToolCallDelta",
    "ToolSpec",
    "Usage",
    "broken_stream",
    "canonical",
    "classify_exception",
    "classify_status",
    "content_hash",
    "cost_of",
    "counter_for_model",
    "genai_attributes",
    "join_reply",
    "join_request",
    "message_hash",
    "micro_dollars",
    "parse_retry_after",
    "plan_compaction",
    "prompt_view",
    "provider_name",
    "reply_failure",
    "request_hash",
    "split_reply",
    "split_request",
    "tool_hash",
]
