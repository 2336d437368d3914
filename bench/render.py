"""Markdown tables of a ``python -m bench`` JSON document (for ``docs/benchmarks.md``).

``python -m bench.render FILE.json`` (or JSON on standard input) prints one table per
workload with a column per backend; ratios against each backend's own floor stand
beside the absolute numbers.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def _num(value: float | None, unit: str = "") -> str:
    """Three significant figures, thousands separated."""
    if value is None:
        return "–"  # noqa: RUF001
    if value >= 1000:
        text = f"{value:,.0f}"
    elif value >= 100:
        text = f"{value:.0f}"
    elif value >= 10:
        text = f"{value:.1f}"
    else:
        text = f"{value:.2f}"
    return f"{text}{unit}"


def _ratio(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}×" if value < 10 else f"{value:.1f}×"  # noqa: RUF001


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def steps_table(report: dict[str, Any]) -> str:
    """Floor, sequential and concurrent figures, a column per backend."""
    backends = [b for b in report["backends"].values() if "floor" in b]
    if not backends:
        return ""
    header = [""] + [b["store"] for b in backends]
    conc = backends[0]["concurrent"]
    shape = f"{conc['objects']} × {conc['steps_per_object']}"  # noqa: RUF001

    def row(label: str, cell: Any) -> list[str]:
        return [label] + [cell(b) for b in backends]

    rows = [
        row("floor: one INSERT + COMMIT, mean (median)", lambda b: (
            f"{_num(b['floor']['us_per_commit'], ' µs')} "
            f"({_num(b['floor']['us_per_commit_median'], ' µs')})")),
        row("floor: commits per second (from the mean)",
            lambda b: _num(b["floor"]["commits_per_s"], " /s")),
        row("sequential: µs per step, mean (median)", lambda b: (
            f"{_num(b['sequential']['us_per_step'], ' µs')} "
            f"({_num(b['sequential']['us_per_step_median'], ' µs')})")),
        row("sequential: steps per second", lambda b: _num(b["sequential"]["steps_per_s"], " /s")),
        row("sequential ÷ floor commit, mean (median)", lambda b: (
            f"**{_ratio(b['sequential']['ratio_to_floor_commit'])}** "
            f"({_ratio(b['sequential']['ratio_to_floor_commit_median'])})")),
        row(f"concurrent {shape}: steps per second",
            lambda b: _num(b["concurrent"]["steps_per_s"], " /s")),
        row("concurrent ÷ floor commits per second",
            lambda b: f"**{_ratio(b['concurrent']['ratio_to_single_commit_rate'])}**"),
        row("group floor: 25 INSERTs of 50 objects per COMMIT, rows per second",
            lambda b: _num(b["group_floor"]["rows_per_s"], " /s") if "group_floor" in b
            else "–"),  # noqa: RUF001
        row("concurrent ÷ group floor rows per second",
            lambda b: _ratio(b["concurrent"]["ratio_to_group_floor"])
            if "ratio_to_group_floor" in b["concurrent"] else "–"),  # noqa: RUF001
        row("concurrent: commits / appends (appends per commit)", lambda b: (
            f"{b['concurrent']['commits']:,} / {b['concurrent']['appends']:,} "
            f"({_num(b['concurrent']['appends_per_commit'])})")),
    ]
    baseline = report.get("baseline", {}).get("us_per_call")
    if baseline is not None:
        rows.append(row("Python baseline: one await of the trivial step",
                        lambda _b: _num(baseline, " µs")))
    return _table(header, rows)


def wake_table(report: dict[str, Any]) -> str:
    """Wake latency percentiles, a row per backend and wake mechanism."""
    rows = []
    for b in report["backends"].values():
        for figures in b.get("wake", {}).values():
            if figures["wake_by"] == "poll":
                how = f"polls every {figures['poll_s']:g} s"
            elif figures["wake_by"] == "socket":
                how = "push through the socket folder"
            else:
                how = "LISTEN/NOTIFY push"
            if figures["poll_s"] == 0.1:
                how += " (default)"
            rows.append([
                f"{b['store']}, {how}",
                _num(figures["ms_p50"], " ms"),
                _num(figures["ms_p90"], " ms"),
                _num(figures["ms_p99"], " ms"),
                _num(figures["ms_max"], " ms"),
                _num(figures["send_call_ms_median"], " ms"),
            ])
    if not rows:
        return ""
    return _table(["backend, worker", "p50", "p90", "p99", "max",
                   "`app.send` call (median)"], rows)


def claims_table(report: dict[str, Any]) -> str:
    """Objects per second by worker-process count, a row per backend."""
    backends = [b for b in report["backends"].values() if "claims" in b]
    if not backends:
        return ""
    counts = list(backends[0]["claims"])
    header = ["backend"] + [f"{n} worker{'s' if n != '1' else ''}" for n in counts]
    header.append("4 workers ÷ floor commits/s" if "4" in counts and "floor" in backends[0]
                  else "")
    rows = []
    for b in backends:
        one = b["claims"][counts[0]]["objects_per_s"]
        cells = [b["store"]]
        for n in counts:
            rate = b["claims"][n]["objects_per_s"]
            cells.append(f"{_num(rate, ' /s')} ({_ratio(rate / one)})")
        if "floor" in b and "4" in b["claims"]:
            cells.append(_ratio(b["claims"]["4"]["objects_per_s"] / b["floor"]["commits_per_s"]))
        else:
            cells.append("")
        rows.append(cells)
    if not header[-1]:
        header.pop()
        rows = [r[:-1] for r in rows]
    return _table(header, rows)


def _floor_for(report: dict[str, Any], peer: dict[str, Any]) -> dict[str, Any] | None:
    """The floor a peer is set against: SQLite FULL for SQLite peers, else PostgreSQL.

    The peer's store kind is ``peer["store"]``; documents written before it was recorded
    name PostgreSQL at the end of the label.
    """
    kind = peer.get("store") or ("postgresql" if peer["label"].endswith("PostgreSQL")
                                 else "sqlite")
    name = "postgresql" if kind == "postgresql" else "sqlite_full"
    found: dict[str, Any] | None = report["backends"].get(name, {}).get("floor")
    return found


def _na(figures: dict[str, Any] | None, width: int) -> list[str] | None:
    if figures is None:
        return None
    if "na" in figures:
        return [f"n/a: {figures['na']}"] + [""] * (width - 1)
    return None


def peers_steps_table(report: dict[str, Any]) -> str:
    """Sequential and concurrent steps of perdure and the peers, with ratios to the floor."""
    rows = []
    for b in report["backends"].values():
        if "sequential" in b:
            rows.append([f"perdure, {b['store']}",
                         _num(b["sequential"]["us_per_step"], " µs"),
                         _num(b["sequential"]["steps_per_s"], " /s"),
                         _ratio(b["sequential"]["ratio_to_floor_commit"]),
                         _num(b["concurrent"]["steps_per_s"], " /s"),
                         _ratio(b["concurrent"]["ratio_to_single_commit_rate"])])
    for peer in report.get("peers", {}).values():
        got = peer.get("steps")
        if got is None:
            continue
        if (na := _na(got, 5)) is not None:
            rows.append([peer["label"], *na])
            continue
        fl = _floor_for(report, peer)
        seq, conc = got["sequential"], got["concurrent"]
        rows.append([peer["label"], _num(seq["us_per_step"], " µs"),
                     _num(seq["steps_per_s"], " /s"),
                     _ratio(seq["us_per_step"] / fl["us_per_commit"]) if fl else "–",  # noqa: RUF001
                     _num(conc["steps_per_s"], " /s"),
                     _ratio(conc["steps_per_s"] / fl["commits_per_s"]) if fl else "–"])  # noqa: RUF001
    if not rows:
        return ""
    return _table(["store", "sequential µs per step", "steps per second", "÷ floor commit",
                   "concurrent steps per second", "÷ floor commits/s"], rows)


def peers_wake_table(report: dict[str, Any]) -> str:
    """Wake latency of the peers."""
    rows = []
    for peer in report.get("peers", {}).values():
        got = peer.get("wake")
        if got is None:
            continue
        if (na := _na(got, 5)) is not None:
            rows.append([peer["label"], *na])
            continue
        for name, f in got.items():
            how = "default settings" if name == "default" else f"polls every {f['poll_s']:g} s"
            wakes = f"{f['wakes']:,}"
            if f.get("wakes_planned") and f["wakes_planned"] > f["wakes"]:
                wakes += (f" of {f['wakes_planned']:,} (stopped after"
                          f" {f.get('budget_s') or 0:g} s budget)")
            rows.append([f"{peer['label']}, {how}", wakes, _num(f["ms_p50"], " ms"),
                         _num(f["ms_p90"], " ms"), _num(f["ms_p99"], " ms"),
                         _num(f["ms_max"], " ms")])
    if not rows:
        return ""
    return _table(["peer", "wakes", "p50", "p90", "p99", "max"], rows)


def seconds_table(report: dict[str, Any]) -> str:
    """How long each part took, per backend and per peer (wall time)."""
    rows = []
    for b in report["backends"].values():
        if b.get("seconds"):
            rows.append([f"perdure, {b['store']}",
                         ", ".join(f"{p} {s:g} s" for p, s in b["seconds"].items()),
                         f"{sum(b['seconds'].values()):.0f} s"])
    if (model := report.get("model") or {}).get("seconds"):
        rows.append(["perdure model calls, SQLite FULL (and LangGraph)",
                     f"model {model['seconds']:g} s", f"{model['seconds']:.0f} s"])
    for peer in report.get("peers", {}).values():
        if peer.get("seconds"):
            rows.append([peer["label"],
                         ", ".join(f"{p} {s:g} s" for p, s in peer["seconds"].items()),
                         f"{sum(peer['seconds'].values()):.0f} s"])
    if not rows:
        return ""
    total = f"whole run: {report['seconds']:.0f} s" if "seconds" in report else ""
    return _table(["who", "parts", "total"], rows) + (f"\n{total}\n" if total else "")


def recovery_table(report: dict[str, Any]) -> str:
    """Crash recovery of perdure and the peers."""
    def cells(f: dict[str, Any]) -> list[str]:
        return [f"{f['reexecuted_steps']}", f"{f['reexecuted_finished_steps']}",
                _num(f["ms_to_first_resumed_step"], " ms"), _num(f["ms_to_completion"], " ms"),
                _num(f["ms_kill_to_first_resumed_step"], " ms"),
                _num(f.get("ms_worker_up_to_first_resumed_step"), " ms")]

    rows = []
    for b in report["backends"].values():
        if "recovery" in b:
            f = b["recovery"]
            rows.append([f"perdure, {b['store']} (lease {f['lease_s']:g} s)", *cells(f)])
    for peer in report.get("peers", {}).values():
        got = peer.get("recovery")
        if got is None:
            continue
        rows.append([peer["label"], *(_na(got, 6) or cells(got))])
    if not rows:
        return ""
    return _table(["store", "steps re-executed", "of them finished before the kill",
                   "process start → first resumed step", "process start → completion",
                   "kill → first resumed step", "worker up → first resumed step"], rows)


def history_table(report: dict[str, Any]) -> str:
    """Resume cost and storage bytes per step versus history length."""
    rows = []
    notes: list[str] = []

    def add(label: str, resume: dict[str, Any], per_step: dict[str, Any], key: str) -> None:
        lengths = list(resume)
        times = " / ".join("n/a" if "na" in resume[n] else _num(resume[n][key], " ms")
                           for n in lengths)
        notes.extend(f"{label}, {int(n):,} steps: n/a: {resume[n]['na']}"
                     for n in lengths if "na" in resume[n])
        measured = [n for n in lengths if "na" not in resume[n]]
        runs = resume[measured[-1]].get("runs", []) if measured else []
        if len(runs) > 1:
            notes.append(f"{label}, {int(measured[-1]):,} steps: {len(runs)} resumes of "
                         "copies of one history took "
                         + ", ".join(_num(r[key], " ms") for r in runs)
                         + " (the median is in the table)")
        marginal = " / ".join(_num(v) for k, v in per_step.items() if k.startswith("marginal"))
        at_end = per_step.get(f"bytes_per_step_at_{measured[-1]}") if measured else None
        rows.append([label, " / ".join(f"{int(n):,}" for n in lengths), times,
                     _num(at_end), marginal])

    for b in report["backends"].values():
        if "resume" in b:
            add(f"perdure, {b['store']}", b["resume"], b["storage"]["perdure"],
                "ms_claim_to_next_step")
            if all("ms_claim_to_next_step_same_node" in r for r in b["resume"].values()):
                add(f"perdure, {b['store']}, claimed again by the same node", b["resume"],
                    b["storage"]["perdure"], "ms_claim_to_next_step_same_node")
    for b in report["backends"].values():
        if "resume" in b:
            fl = b["storage"]["floor"]
            lengths = list(b["storage"]["floor_bytes"])
            rows.append([f"floor, {b['store']} (rows only)", " / ".join(
                f"{int(n):,}" for n in lengths), "–",  # noqa: RUF001
                _num(fl.get(f"bytes_per_step_at_{lengths[-1]}")),
                " / ".join(_num(v) for k, v in fl.items() if k.startswith("marginal"))])
    for peer in report.get("peers", {}).values():
        got = peer.get("history")
        if got is None:
            continue
        if (na := _na(got, 4)) is not None:
            rows.append([peer["label"], *na])
            continue
        key = "ms_launch_to_next_step" if peer["peer"] == "dbos" else "ms_invoke_to_next_step"
        add(peer["label"], got["resume"], got["storage"]["per_step"], key)
    if not rows:
        return ""
    table = _table(["store", "recorded steps", "resume → next new step", "bytes per step "
                    "(longest measured)", "marginal bytes per step between lengths"], rows)
    if notes:
        table += "\n" + "\n".join(f"- {note}" for note in notes) + "\n"
    return table


def render(report: dict[str, Any]) -> str:
    """All tables, each under a heading."""
    from bench.dormant import table as dormant_table
    from bench.e2e import table as e2e_table
    from bench.quota import table as quota_table
    from bench.render_model import conversation_table, stream_table
    from bench.resources import table as resource_table
    from bench.ui import table as ui_table

    parts = []
    for title, table in (("Durable steps", steps_table(report)),
                         ("Steps: perdure and peers", peers_steps_table(report)),
                         ("Wake latency", wake_table(report)),
                         ("Wake latency: peers", peers_wake_table(report)),
                         ("Claim throughput (objects per second)", claims_table(report)),
                         ("Crash recovery", recovery_table(report)),
                         ("Resume cost and storage versus history length",
                          history_table(report)),
                         ("Model calls: storage of a conversation",
                          conversation_table(report)),
                         ("Model calls: the stream journal's cost", stream_table(report)),
                         ("Resources: resume after 1 and many checkpoints",
                          resource_table(report)),
                         ("Dashboard: the objects list", ui_table(report)),
                         ("Through a worker process", e2e_table(report)),
                         ("Dormant objects: an idle node and a new object",
                          dormant_table(report)),
                         ("Model quotas: share used, calls refused", quota_table(report)),
                         ("Time taken by each part", seconds_table(report))):
        if table:
            parts.append(f"#### {title}\n\n{table}")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    """Render the JSON document named on the command line (or on standard input)."""
    args = sys.argv[1:] if argv is None else argv
    text = open(args[0]).read() if args else sys.stdin.read()  # noqa: SIM115
    sys.stdout.write(render(json.loads(text)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
