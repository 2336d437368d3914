"""LangGraph's checkpointer holding the model-call benchmark's conversation.

``python -m bench.peers.langgraph_model --db FILE --turns N`` runs the conversation of
``bench/model.py`` (the same system message, the same user messages, the same echoed
replies) through a minimal ``StateGraph``: a ``messages`` state whose reducer appends,
and one node ``reply`` that answers the last user message as the scripted server does
(``echo: <text>``). Each turn is one ``invoke`` on the same thread with
``SqliteSaver`` and ``durability="sync"``: the checkpointer stores the state after
every turn, as LangGraph's agents do. It prints one JSON line: the store's bytes (the
SQLite file after a checkpoint of its WAL) and the number of checkpoints.

``--saver perdure`` runs the same graph with perdure's ``PerdureSaver`` on a perdure
SQLite store in ``--db`` (the thread is a perdure object; checkpoints are its records).
"""

from __future__ import annotations

import argparse
import json
import operator
import sqlite3
import sys
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph

from bench import storage
from bench.model_conversation import SYSTEM, user_text

__all__ = ["conversation", "main", "perdure_conversation"]


class State(TypedDict):
    """The conversation so far: messages as ``{"role", "content"}`` dicts, appended."""

    messages: Annotated[list[dict[str, str]], operator.add]


def _reply(state: State) -> dict[str, Any]:
    last = next(m for m in reversed(state["messages"]) if m["role"] == "user")
    return {"messages": [{"role": "assistant", "content": f"echo: {last['content']}"}]}


def _builder() -> Any:
    builder = StateGraph(State)
    builder.add_node("reply", _reply)
    builder.add_edge(START, "reply")
    builder.add_edge("reply", END)
    return builder


def _turns(graph: Any, config: Any, turns: int) -> None:
    for i in range(turns):
        sent = [{"role": "user", "content": user_text(i)}]
        if i == 0:
            sent.insert(0, {"role": "system", "content": SYSTEM})
        graph.invoke({"messages": sent}, config, durability="sync")


def perdure_conversation(db: Path, turns: int) -> dict[str, Any]:
    """``conversation`` with perdure's ``PerdureSaver`` on a perdure store in ``db``."""
    import perdure
    from perdure.adapters.langgraph import PerdureSaver, thread_object_id

    app = perdure.App(store=f"sqlite:///{db}", key_dir=db.parent / "keys")
    try:
        graph = _builder().compile(checkpointer=PerdureSaver(app))
        config: Any = {"configurable": {"thread_id": "conversation"}}
        _turns(graph, config, turns)
        records = app.store.records(thread_object_id("conversation"))
        checkpoints = sum(r.body.get("name") == "langgraph.checkpoint" for r in records)
        final = graph.get_state(config).values["messages"]
    finally:
        app.close()
    return {"turns": turns, "store_bytes": storage.sqlite_bytes(db),
            "checkpoints": checkpoints, "messages": len(final)}


def conversation(db: Path, turns: int) -> dict[str, Any]:
    """Run ``turns`` turns checkpointed in ``db``; its bytes and checkpoint count."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    builder = _builder()
    conn = sqlite3.connect(db, check_same_thread=False)
    try:
        graph = builder.compile(checkpointer=SqliteSaver(conn))
        config: Any = {"configurable": {"thread_id": "conversation"}}
        _turns(graph, config, turns)
        checkpoints = conn.execute("SELECT count(*) FROM checkpoints").fetchone()[0]
        final = graph.get_state(config).values["messages"]
    finally:
        conn.close()
    return {"turns": turns, "store_bytes": storage.sqlite_bytes(db),
            "checkpoints": int(checkpoints), "messages": len(final)}


def main(argv: list[str] | None = None) -> int:
    """Parse ``--db`` and ``--turns``, run the conversation, print its figures as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", type=Path, required=True)
    parser.add_argument("--turns", type=int, required=True)
    parser.add_argument("--saver", choices=["sqlite", "perdure"], default="sqlite")
    args = parser.parse_args(argv)
    run = perdure_conversation if args.saver == "perdure" else conversation
    print(json.dumps(run(args.db, args.turns)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
