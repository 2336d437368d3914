"""Adapters: other agent frameworks and tool protocols, behind perdure's gate and memory.

``mcp`` (tools from MCP servers: ``pip install 'perdure[mcp]'``) and ``pydantic_ai``
(Pydantic AI agents whose model and tool calls are recorded: ``pip install
'perdure[pydantic-ai]'``). Each imports its SDK only when used.
"""

__all__: list[str] = []
