"""``run.model(..., context=ContextPolicy(...))``: the prompt as a view of the
conversation, with older turns summarised by a recorded model call when it would not
fit (``perdure.llm.ContextPolicy``).

Compaction is a model call like any other, made at its own position and named
``<policy name>.summary``, so it is recorded (request, reply, usage, cost) and replayed
from memory: on replay the same summary comes back and the same view is sent, without
calling anyone. It is atomic: a summary call that fails for good or is refused (an
error, a content filter, an empty text) changes nothing, the summary in force (or none)
stays, and the view still fits the window by leaving older turns out. The view is cut
between units only (``prompt_view``), so a tool call and its results are never split,
and nothing is deleted from memory: every call's record names the messages it sent.

The summary in force for each conversation is kept by the run as it goes; a replay
rebuilds it by replaying the summary calls in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from perdure.engine.commands.model_memory import ModelMemory
from perdure.llm import (
    ContextPolicy,
    ModelCallError,
    ModelClient,
    ModelRequest,
    load_counter,
    plan_compaction,
    prompt_view,
)

if TYPE_CHECKING:
    from perdure.engine.commands.model_calls import CallOptions
    from perdure.engine.run import Run

__all__ = ["fit"]

_REFUSED = frozenset({"content_filter", "refusal"})


async def fit(run: Run, clients: ModelClient | Sequence[ModelClient | tuple[ModelClient, str]],
              request: ModelRequest, policy: ContextPolicy, options: CallOptions
              ) -> ModelRequest:
    """``request`` with its messages made a view that fits ``policy.window``, after a
    recorded summary call when the policy asks for one."""
    from perdure.engine.commands.model_calls import call

    memory = ModelMemory.of(run)
    messages = request.messages
    counter = policy.counter or await load_counter(request.model)  # (read off the loop)
    summary = memory.summaries.get(policy.name)
    if summary is not None and summary.through > len(messages):
        summary = None  # a shorter conversation than the one summarised: start afresh
    plan = None
    if policy.compact:
        plan = plan_compaction(messages, window=policy.window, counter=counter,
                               tools=request.tools, reserve=policy.reserve,
                               summary=summary, trigger=policy.trigger, keep=policy.keep)
    if plan is not None:
        asked = plan.request(messages, policy.summary_model or request.model,
                             instructions=policy.instructions,
                             max_tokens=policy.summary_max_tokens)
        summarise = replace(options, name=f"{policy.name}.summary", stream=False)
        try:
            reply = await call(run, policy.summary_client or clients, asked, summarise)
        except ModelCallError:
            reply = None  # failed for good: nothing changes
        if (reply is not None and reply.text.strip() and not reply.tool_calls
                and reply.finish_reason not in _REFUSED):
            summary = plan.apply(reply.text.strip())
            memory.summaries[policy.name] = summary
    view = prompt_view(messages, window=policy.window, counter=counter,
                       tools=request.tools, reserve=policy.reserve, summary=summary)
    return replace(request, messages=view.messages)
