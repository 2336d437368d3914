"""Pydantic AI agents, durable: ``pip install 'perdure[pydantic-ai]'``.

``await run_pydantic_agent(run, agent, prompt, client=..., model=..., policy=...)`` runs a
``pydantic_ai.Agent`` inside a perdure agent with its two extension points swapped:

- the model is a ``FunctionModel`` whose every request is a recorded ``run.model`` call
  (the agent's tools offered as their JSON schemas): on replay the recorded reply comes
  back and the provider is not asked again;
- its toolsets are wrapped so that every tool call is a perdure tool call: a proposal,
  the policy gate, a person if the tool's risk asks for one (the object goes dormant),
  then the tool, run once and recorded. A denied or rejected call returns to the model as
  the tool's result saying so, as in ``run.agent``.

Risk and idempotency of the agent's tools come from ``risks`` / ``default_risk`` and
``idempotent`` (names; a tool not named is idempotent). Tool results must be JSON values
(memory holds them). The pydantic-ai agent's own settings (instructions, output type,
retries) are kept.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from perdure.core.gate import RISKS, Policy
from perdure.engine.commands.tools import call_tool
from perdure.errors import ConfigurationError, PerdureSignal
from perdure.tools import Tool

if TYPE_CHECKING:
    from perdure.engine.run import Run

__all__ = ["run_pydantic_agent"]


def _sdk() -> Any:
    """``pydantic_ai`` and the modules used here, imported (on a thread: importing them
    builds pydantic validators, most of a second that must not hold up the loop)."""
    try:
        import pydantic_ai
        import pydantic_ai.messages
        import pydantic_ai.models.function
        import pydantic_ai.toolsets
    except ImportError as exc:
        raise ConfigurationError("Pydantic AI agents need the pydantic-ai extra: "
                                 "pip install 'perdure[pydantic-ai]'") from exc
    return pydantic_ai


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(part if isinstance(part, str) else "" for part in content)
    return json.dumps(content, default=str, sort_keys=True)


def _messages(history: Sequence[Any], instructions: str | None) -> list[Any]:
    """Pydantic AI's message history as perdure's ``Message`` list."""
    from pydantic_ai import messages as pm

    from perdure.llm import Message, ToolCall

    out: list[Any] = [Message.system(instructions)] if instructions else []
    for item in history:
        if isinstance(item, pm.ModelRequest):
            for part in item.parts:
                if isinstance(part, pm.SystemPromptPart):
                    out.append(Message.system(part.content))
                elif isinstance(part, pm.UserPromptPart):
                    out.append(Message.user(_text(part.content)))
                elif isinstance(part, pm.ToolReturnPart):
                    out.append(Message.tool(part.tool_call_id, part.model_response_str()))
                elif isinstance(part, pm.RetryPromptPart):
                    text = part.model_response()
                    out.append(Message.tool(part.tool_call_id, text) if part.tool_name
                               else Message.user(text))
        elif isinstance(item, pm.ModelResponse):
            text = "".join(p.content for p in item.parts if isinstance(p, pm.TextPart))
            calls = [ToolCall(p.tool_call_id, p.tool_name, p.args_as_json_str())
                     for p in item.parts if isinstance(p, pm.ToolCallPart)]
            out.append(Message.assistant(text, calls))
    return out


class _Gate:
    """The options of one run: what the wrapped toolsets need."""

    def __init__(self, run: Run, policy: Policy, risks: Mapping[str, str], default_risk: str,
                 idempotent: frozenset[str] | None) -> None:
        self.run = run
        self.policy = policy
        self.risks = risks
        self.default_risk = default_risk
        self.idempotent = idempotent  # None: every tool is
        self.model_call = ""  # the position of the model call whose tool calls run now

    def tool(self, name: str, description: str, schema: Mapping[str, Any], call: Any) -> Tool:
        return Tool(call, name, description or "", dict(schema),
                    self.risks.get(name, self.default_risk),
                    self.idempotent is None or name in self.idempotent)


def _wrapped(toolset: Any, gate: _Gate) -> Any:
    from pydantic_ai.toolsets import WrapperToolset

    class GatedToolset(WrapperToolset[Any]):
        """Every call through perdure's proposal, gate, approval and recorded call."""

        async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: Any,
                            tool: Any) -> Any:
            inner = self.wrapped

            async def invoke(**arguments: Any) -> Any:
                return await inner.call_tool(name, arguments, ctx, tool)

            definition = tool.tool_def
            perdure_tool = gate.tool(name, definition.description,
                                     definition.parameters_json_schema, invoke)
            outcome = await call_tool(gate.run, name, json.dumps(tool_args),
                                      str(ctx.tool_call_id or ""), {name: perdure_tool},
                                      gate.policy, model_call=gate.model_call)
            return outcome.result if outcome.ok else outcome.text()

    return GatedToolset(toolset)


def _signal(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The perdure signal (dormancy, parking, ...) a task group wrapped, if any."""
    for exc in group.exceptions:
        if isinstance(exc, PerdureSignal):
            return exc
        if isinstance(exc, BaseExceptionGroup):
            found = _signal(exc)
            if found is not None:
                return found
    return None


async def run_pydantic_agent(run: Run, agent: Any, prompt: str, *, client: Any, model: str,
                             policy: Policy, risks: Mapping[str, str] | None = None,
                             default_risk: str = "low", idempotent: Sequence[str] | None = None,
                             name: str = "pydantic-ai", **run_options: Any) -> Any:
    """Run ``agent`` (a ``pydantic_ai.Agent``) on ``prompt`` durably (see the module);
    its ``AgentRunResult``. ``client`` and ``model`` are what ``run.model`` asks;
    ``idempotent``: when given, only the named tools are idempotent (the others record
    ``tool_started`` first). ``run_options`` go to ``agent.run`` (``deps=``, ...)."""
    await asyncio.to_thread(_sdk)
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from perdure.llm import ToolSpec

    if default_risk not in RISKS or any(r not in RISKS for r in (risks or {}).values()):
        raise ConfigurationError(f"risk levels are {RISKS}")
    gate = _Gate(run, policy, dict(risks or {}), default_risk,
                 frozenset(idempotent) if idempotent is not None else None)

    async def ask(history: list[Any], info: AgentInfo) -> Any:
        tools = [ToolSpec(t.name, t.description or "", dict(t.parameters_json_schema))
                 for t in (*info.function_tools, *info.output_tools)]
        gate.model_call = run.next_position()
        reply = await run.model(client, model=model, messages=_messages(history, info.instructions),
                                tools=tools, name=name)
        parts: list[Any] = [TextPart(reply.text)] if reply.text else []
        parts += [ToolCallPart(c.name, c.arguments, c.id) for c in reply.tool_calls]
        return ModelResponse(parts=parts or [TextPart("")], model_name=reply.model)

    toolsets = [_wrapped(t, gate) for t in agent.toolsets]
    try:
        with agent.override(model=FunctionModel(ask, model_name=model), tools=(),
                            toolsets=toolsets):
            return await agent.run(prompt, **run_options)
    except BaseExceptionGroup as group:
        found = _signal(group)
        if found is not None:
            raise found from None
        raise
