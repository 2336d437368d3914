"""The demo's agent and its steps: review the documents of a folder, wait for approval.

Every step appends ``began`` and ``done`` lines to ``<folder>/effects.jsonl``, so the
demo (and anyone) can count how many times each step really ran.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

from perdure import App, Run, current_step
from perdure.demo.samples import STOPWORDS, write_samples

__all__ = ["AGENT", "DEFAULT_DIR", "DEMO_DIR_ENV", "EFFECTS", "LEASE_SECONDS", "STEP_SECONDS",
           "analyse", "build_app", "list_documents", "summarise", "write_report"]

DEMO_DIR_ENV = "PERDURE_DEMO_DIR"  # the folder of ``perdure.demo:app``
DEFAULT_DIR = "demo-data"
AGENT = "review"
STEP_SECONDS = 0.6  # each document takes a moment, so the kill lands mid-way
LEASE_SECONDS = 2.0
EFFECTS = "effects.jsonl"

# -- the agent's steps (they run inside worker processes) -----------------------------


def _effect(folder: str, event: str, **fields: Any) -> None:
    """Append one line to the effects file: what a step really did, and where."""
    info = current_step()
    line = {"event": event, "object": info.object_id, "step": info.name,
            "attempt": info.attempt, "epoch": info.epoch, "pid": os.getpid(),
            "ts": round(time.time(), 3), **fields}
    with open(Path(folder) / EFFECTS, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")


def list_documents(folder: str) -> list[str]:
    """The documents to review (sample ones are written if there are none)."""
    _effect(folder, "began")
    names = write_samples(Path(folder))
    _effect(folder, "done")
    return names


def analyse(folder: str, name: str, pace: float = STEP_SECONDS) -> dict[str, Any]:
    """Count words and lines and pick the key terms of one document (taking ``pace`` s)."""
    _effect(folder, "began")
    text = (Path(folder) / "docs" / name).read_text(encoding="utf-8")
    time.sleep(pace)  # stands in for slow work such as a model call
    words = re.findall(r"[a-z][a-z']*", text.lower())
    terms = Counter(w for w in words if len(w) > 2 and w not in STOPWORDS)
    result = {
        "file": name,
        "words": len(words),
        "lines": len(text.splitlines()),
        "key_terms": [term for term, _ in terms.most_common(5)],
    }
    _effect(folder, "done")
    return result


def summarise(folder: str, analyses: list[dict[str, Any]]) -> dict[str, Any]:
    """Combine the per-document analyses."""
    _effect(folder, "began")
    terms = Counter(term for a in analyses for term in a["key_terms"])
    summary = {
        "documents": len(analyses),
        "words": sum(a["words"] for a in analyses),
        "longest": max(analyses, key=lambda a: a["words"])["file"] if analyses else None,
        "common_terms": [term for term, _ in terms.most_common(5)],
    }
    _effect(folder, "done")
    return summary


def write_report(folder: str, analyses: list[dict[str, Any]], summary: dict[str, Any],
                 approval: Any) -> str:
    """Write the report once per idempotency key, however often this step runs."""
    _effect(folder, "began")
    key = current_step().idempotency_key
    reports = Path(folder) / "reports"
    reports.mkdir(exist_ok=True)
    path = reports / f"report-{hashlib.sha256(key.encode()).hexdigest()[:12]}.md"
    if path.exists():  # a rerun of this step with the same key: already written
        _effect(folder, "done", written=False, report=path.name)
        return path.name
    by = approval.get("by") if isinstance(approval, dict) else approval
    lines = [
        "# Document review",
        "",
        f"Approved by: {by}",
        f"Idempotency key: {key}",
        "",
        f"{summary['documents']} documents, {summary['words']} words; "
        f"longest: {summary['longest']}.",
        f"Common terms: {', '.join(summary['common_terms'])}.",
        "",
        "| document | words | key terms |",
        "| --- | --- | --- |",
        *(f"| {a['file']} | {a['words']} | {', '.join(a['key_terms'])} |" for a in analyses),
    ]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.replace(tmp, path)  # the file appears whole or not at all
    _effect(folder, "done", written=True, report=path.name)
    return path.name


def build_app(folder: str | Path, *, node_id: str | None = None) -> App:
    """The demo App: store ``<folder>/demo.db``, keys in ``<folder>/keys``, agent ``review``."""
    root = Path(folder).resolve()
    demo_app = App(
        store=f"sqlite:///{root / 'demo.db'}",
        key_dir=root / "keys",
        node_id=node_id,
        lease_seconds=LEASE_SECONDS,
        poll_interval=0.05,
    )

    @demo_app.agent(name=AGENT)
    async def review(run: Run, pace: float = STEP_SECONDS) -> dict[str, Any]:
        """Review every document in the folder, then wait for a person's approval.

        ``pace`` is how many seconds each document takes (raise it to have time
        to kill a worker by hand).
        """
        base = str(root)
        names = await run.step(list_documents, base)
        analyses: list[dict[str, Any]] = []
        for done, name in enumerate(names, 1):
            analyses.append(await run.step(analyse, base, name, pace, name=f"analyse {name}"))
            await run.progress(analysed=done, of=len(names))
        summary = await run.step(summarise, base, analyses)
        await run.sleep(2)
        approval = await run.wait_for("approval")
        report = await run.step(write_report, base, analyses, summary, approval)
        return {"documents": summary["documents"], "words": summary["words"],
                "approved_by": approval.get("by") if isinstance(approval, dict) else approval,
                "report": f"reports/{report}"}

    return demo_app
