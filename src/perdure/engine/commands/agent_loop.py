"""``run.agent``: the durable agent loop, model → proposals → gate → approvals →
execution → results → model, until a final answer or a limit.

Every turn is a recorded model call (``run.model``) and every tool call the model
returns is a recorded tool call (``run.tool`` in ``tools``), so a resumed loop replays
what memory holds: a model turn that was answered is not asked again, a tool call that
ran is not run again, a call waiting for a person still waits (the object dormant), and
a denied or rejected call goes back to the model as a tool message saying so. Several
tool calls in one turn run as branches of one ``run.gather``. Limits: ``max_turns``
model calls, ``max_tokens`` over the loop's replies, and ``deadline`` (seconds since
the epoch, read from a recorded clock), after which the loop stops and says why.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from perdure.core.gate import Policy
from perdure.engine.commands.tools import ToolOutcome, call_tool
from perdure.errors import ConfigurationError
from perdure.tools import Tool

if TYPE_CHECKING:
    from perdure.engine.run import Run
    from perdure.llm import Message, ModelClient, ModelParams

__all__ = ["AgentResult", "agent"]


@dataclass(frozen=True)
class AgentResult:
    """What the loop ended with: the final ``text``, why it stopped (``final``, ``turns``,
    ``budget`` or ``deadline``), the model turns taken, the whole conversation
    (``messages``) and every tool call's outcome."""

    text: str
    stopped: str
    turns: int
    messages: tuple[Any, ...] = ()
    calls: tuple[ToolOutcome, ...] = field(default_factory=tuple)
    tokens: int = 0


def _toolbox(tools: Sequence[Tool | Callable[..., Any]] | Mapping[str, Tool]) -> dict[str, Tool]:
    items = tools.values() if isinstance(tools, Mapping) else tools
    box: dict[str, Tool] = {}
    for item in items:
        tool = item if isinstance(item, Tool) else getattr(item, "__perdure_tool__", None)
        if not isinstance(tool, Tool):
            raise ConfigurationError(
                f"{item!r} is not a tool: register it with @app.tool(...) or perdure.tool")
        if tool.name in box:
            raise ConfigurationError(f"two tools are named {tool.name!r}")
        box[tool.name] = tool
    return box


async def agent(
    self: Run,
    client: ModelClient | Sequence[ModelClient | tuple[ModelClient, str]],
    *,
    model: str,
    messages: Sequence[Message],
    tools: Sequence[Tool | Callable[..., Any]] | Mapping[str, Tool] = (),
    policy: Policy,
    max_turns: int = 10,
    max_tokens: int | None = None,
    deadline: float | None = None,
    params: ModelParams | None = None,
    stream: bool = False,
    name: str = "agent",
) -> AgentResult:
    """Run the agent loop durably (see the module) and return its ``AgentResult``.

    ``client`` is a model client (or a fallback list, as for ``run.model``), ``model``
    and ``messages`` the first request; ``tools`` the tools offered (``Tool`` objects or
    functions registered with ``@app.tool``); ``policy`` the ``perdure.Policy`` the gate
    decides every proposal under. Each model turn is recorded under ``name``.
    """
    from perdure.llm import Message as Msg
    from perdure.llm import ToolCall

    if max_turns < 1:
        raise ConfigurationError("max_turns must be at least 1")
    if not isinstance(policy, Policy):
        raise ConfigurationError("policy must be a perdure.Policy")
    box = _toolbox(tools)
    specs = [tool.spec() for tool in box.values()]
    conversation: list[Any] = list(messages)
    outcomes: list[ToolOutcome] = []
    tokens = 0
    text = ""
    for turn in range(1, max_turns + 1):
        if deadline is not None and await self.now() >= deadline:
            return AgentResult(text, "deadline", turn - 1, tuple(conversation),
                               tuple(outcomes), tokens)
        at = str(self._key(consume=False))
        reply = await self.model(client, model=model, messages=conversation, tools=specs,
                                 params=params, stream=stream, name=name)
        tokens += reply.usage.total_tokens  # a fresh call counted itself (count_model_call)
        text = reply.text
        if not reply.tool_calls:
            conversation.append(reply.message())
            return AgentResult(text, "final", turn, tuple(conversation), tuple(outcomes),
                               tokens)
        # Every call needs an id its result can name (a server may leave it out).
        asked = [c if c.id else ToolCall(f"call_{turn}_{i}", c.name, c.arguments)
                 for i, c in enumerate(reply.tool_calls)]
        conversation.append(Msg.assistant(reply.text, asked))
        calls = [call_tool(self, c.name, c.arguments, c.id, box, policy, model_call=at)
                 for c in asked]
        done = [await calls[0]] if len(calls) == 1 else await self.gather(*calls)
        for call, outcome in zip(asked, done, strict=True):
            outcomes.append(outcome)
            conversation.append(Msg.tool(call.id, outcome.text()))
        if max_tokens is not None and tokens >= max_tokens:
            return AgentResult(text, "budget", turn, tuple(conversation), tuple(outcomes),
                               tokens)
    return AgentResult(text, "turns", max_turns, tuple(conversation), tuple(outcomes), tokens)
