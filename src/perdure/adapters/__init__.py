"""Adapters: other agent frameworks and tool protocols, behind perdure's gate and memory.

``mcp`` (tools from MCP servers: ``pip install 'perdure[mcp]'``), ``pydantic_ai``
(Pydantic AI agents whose model and tool calls are recorded: ``pip install
'perdure[pydantic-ai]'``) and ``langgraph`` (``PerdureSaver``, a LangGraph checkpointer
keeping each thread as a perdure object: ``pip install 'perdure[langgraph]'``). Each
imports its SDK only when used.
"""

__all__: list[str] = []
