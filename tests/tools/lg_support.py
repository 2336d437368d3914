"""A small LangGraph graph for ``test_langgraph``: three nodes, interrupted before the
last; run as ``python -m tests.tools.lg_support STORE KEY_DIR THREAD`` it resumes the
thread in a process of its own and prints the final state as JSON."""

from __future__ import annotations

import json
import operator
import sys
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph

import perdure
from perdure.adapters.langgraph import PerdureSaver


class State(TypedDict):
    steps: Annotated[list[str], operator.add]
    topic: str


def plan(state: State) -> dict[str, Any]:
    return {"steps": [f"plan {state['topic']}"]}


def draft(state: State) -> dict[str, Any]:
    return {"steps": ["draft"]}


def publish(state: State) -> dict[str, Any]:
    return {"steps": ["publish"]}


def build(saver: PerdureSaver) -> Any:
    """The graph, compiled on ``saver``, stopping before ``publish``."""
    builder = StateGraph(State)
    builder.add_node("plan", plan)
    builder.add_node("draft", draft)
    builder.add_node("publish", publish)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "draft")
    builder.add_edge("draft", "publish")
    builder.add_edge("publish", END)
    return builder.compile(checkpointer=saver, interrupt_before=["publish"])


def main() -> None:
    store, key_dir, thread = sys.argv[1:4]
    app = perdure.App(store=store, key_dir=key_dir)
    try:
        graph = build(PerdureSaver(app))
        result = graph.invoke(None, {"configurable": {"thread_id": thread}})
        print(json.dumps(result))
    finally:
        app.close()


if __name__ == "__main__":
    main()
