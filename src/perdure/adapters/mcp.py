"""Tools from MCP servers, behind the same gate: ``pip install 'perdure[mcp]'``.

``mcp_tools(command, args)`` starts an MCP server over stdio (the Model Context Protocol,
through its official Python SDK), lists its tools and returns a ``perdure.Tool`` for each:
its name (with an optional ``prefix``), description and input schema as the server
declares them, a risk level and idempotency, and constraints you give. Register them with
``app.tool(tool)``; ``run.agent`` then offers them to the model, and each call goes
through the policy gate, a person if need be, and runs as a recorded tool call like any
other. A call opens its own session with the server (a fresh process), so it works from
any worker, after any crash.

Risk and idempotency follow the MCP specification's defaults, where a tool that does not
say it is read-only is assumed to change things, destructively unless it says otherwise:

- ``risks`` names a tool's level: the user's registration always wins;
- else a tool annotated ``readOnlyHint: true``, or not read-only but
  ``destructiveHint: false``, is ``default_risk`` (``medium``);
- else (not annotated at all, not read-only with ``destructiveHint`` true or left out)
  it is ``destructive_risk`` (``high``: a person decides under the default policy).

A tool is idempotent only when the server marks it ``idempotentHint`` (or ``idempotent``
names it): anything else records ``tool_started`` first and is in doubt after a crash,
never run twice. A result the server flags as an error raises ``ToolCallError`` (the
model is told it failed).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from perdure.core.constraints import Constraint
from perdure.core.gate import RISKS
from perdure.errors import ConfigurationError, ToolCallError
from perdure.tools import Tool

__all__ = ["McpServer", "annotated_risk", "mcp_tools"]


def _sdk() -> Any:
    """The SDK, with what its first call would load lazily loaded now: the SDK checks a
    tool's result against its output schema with ``jsonschema``, imported on first use
    (a few hundred ms), so this runs on a thread, never on a worker's loop."""
    try:
        import mcp
        from mcp.client.stdio import stdio_client
    except ImportError as exc:
        raise ConfigurationError(
            "MCP tools need the mcp extra: pip install 'perdure[mcp]'") from exc
    with contextlib.suppress(ImportError):
        import jsonschema.validators  # type: ignore[import-untyped]  # noqa: F401 - loads it
    return mcp, stdio_client


class McpServer:
    """How to start an MCP server over stdio: ``command``, ``args``, ``env`` and ``cwd``
    (``env=None``: the SDK's default environment)."""

    def __init__(self, command: str, args: Sequence[str] = (), *,
                 env: Mapping[str, str] | None = None, cwd: str | None = None) -> None:
        if not command:
            raise ConfigurationError("an MCP server needs a command")
        self.command = command
        self.args = list(args)
        self.env = dict(env) if env is not None else None
        self.cwd = cwd

    async def _session(self, work: Callable[[Any], Awaitable[Any]]) -> Any:
        mcp, stdio_client = await asyncio.to_thread(_sdk)
        params = mcp.StdioServerParameters(command=self.command, args=self.args,
                                           env=self.env, cwd=self.cwd)
        async with stdio_client(params) as streams:
            read, write = streams[0], streams[1]
            async with mcp.ClientSession(read, write) as session:
                await session.initialize()
                return await work(session)

    async def list_tools(self) -> list[Any]:
        """The server's tools as the SDK describes them."""
        async def listed(session: Any) -> list[Any]:
            return list((await session.list_tools()).tools)
        return list(await self._session(listed))

    async def call(self, name: str, arguments: Mapping[str, Any]) -> Any:
        """Call tool ``name``: its structured content (unwrapped from the SDK's
        ``{"result": ...}`` around a plain value), else its text parts joined;
        ``ToolCallError`` if the server says the call failed."""
        async def called(session: Any) -> Any:
            return await session.call_tool(name, dict(arguments))
        result = await self._session(called)
        texts = [str(getattr(part, "text", "")) for part in result.content
                 if getattr(part, "type", "") == "text"]
        error = getattr(result, "is_error", None)
        if error is None:
            error = getattr(result, "isError", False)
        if error:
            raise ToolCallError(f"MCP tool {name!r} failed: {' '.join(texts) or 'no detail'}")
        structured = getattr(result, "structured_content", None)
        if structured is None:
            structured = getattr(result, "structuredContent", None)
        if isinstance(structured, dict) and list(structured) == ["result"]:
            structured = structured["result"]  # the SDK's wrapper around a plain return
        return structured if structured is not None else "\n".join(texts)


def _run(coro: Awaitable[Any]) -> Any:
    """Run ``coro`` to its end, on a thread of its own if a loop runs here."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)  # type: ignore[arg-type]
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(coro)  # type: ignore[arg-type]
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller
            box["error"] = exc
    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def _hint(tool: Any, name: str) -> bool | None:
    """The tool's annotation ``name`` (``readOnlyHint``...), ``None`` when not given."""
    annotations = getattr(tool, "annotations", None)
    if annotations is None:
        return None
    snake = re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
    value = getattr(annotations, snake, None)
    if value is None:
        value = getattr(annotations, name, None)
    return None if value is None else bool(value)


def annotated_risk(tool: Any, default_risk: str = "medium",
                   destructive_risk: str = "high") -> str:
    """The risk of an MCP tool from its annotations alone (see the module): read-only or
    said not destructive, ``default_risk``; anything else, ``destructive_risk``."""
    if _hint(tool, "readOnlyHint") or _hint(tool, "destructiveHint") is False:
        return default_risk
    return destructive_risk


def mcp_tools(server: McpServer | str, args: Sequence[str] = (), *, prefix: str = "",
              only: Sequence[str] | None = None, default_risk: str = "medium",
              destructive_risk: str = "high",
              risks: Mapping[str, str] | None = None, idempotent: Sequence[str] = (),
              constraints: Mapping[str, Sequence[Constraint]] | None = None,
              capabilities: Sequence[str] = ()) -> list[Tool]:
    """The tools of an MCP server (``server``, or a command with ``args``), as
    ``perdure.Tool``s (see the module). ``only`` keeps the named ones; ``prefix`` is put
    before each name; ``risks`` maps a tool's name to its risk, else ``default_risk``
    (read-only or not destructive) or ``destructive_risk`` (anything else, unannotated
    included) applies; ``constraints`` maps a tool's name to its constraints;
    ``capabilities`` are needed by every one. ``ConfigurationError`` when the SDK is
    missing, a name is unusable or an option names an unknown tool."""
    spec = server if isinstance(server, McpServer) else McpServer(server, args)
    for option, level in (("default_risk", default_risk),
                          ("destructive_risk", destructive_risk),
                          *((f"risks[{k!r}]", v) for k, v in (risks or {}).items())):
        if level not in RISKS:
            raise ConfigurationError(f"{option} must be one of {', '.join(RISKS)}, "
                                     f"not {level!r}")
    listed = _run(spec.list_tools())
    found = {str(t.name): t for t in listed}
    named = set(only or ()) | set(risks or {}) | set(idempotent) | set(constraints or {})
    unknown = sorted(named - set(found))
    if unknown:
        raise ConfigurationError(f"the MCP server has no tool {', '.join(unknown)} "
                                 f"(it offers {', '.join(sorted(found)) or 'none'})")
    tools = []
    for name, item in found.items():
        if only is not None and name not in only:
            continue
        risk = (risks or {}).get(name) or annotated_risk(item, default_risk,
                                                         destructive_risk)
        schema = getattr(item, "input_schema", None) or getattr(item, "inputSchema", None)

        def caller(tool_name: str = name) -> Callable[..., Awaitable[Any]]:
            async def call(**arguments: Any) -> Any:
                return await spec.call(tool_name, arguments)
            return call

        made = Tool.of(caller(), name=f"{prefix}{name}",
                       description=str(getattr(item, "description", "") or ""),
                       risk=risk,
                       idempotent=name in idempotent or bool(_hint(item, "idempotentHint")),
                       capabilities=capabilities,
                       constraints=tuple((constraints or {}).get(name, ())),
                       schema=dict(schema or {"type": "object", "properties": {}}))
        tools.append(made)
    return tools
