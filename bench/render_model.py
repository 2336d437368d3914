"""Markdown tables of the ``model`` part of a ``python -m bench`` document."""

from __future__ import annotations

from typing import Any

from bench.render import _num, _ratio, _table

__all__ = ["conversation_table", "stream_table"]


def conversation_table(report: dict[str, Any]) -> str:
    """Bytes per turn of a conversation: perdure's records and store, LangGraph's store."""
    conv = (report.get("model") or {}).get("conversation")
    if not conv:
        return ""
    rows = []
    for key, got in conv.items():
        if not key.isdigit():
            continue
        peer = got.get("langgraph") or {"na": "not run (--no-peers)"}
        lg = ("n/a" if "na" in peer else _num(peer["store_bytes_per_turn"], " B"))
        ps = got.get("langgraph_perdure_saver") or {"na": "not run"}
        lp = ("n/a" if "na" in ps else _num(ps["store_bytes_per_turn"], " B"))
        rows.append([f"{got['turns']:,}", _num(got["unique_message_bytes_per_turn"], " B"),
                     _num(got["record_bytes_per_turn"], " B"),
                     f"{_ratio(got['records_to_unique'])} "
                     f"({'within' if got['within_bound'] else 'over'} {conv['bound']:g}×)",  # noqa: RUF001
                     _num(got["store_bytes_per_turn"], " B"), lg,
                     _ratio(got.get("langgraph_to_perdure_store")), lp,
                     _ratio(got.get("perdure_saver_to_sqlite_saver"))])
    return _table(["turns", "unique messages per turn", "perdure records per turn",
                   "records / unique messages", "perdure store per turn",
                   "LangGraph SqliteSaver store per turn", "LangGraph / perdure",
                   "LangGraph PerdureSaver store per turn", "PerdureSaver / SqliteSaver"],
                  rows)


def stream_table(report: dict[str, Any]) -> str:
    """Tokens per second of one long stream: plain SDK, perdure's client, ``run.model``."""
    model = report.get("model") or {}
    rows = [_stream_row(model[k]) for k in ("stream", "stream_paced") if k in model]
    if not rows:
        return ""
    return _table(["stream", "plain openai SDK tokens/s", "perdure client, no journal",
                   "run.model(stream=True)", "journal batches", "overhead vs plain SDK"],
                  rows)


def _stream_row(got: dict[str, Any]) -> list[str]:
    pace = f", {got['pace_s'] * 1000:g} ms per token" if got.get("pace_s") else ", no pacing"
    return [f"{got['tokens']:,} tokens{pace}, {got['rounds']} rounds",
           _num(got["plain_sdk_tokens_per_s"]), _num(got["client_tokens_per_s"]),
           _num(got["run_model_tokens_per_s"]), _num(got["batches_per_stream"]),
           f"{got['overhead_pct']:.1f}% ({got['verdict']}, target ≤ {got['target_pct']:g}%)"]
