"""Model calls as recorded, advisory values: ``pip install 'perdure[llm]'``.

The pieces, each usable on its own and none touching a store:

- shapes (``Message``, ``ToolSpec``, ``ModelRequest``, ``ModelReply``, ``Usage``,
  ``StreamChunk``), JSON-able for memory, with content hashes; ``split_request`` /
  ``join_request`` store a request as references to messages stored once by hash;
  ``CallTable`` and ``recorded_calls``: how an object's memory holds its calls (each
  value once, by number) and reads them back with their GenAI attributes;
- clients over the official SDKs (``ChatCompletionsClient``, ``ResponsesClient``,
  ``AnthropicClient``), retries off, any compatible server by base URL;
- failure classification (``classify_exception``, ``classify_status``, ``CallFailure``,
  ``ModelCallError``): rate limited with the provider's delay, transient, permanent, or in
  doubt;
- prices and cost (``PriceTable``, ``Price``: exact ``Decimal`` dollars, unknown is
  ``None``), offline token counting (``counter_for_model``; ``load_counter`` reads the
  encoding on a thread, for async code), and a ledger with budgets
  (``Ledger``, ``Budget``: reserve, settle by call id);
- the context window (``prompt_view``, ``plan_compaction``, ``Summary``), pure, and
  ``ContextPolicy``, which makes ``run.model`` send a view and compact by a recorded
  summary call;
- OpenTelemetry GenAI attributes (``genai_attributes``);
- streams that survive a crash, the pure part: ``ChunkBatcher`` (journal batches),
  ``Salvage``, ``choose_recovery`` (continue, restart or surface), ``RecoveryMarker``;
- a scripted local model server for tests and the offline demo
  (``perdure.llm.scripted``).

Importing this package without the extra raises ``ConfigurationError`` naming it.
"""

from __future__ import annotations

from perdure.llm._clients import (
    AnthropicClient,
    ApiKey,
    ChatCompletionsClient,
    ModelClient,
    ResponsesClient,
)
from perdure.llm._context import ContextPolicy
from perdure.llm._extra import require_extra as _require_extra
from perdure.llm._failures import (
    CallFailure,
    FailureKind,
    ModelCallError,
    broken_stream,
    classify_exception,
    classify_status,
    parse_retry_after,
    reply_failure,
)
from perdure.llm._ledger import Budget, Charge, Ledger, reservation_for
from perdure.llm._otel import genai_attributes, provider_name
from perdure.llm._prices import Price, PriceTable, cost_of, micro_dollars
from perdure.llm._records import (
    CallTable,
    RecordedCall,
    StoredCallError,
    StreamTexts,
    recorded_calls,
)
from perdure.llm._recovery import (
    ChunkBatcher,
    FlushPolicy,
    Recovery,
    RecoveryMarker,
    Salvage,
    choose_recovery,
    continuation_of,
    lost_usage,
)
from perdure.llm._reply import ModelReply, StreamChunk, ToolCallDelta, Usage
from perdure.llm._storage import (
    RequestRefs,
    SplitReply,
    SplitRequest,
    canonical,
    content_hash,
    join_reply,
    join_request,
    message_hash,
    request_hash,
    request_refs,
    split_reply,
    split_request,
    tool_hash,
)
from perdure.llm._stream import Continuation, StreamAssembler
from perdure.llm._tokens import (
    APPROXIMATION_FACTOR,
    BpeTokenCounter,
    ScaledTokenCounter,
    TokenCounter,
    counter_for_model,
    load_counter,
)
from perdure.llm._types import (
    ImagePart,
    Message,
    ModelParams,
    ModelRequest,
    Part,
    Role,
    TextPart,
    ToolCall,
    ToolSpec,
)
from perdure.llm._window import (
    CompactionPlan,
    PromptView,
    Summary,
    plan_compaction,
    prompt_view,
)

_require_extra()

__all__ = [
    "APPROXIMATION_FACTOR",
    "AnthropicClient",
    "ApiKey",
    "BpeTokenCounter",
    "Budget",
    "CallFailure",
    "CallTable",
    "Charge",
    "ChatCompletionsClient",
    "ChunkBatcher",
    "CompactionPlan",
    "ContextPolicy",
    "Continuation",
    "FailureKind",
    "FlushPolicy",
    "ImagePart",
    "Ledger",
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
    "RecordedCall",
    "Recovery",
    "RecoveryMarker",
    "RequestRefs",
    "ResponsesClient",
    "Role",
    "Salvage",
    "ScaledTokenCounter",
    "SplitReply",
    "SplitRequest",
    "StoredCallError",
    "StreamAssembler",
    "StreamChunk",
    "StreamTexts",
    "Summary",
    "TextPart",
    "TokenCounter",
    "ToolCall",
    "ToolCallDelta",
    "ToolSpec",
    "Usage",
    "broken_stream",
    "canonical",
    "choose_recovery",
    "classify_exception",
    "classify_status",
    "content_hash",
    "continuation_of",
    "cost_of",
    "counter_for_model",
    "genai_attributes",
    "join_reply",
    "join_request",
    "load_counter",
    "lost_usage",
    "message_hash",
    "micro_dollars",
    "parse_retry_after",
    "plan_compaction",
    "prompt_view",
    "provider_name",
    "recorded_calls",
    "reply_failure",
    "request_hash",
    "request_refs",
    "reservation_for",
    "split_reply",
    "split_request",
    "tool_hash",
]
