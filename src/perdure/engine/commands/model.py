"""``run.model``: ask a model, durably; on replay, return the reply memory holds.

The replay rule: a position holding a ``model_call`` returns its reply, rebuilt from
memory, and no provider is called; one whose last ``model_failed`` is final raises the
same ``ModelCallError`` the agent got the first time. The request the agent makes must
hash to the one recorded (else the object parks: the code no longer asks what memory
answered).

The execution rule, for a position with no outcome yet: choose a client from the call's
fallback list by what memory says of this call's earlier attempts (``model_calls``),
send the request (streaming it, journaled in batches, with ``stream=True``:
``model_streams``), record the reply with its usage, cost and attributes, or the failure
with when that client may be tried again. A rate-limited or failing call leaves the
object dormant until a client may be tried (no process sleeps, no lease is held); one no
client can answer raises ``ModelCallError``.

The model only proposes: a reply's tool calls are values for the agent, and nothing here
runs a tool. The implementation needs the ``perdure[llm]`` extra and is imported at the
first call, so ``import perdure`` does not need it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from perdure.core.backoff import RetryPolicy

if TYPE_CHECKING:
    from perdure.engine.run import Run
    from perdure.llm import (
        ContextPolicy,
        FlushPolicy,
        Message,
        ModelClient,
        ModelParams,
        ModelReply,
        ModelRequest,
        PriceTable,
        Recovery,
        ToolSpec,
    )

__all__ = ["model"]


async def model(
    self: Run,
    client: ModelClient | Sequence[ModelClient | tuple[ModelClient, str]],
    request: ModelRequest | None = None,
    *,
    model: str | None = None,
    messages: Sequence[Message] = (),
    tools: Sequence[ToolSpec] = (),
    params: ModelParams | None = None,
    stream: bool = False,
    name: str | None = None,
    prices: PriceTable | None = None,
    retry: RetryPolicy | None = None,
    wait_up_to: float = 10.0,
    recovery: Recovery | str = "continue",
    flush: FlushPolicy | None = None,
    context: ContextPolicy | None = None,
) -> ModelReply:
    """Ask a model once, durably; on replay return the recorded reply without calling.

    ``client`` is a model client (``perdure.llm.ChatCompletionsClient`` and friends) or a
    fallback list of them, tried in order; an entry ``(client, "model-name")`` asks that
    client for another model than the request names. ``request`` is a
    ``perdure.llm.ModelRequest``, or give ``model=``, ``messages=``, ``tools=`` and
    ``params=`` instead. The call is recorded under ``name`` (default: the model).

    ``stream=True`` streams the reply, journaling it in batches (``flush``, default every
    100 ms or 64 tokens), so a worker killed mid-stream loses at most one batch; on
    resume ``recovery`` (``continue``, ``restart`` or ``surface``) says what to do with
    the salvaged text, and the choice is recorded.

    Failures are perdure's to handle, from memory: a rate-limited or transient failure
    makes the object dormant until the client may be tried again (``retry`` sets the
    attempts per client and the pace; the provider's ``retry-after`` is honoured); a
    client that cannot be tried within ``wait_up_to`` seconds, or that gave up, is
    skipped for the next one in the list; when none is left the agent gets
    ``perdure.llm.ModelCallError``, the same on every replay. ``prices`` (a
    ``perdure.llm.PriceTable``) gives the call's cost; without it, the App's table.

    ``context`` (a ``perdure.llm.ContextPolicy``) keeps the prompt within the model's
    window: pass the whole conversation, and the request sent is a view of it (system
    messages, the summary in force, the latest turns that fit, never a tool call split
    from its results); older turns are first summarised by a recorded model call
    (``<name>.summary``) when the policy says so. A summary call that fails or is
    refused changes nothing. Memory keeps every message.

    Returns a ``perdure.llm.ModelReply``: a proposal (text and/or tool calls). Nothing
    runs a tool.
    """
    from perdure.engine.commands import model_calls  # needs the perdure[llm] extra

    options = model_calls.CallOptions.build(
        name=name, stream=stream, prices=prices, retry=retry, wait_up_to=wait_up_to,
        recovery=recovery, flush=flush)
    asked = model_calls.request_of(request, model=model, messages=messages, tools=tools,
                                   params=params)
    if context is not None:
        from perdure.engine.commands.model_context import fit

        asked = await fit(self, client, asked, context, options)
    return await model_calls.call(self, client, asked, options)
