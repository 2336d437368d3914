"""Tools from an MCP server (official SDK, stdio transport) behind the same gate: a tiny
server written here, its tools registered, the agent loop calling them through the policy
and a person."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.importorskip("mcp")

import perdure
from perdure.adapters.mcp import McpServer, mcp_tools
from perdure.llm import ChatCompletionsClient, Message
from perdure.llm.scripted import ScriptedReply, ScriptedServer, ScriptedToolCall
from tests.integration.engine_support import wait_until

SERVER = '''
import sys
try:
    from mcp.server.mcpserver import MCPServer as Server
except ImportError:
    from mcp.server.fastmcp import FastMCP as Server
from mcp.types import ToolAnnotations

server = Server("tiny")
SINK = sys.argv[1]


@server.tool(annotations=ToolAnnotations(readOnlyHint=True, idempotentHint=True))
def add(a: int, b: int) -> str:
    """Add two numbers."""
    return str(a + b)


@server.tool(annotations=ToolAnnotations(destructiveHint=True))
def erase(name: str) -> str:
    """Erase a record."""
    with open(SINK, "a") as out:
        out.write(name + "\\n")
    return f"erased {name}"


@server.tool()
def broken() -> str:
    """Always fails."""
    raise ValueError("disk on fire")


@server.tool(annotations=ToolAnnotations(title="Note"))
def note(text: str) -> str:
    """Says nothing of what it changes."""
    return text


@server.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=False))
def append(text: str) -> str:
    """Adds, never destroys."""
    return text


server.run()
'''


@pytest.fixture
def tiny(tmp_path: Path) -> McpServer:
    script = tmp_path / "tiny_server.py"
    script.write_text(SERVER)
    return McpServer(sys.executable, [str(script), str(tmp_path / "erased.txt")])


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as running:
        yield running


def test_the_servers_tools_become_perdure_tools(tiny: McpServer) -> None:
    tools = {t.name: t for t in mcp_tools(tiny, prefix="tiny_")}
    assert set(tools) == {"tiny_add", "tiny_erase", "tiny_broken", "tiny_note",
                          "tiny_append"}
    assert tools["tiny_add"].description == "Add two numbers."
    assert tools["tiny_add"].schema["properties"]["a"]["type"] == "integer"
    assert tools["tiny_add"].idempotent and tools["tiny_add"].risk == "medium"
    assert tools["tiny_erase"].risk == "high" and not tools["tiny_erase"].idempotent
    with pytest.raises(perdure.ConfigurationError, match="no tool nope"):
        mcp_tools(tiny, only=["nope"])


def test_a_tool_that_does_not_say_it_is_harmless_is_high_risk(tiny: McpServer) -> None:
    """The MCP specification's defaults: a tool is read-only only if it says so, and a
    tool that is not read-only is destructive unless it says it is not. Unannotated and
    silent tools are therefore high risk (a person decides); the user's registration
    (``risks``, ``destructive_risk``, ``default_risk``) says otherwise."""
    risk = {t.name: t.risk for t in mcp_tools(tiny)}
    assert risk == {"add": "medium", "append": "medium", "erase": "high",
                    "broken": "high", "note": "high"}
    risk = {t.name: t.risk for t in mcp_tools(
        tiny, risks={"broken": "low"}, destructive_risk="critical", default_risk="low")}
    assert risk == {"add": "low", "append": "low", "erase": "critical",
                    "broken": "low", "note": "critical"}
    with pytest.raises(perdure.ConfigurationError, match="destructive_risk must be one of"):
        mcp_tools(tiny, destructive_risk="severe")
    with pytest.raises(perdure.ConfigurationError, match="risks\\['add'\\] must be one of"):
        mcp_tools(tiny, risks={"add": "none"})


def test_mcp_tools_run_through_the_gate_and_a_person(
        make_app: Callable[..., perdure.App], server: ScriptedServer, tiny: McpServer,
        tmp_path: Path) -> None:
    """The model calls add (allowed), erase (high risk: a person approves), broken (fails)
    and an MCP tool the policy does not list (denied); each outcome is recorded and told."""
    app = make_app()
    for tool in mcp_tools(tiny, risks={"broken": "medium"}):  # not annotated: the user says
        app.tool(tool)
    policy = perdure.Policy("mcp", rules=(perdure.Allow({"add", "erase", "broken"}),))

    @app.agent(name="mcp_agent")
    async def mcp_agent(run: perdure.Run, base_url: str) -> list[list[object]]:
        client = ChatCompletionsClient(base_url=base_url, api_key=lambda: "test")
        try:
            result = await run.agent(client, model="gpt-4o", messages=[Message.user("go")],
                                     tools=app.tools, policy=policy)
        finally:
            await client.aclose()
        return [[o.tool, o.outcome, o.result, o.error] for o in result.calls]

    server.script(
        ScriptedReply(tool_calls=(
            ScriptedToolCall("add", json.dumps({"a": 2, "b": 3}), "c1"),
            ScriptedToolCall("erase", json.dumps({"name": "r1"}), "c2"),
            ScriptedToolCall("broken", "{}", "c3"))),
        ScriptedReply(text="done"))
    app.options(object_id="mcp-1").start("mcp_agent", server.openai_base_url)
    with app.background_worker():
        assert wait_until(lambda: bool(app.approvals()), timeout=30)
        [pending] = app.approvals()
        assert pending.tool == "erase" and pending.arguments == {"name": "r1"}
        app.approve("mcp-1", pending.proposal_id)
        calls = app.handle("mcp-1").result(timeout=60)
    assert calls[0][:3] == ["add", "done", "5"]
    assert calls[1][:3] == ["erase", "done", "erased r1"]
    assert calls[2][1] == "failed" and "ToolCallError" in calls[2][3]
    assert (tmp_path / "erased.txt").read_text() == "r1\n"
    kinds = [r.kind for r in app.history("mcp-1")]
    assert kinds.count("tool_started") == 2  # erase and broken are not idempotent
    assert app.verify("mcp-1").ok
