"""Context-window management as pure functions: the prompt is a view, memory keeps all.

A conversation (every message, append-only, in memory) is never cut. What is sent is a
*view*: the leading system messages, then a summary of older turns if there is one,
then as many recent turns as fit the window. ``prompt_view`` computes it.

The view is cut only between *units*, never inside one: a unit is a user message, an
assistant message, or an assistant message with tool calls together with the tool
messages answering them. So a tool result never arrives without the call it answers,
and a call never loses its results (providers answer 400 to either). Cuts prefer *turn*
boundaries (a turn starts at a user message); only when the latest turn alone does not
fit is it cut between its units. The leading system messages are never dropped. A tool
message that answers no call in the conversation itself is left out of every view.

Compaction summarises older turns with a model call: ``plan_compaction`` says which
messages a summary would replace and builds that call's request; the engine records
the call, and only a summary that came back becomes ``plan.apply(text)``, the new
``Summary``. A failed or refused summary changes nothing: the previous summary (or none)
stays, and ``prompt_view`` keeps fitting the window by leaving older turns out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from perdure.llm._tokens import TokenCounter
from perdure.llm._types import Message, ModelParams, ModelRequest, ToolSpec

__all__ = [
    "SUMMARY_INSTRUCTIONS",
    "CompactionPlan",
    "PromptView",
    "Summary",
    "plan_compaction",
    "prompt_view",
    "units",
]

SUMMARY_INSTRUCTIONS = (
    "You summarise the earlier part of a conversation between a user and an assistant "
    "so that the assistant can go on without it. Keep every fact, decision, open "
    "question, name, number and tool result that may matter later; drop pleasantries. "
    "Write plain prose, no preamble."
)
_SUMMARY_HEADER = "Summary of the earlier conversation:\n"


@dataclass(frozen=True, slots=True)
class Summary:
    """A summary of the conversation's messages before ``through`` (after the leading
    system messages): the view puts it in place of those messages."""

    text: str
    through: int

    def message(self) -> Message:
        """The summary as the system message the view carries."""
        return Message.system(_SUMMARY_HEADER + self.text)


@dataclass(frozen=True, slots=True)
class PromptView:
    """The messages to send, where the kept conversation starts (``start``: the index of
    its first kept message after the leading system messages), their token count and
    whether it is within the budget (``fits`` is false only when the latest unit alone
    is too large: then the view holds just that unit)."""

    messages: tuple[Message, ...]
    start: int
    tokens: int
    fits: bool
    summarised: bool


def _head_end(messages: Sequence[Message]) -> int:
    end = 0
    while end < len(messages) and messages[end].role == "system":
        end += 1
    return end


def units(messages: Sequence[Message], start: int = 0) -> list[tuple[int, int]]:
    """The units of ``messages[start:]`` as ``(first, stop)`` index ranges, in order.
    A tool message that answers no call of the unit before it is left out (an orphan in
    the conversation itself)."""
    out: list[tuple[int, int]] = []
    i = start
    while i < len(messages):
        message = messages[i]
        if message.role == "tool":  # answers nothing before it: never sent
            i += 1
            continue
        stop = i + 1
        if message.tool_calls:
            ids = {c.id for c in message.tool_calls}
            while (stop < len(messages) and messages[stop].role == "tool"
                   and messages[stop].tool_call_id in ids):
                stop += 1
        out.append((i, stop))
        i = stop
    return out


def _first_fit(costs: Sequence[int], budget: int, allowed: Sequence[bool]) -> int | None:
    """The smallest index ``k`` with ``allowed[k]`` and ``sum(costs[k:]) <= budget``."""
    suffix = 0
    best: int | None = None
    for k in range(len(costs) - 1, -1, -1):
        suffix += costs[k]
        if suffix > budget:
            break
        if allowed[k]:
            best = k
    return best


def prompt_view(messages: Sequence[Message], *, window: int, counter: TokenCounter,
                tools: Sequence[ToolSpec] = (), reserve: int = 0,
                summary: Summary | None = None) -> PromptView:
    """The prompt for ``messages`` within ``window`` tokens, ``reserve`` of which are
    kept for the reply: leading system messages, ``summary`` (if any) and the latest
    units that fit, cut at a turn boundary when one fits."""
    head = tuple(messages[:_head_end(messages)])
    fixed = list(head) + ([summary.message()] if summary is not None else [])
    begin = max(len(head), summary.through if summary is not None else 0)
    spans = units(messages, begin)
    fixed_cost = counter.count_prompt(fixed, tools)
    budget = window - reserve - fixed_cost
    costs = [sum(counter.count_message(messages[j]) for j in range(a, b)) for a, b in spans]
    turn_starts = [messages[a].role == "user" or k == 0 for k, (a, _) in enumerate(spans)]
    chosen = _first_fit(costs, budget, turn_starts)
    if chosen is None:  # the latest turn alone does not fit: cut between its units
        chosen = _first_fit(costs, budget, [True] * len(costs))
    fits = chosen is not None or (not spans and budget >= 0)
    if chosen is None:
        chosen = max(len(spans) - 1, 0)
    kept = spans[chosen:]
    body = [messages[j] for a, b in kept for j in range(a, b)]
    return PromptView(
        messages=tuple(fixed + body),
        start=kept[0][0] if kept else len(messages),
        tokens=fixed_cost + sum(costs[chosen:]),
        fits=fits,
        summarised=summary is not None,
    )


def _transcript(messages: Sequence[Message]) -> str:
    lines: list[str] = []
    for message in messages:
        if message.text:
            lines.append(f"{message.role}: {message.text}")
        for call in message.tool_calls:
            lines.append(f"{message.role} calls tool {call.name}({call.arguments}) "
                         f"[{call.id}]")
    return "\n\n".join(lines)


@dataclass(frozen=True, slots=True)
class CompactionPlan:
    """Which messages a summary call would replace: ``[start, stop)`` of the
    conversation, on unit boundaries, folded together with ``previous`` (the summary in
    force, if any)."""

    start: int
    stop: int
    previous: Summary | None

    def request(self, messages: Sequence[Message], model: str, *,
                instructions: str = SUMMARY_INSTRUCTIONS,
                max_tokens: int | None = 1024) -> ModelRequest:
        """The summary call: instructions, then the previous summary and the messages to
        replace as a plain transcript (tool calls and results as text, so the call
        itself holds no tool pairs)."""
        parts = []
        if self.previous is not None:
            parts.append(_SUMMARY_HEADER + self.previous.text)
        parts.append("Conversation to summarise:\n\n"
                     + _transcript(messages[self.start:self.stop]))
        return ModelRequest(model, (Message.system(instructions),
                                    Message.user("\n\n".join(parts))),
                            params=ModelParams(max_tokens=max_tokens))

    def apply(self, text: str) -> Summary:
        """The new summary, once the summary call returned ``text``."""
        return Summary(text, self.stop)


def plan_compaction(messages: Sequence[Message], *, window: int, counter: TokenCounter,
                    tools: Sequence[ToolSpec] = (), reserve: int = 0,
                    summary: Summary | None = None, trigger: float = 0.8,
                    keep: float = 0.5) -> CompactionPlan | None:
    """A plan to summarise older turns, or ``None`` when none is needed or possible.

    Needed when the prompt (summary included) would leave something out or take more
    than ``trigger`` of the budget. The plan keeps the latest turns that take at most
    ``keep`` of the budget and replaces what lies between the current summary and them,
    as much as one summary call can read (``window`` minus ``reserve``).
    """
    head_end = _head_end(messages)
    begin = max(head_end, summary.through if summary is not None else 0)
    spans = units(messages, begin)
    if len(spans) < 2:
        return None
    fixed = list(messages[:head_end]) + ([summary.message()] if summary is not None else [])
    budget = window - reserve - counter.count_prompt(fixed, tools)
    costs = [sum(counter.count_message(messages[j]) for j in range(a, b)) for a, b in spans]
    if sum(costs) <= budget * trigger:
        return None
    turn_starts = [messages[a].role == "user" for a, _ in spans]
    keep_from = _first_fit(costs, int(budget * keep), turn_starts)
    if keep_from is None:
        keep_from = _first_fit(costs, int(budget * keep), [True] * len(costs))
    keep_from = len(spans) - 1 if keep_from is None else keep_from
    reader = window - reserve - counter.count_prompt([Message.system(SUMMARY_INSTRUCTIONS)])
    taken, stop_unit = 0, 0
    while stop_unit < keep_from and (stop_unit == 0 or taken + costs[stop_unit] <= reader):
        taken += costs[stop_unit]
        stop_unit += 1
    if stop_unit == 0:
        return None
    return CompactionPlan(spans[0][0], spans[stop_unit][0], summary)
