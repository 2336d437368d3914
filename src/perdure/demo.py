"""``perdure demo``: a document-review agent that is killed mid-way and carries on.

The agent reads the text files in ``<folder>/docs``, analyses each one in its
own recorded step, summarises them, sleeps, waits for a person's approval and
writes a report. ``run_demo`` tells the whole story with real processes: it
starts the object, runs a worker, kills that worker with SIGKILL while the
documents are being analysed, runs a second worker that resumes from memory,
approves, waits for the result and verifies the signed memory.

Every step appends ``began`` and ``done`` lines to ``<folder>/effects.jsonl``,
so the demo (and anyone) can count how many times each step really ran.

``perdure.demo:app`` is the same agent for running by hand
(``perdure --app perdure.demo:app worker``); its folder comes from the
``PERDURE_DEMO_DIR`` environment variable (default ``demo-data``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from perdure.app import App
from perdure.core.records import Kind, Record
from perdure.engine.context import current_step
from perdure.engine.run import Run
from perdure.errors import PerdureError

__all__ = ["AGENT", "DEMO_DIR_ENV", "OBJECT_ID", "app", "build_app", "run_demo", "write_samples"]

DEMO_DIR_ENV = "PERDURE_DEMO_DIR"
DEFAULT_DIR = "demo-data"
OBJECT_ID = "demo-1"
AGENT = "review"
STEP_SECONDS = 0.6  # each document takes a moment, so the kill lands mid-way
KILL_AFTER = 2  # documents analysed before worker A is killed
LEASE_SECONDS = 2.0
_MARKER = ".perdure-demo"
_EFFECTS = "effects.jsonl"

SAMPLES: dict[str, str] = {
    "01-lighthouse.txt": (
        "Keeper's log, north point light. The lamp was cleaned at dusk and the lens turned "
        "without a catch. Fog came in from the east after midnight, so the horn ran for four "
        "hours. Two fishing boats passed close to the reef; both answered the horn. The oil "
        "store is half full. The stair rail on the third landing is loose again and needs a "
        "new bracket before the winter storms. Lamp, lens and horn all in order at dawn."
    ),
    "02-garden.txt": (
        "Community garden plan for spring. The north beds get beans and peas on the old "
        "trellis; the south beds, which see the most sun, get tomatoes and peppers. Compost "
        "from the autumn pile is ready and will be spread in March. Volunteers asked for a "
        "rota for watering, and for a second tap near the gate. The tool shed roof leaks over "
        "the seed shelf, so seeds move to the dry crate until the roof is mended."
    ),
    "03-bridge.txt": (
        "Inspection note, footbridge over the mill stream. Deck boards are sound apart from "
        "two near the east abutment, which show soft rot and should be replaced. The steel "
        "handrail has surface rust at the joints; wire brush and repaint. Bearings move "
        "freely. Scour around the west pier is slight and has not grown since the last "
        "inspection. The bridge stays open; replace the two boards within a month."
    ),
    "04-bakery.txt": (
        "Letter to the flour mill. Our last three deliveries arrived a day late, and the rye "
        "flour in the second one was damp at the bottom of the sacks. We bake from four in "
        "the morning, so a late delivery means no rye bread that day. Could deliveries come "
        "on Monday and Thursday afternoons instead? We would also like to try your spelt "
        "flour; please send two sacks with the next rye order."
    ),
    "05-library.txt": (
        "Moving the branch library. The new rooms above the post office are larger but the "
        "floor must be checked for the weight of full shelves. Children's books move first, "
        "so the reading hour can restart soon. The local history collection moves last and "
        "by hand, box by box, because many of the maps are fragile. Returns can be left at "
        "the post office counter during the move."
    ),
    "06-river.txt": (
        "River survey, upper reach. Water was clear and cold; flow was higher than in the "
        "summer survey after a week of rain. Trout were seen in three of the five pools. The "
        "gravel bar below the weir has shifted towards the left bank. Willow planted on the "
        "bank last year has taken well and holds the soil. Litter was found at the footpath "
        "crossing; a bin there would help."
    ),
}

_STOPWORDS_TEXT = """
    a about after again all also an and any are as at be because been before both but by
    can come could day for from get gets has have in into is it its last like many may
    means more most move moves must near needs new next not of on one or our over please
    see seen should since so some than that the their them then there these they this
    those three through to two until up was we were when which will with within without
    would year you your
"""
_STOPWORDS = frozenset(_STOPWORDS_TEXT.split())

# -- the agent's steps (they run inside worker processes) -----------------------------


def write_samples(folder: Path) -> list[str]:
    """Write the sample documents into ``folder/docs`` unless it holds some already."""
    docs = folder / "docs"
    docs.mkdir(parents=True, exist_ok=True)
    marker = folder / _MARKER
    if not marker.exists():
        marker.write_text("made by `perdure demo`; safe to delete\n", encoding="utf-8")
    if not any(docs.glob("*.txt")):
        for name, text in SAMPLES.items():
            (docs / name).write_text(text + "\n", encoding="utf-8")
    return sorted(p.name for p in docs.glob("*.txt"))


def _effect(folder: str, event: str, **fields: Any) -> None:
    """Append one line to the effects file: what a step really did, and where."""
    info = current_step()
    line = {"event": event, "step": info.name, "attempt": info.attempt, "epoch": info.epoch,
            "pid": os.getpid(), "ts": round(time.time(), 3), **fields}
    with open(Path(folder) / _EFFECTS, "a", encoding="utf-8") as fh:
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
    terms = Counter(w for w in words if len(w) > 2 and w not in _STOPWORDS)
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


app = build_app(os.environ.get(DEMO_DIR_ENV) or DEFAULT_DIR)
"""The demo App for ``perdure --app perdure.demo:app ...`` (folder from ``PERDURE_DEMO_DIR``)."""


# -- the story: run_demo ------------------------------------------------------------


class DemoError(Exception):
    """Something in the demo did not go as it should; the message says what."""


class _Worker:
    """A worker subprocess this demo started (and is the only one to stop)."""

    def __init__(self, label: str, root: Path) -> None:
        self.label = label
        self.node_id = f"demo-node-{label.lower()}"
        self.log_path = root / f"worker-{label.lower()}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PERDURE_")}
        env[DEMO_DIR_ENV] = str(root)
        env["PYTHONUNBUFFERED"] = "1"
        command = [sys.executable, "-m", "perdure", "--app", "perdure.demo:app",
                   "--node-id", self.node_id, "worker", "--concurrency", "4"]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(command, cwd=root, env=env, stdout=log,
                                         stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> int:
        self.proc.send_signal(signal.SIGKILL)
        return self.proc.wait(timeout=10)

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                return self.proc.wait(timeout=5)
        return self.proc.returncode

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def _prepare(root: Path, fresh: bool, console: Console) -> None:
    """Make ``root`` ready for a new run, deleting only what an earlier demo made."""
    ours = (root / _MARKER).exists() or (root / "demo.db").exists()
    if root.exists() and any(root.iterdir()) and not ours:
        raise DemoError(
            f"{root} is not empty and was not made by `perdure demo`; "
            "pick another folder with --dir"
        )
    if fresh and root.exists():
        shutil.rmtree(root)
        console.print(f"deleted the old demo folder {root}")
    root.mkdir(parents=True, exist_ok=True)
    (root / _MARKER).write_text("made by `perdure demo`; safe to delete\n", encoding="utf-8")
    leftovers = [root / name for name in ("demo.db", "demo.db-wal", "demo.db-shm", _EFFECTS,
                                          "worker-a.log", "worker-b.log")]
    cleared = [p for p in leftovers if p.exists()]
    for path in cleared:
        path.unlink()
    if (root / "reports").exists():
        shutil.rmtree(root / "reports")
        cleared.append(root / "reports")
    if cleared:
        console.print(f"cleared the previous demo run in {root} (keys and docs kept)")


def _who(rec: Record) -> str:
    if rec.node_id.startswith("demo-node-"):
        return f"worker {rec.node_id.removeprefix('demo-node-').upper()}"
    return "you" if rec.kind in (Kind.INSTANTIATED,) else rec.node_id


def _line(rec: Record) -> str:
    body = rec.body
    kind = rec.kind
    if kind == Kind.INSTANTIATED:
        what = f"object {rec.object_id} created: agent {body['intent']['agent']!r}"
    elif kind == Kind.STEP_DONE:
        result = body.get("result")
        if isinstance(result, dict) and "words" in result and "key_terms" in result:
            detail = f"{result['words']} words; {', '.join(result['key_terms'][:3])}"
        elif isinstance(result, list):
            detail = f"{len(result)} documents"
        elif isinstance(result, dict) and "documents" in result:
            detail = f"{result['documents']} documents, {result['words']} words"
        else:
            detail = json.dumps(result)[:60]
        what = f"step done  {body.get('name')}  ({detail})"
    elif kind == Kind.PROGRESS:
        fields = body.get("fields", {})
        what = f"progress   {fields.get('analysed')}/{fields.get('of')} documents analysed"
    elif kind == Kind.DORMANT:
        if body.get("event"):
            what = f"dormant    waiting for event {body['event']!r}"
        else:
            what = f"dormant    sleeping {body.get('seconds', 0):g}s (the object is released)"
    elif kind == Kind.WOKE:
        what = "woke       timer due"
    elif kind == Kind.EVENT_RECEIVED:
        what = f"event      {body.get('name')!r} received: {json.dumps(body.get('payload'))}"
    elif kind == Kind.TERMINATED:
        what = f"terminated {body.get('outcome')}"
        result = body.get("result")
        if isinstance(result, dict):
            what += ": " + ", ".join(f"{k}={v}" for k, v in result.items() if k != "report")
    else:
        what = f"{kind} {json.dumps(body)[:70]}"
    return f"  [dim]#{rec.seq:<3}[/] [cyan]{_who(rec):<9}[/] {what}"


class _Story:
    """One run of the demo: the steps of the story and the checks at the end."""

    def __init__(self, root: Path, console: Console) -> None:
        self.root = root
        self.console = console
        self.app = build_app(root, node_id="demo-launcher")
        self.shown = 0
        self.workers: list[_Worker] = []

    def say(self, text: str) -> None:
        self.console.print(f"\n[bold]{text}[/]")

    def records(self) -> list[Record]:
        return self.app.store.records(OBJECT_ID)

    def follow(self) -> list[Record]:
        """Print the records written since the last call; return all records."""
        records = self.records()
        for rec in records[self.shown:]:
            self.console.print(_line(rec))
        self.shown = len(records)
        return records

    def until(self, what: str, done: Callable[[list[Record]], bool], timeout: float) -> None:
        """Follow memory until ``done(records)`` holds; ``DemoError`` after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            records = self.follow()
            if done(records):
                return
            for worker in self.workers:
                if worker.alive() or worker.proc.returncode == -signal.SIGKILL:
                    continue
                raise DemoError(f"worker {worker.label} exited with code "
                                f"{worker.proc.returncode} while {what}:\n{worker.log_tail()}")
            if time.monotonic() > deadline:
                raise DemoError(f"timed out after {timeout:.0f}s {what}")
            time.sleep(0.02)

    def start_worker(self, label: str) -> _Worker:
        worker = _Worker(label, self.root)
        self.workers.append(worker)
        self.console.print(f"  started worker {label} (pid {worker.pid}, node "
                           f"{worker.node_id}); log in {worker.log_path.name}")
        return worker

    def run(self, fresh: bool) -> int:
        console = self.console
        started = time.monotonic()
        console.rule("[bold]perdure demo: an agent that survives SIGKILL")
        _prepare(self.root, fresh, console)
        names = write_samples(self.root)
        console.print(f"folder {self.root}: {len(names)} documents in docs/, "
                      f"store demo.db, node keys in keys/")

        self.say(f"1. Start object {OBJECT_ID} (agent {AGENT!r}) and a worker to run it")
        self.app.start(AGENT, object_id=OBJECT_ID)
        worker_a = self.start_worker("A")

        def analysed(records: list[Record]) -> int:
            return sum(1 for r in records if r.kind == Kind.STEP_DONE
                       and str(r.body.get("name", "")).startswith("analyse "))

        self.until("waiting for worker A to analyse documents",
                   lambda recs: analysed(recs) >= KILL_AFTER, timeout=30)

        self.say(f"2. Kill worker A with SIGKILL after {KILL_AFTER} of {len(names)} documents")
        code = worker_a.kill()
        if code != -signal.SIGKILL:
            raise DemoError(f"worker A was not killed by SIGKILL (exit code {code})")
        before_kill = self.records()
        done_before = [str(r.body["name"]) for r in before_kill if r.kind == Kind.STEP_DONE]
        epoch_a = self.app.get(OBJECT_ID).epoch
        console.print(f"  worker A (pid {worker_a.pid}) is gone; it held {OBJECT_ID} with "
                      f"epoch {epoch_a}. Memory holds {len(before_kill)} records; the "
                      "document it was reading is lost work.")
        console.print(f"  its lease lapses within {LEASE_SECONDS:g}s; until then nobody "
                      "else may touch the object.")

        self.say("3. Start worker B: it claims the object and replays memory")
        self.start_worker("B")
        self.until("waiting for worker B to claim the object",
                   lambda recs: self.app.get(OBJECT_ID).epoch > epoch_a, timeout=30)
        console.print(f"  worker B claimed {OBJECT_ID} with epoch "
                      f"{self.app.get(OBJECT_ID).epoch}: a late write from A would be refused.")
        console.print("  replaying, the steps in memory return their recorded results "
                      "without running:")
        console.print(f"  {', '.join(done_before)}")

        def waiting(_: list[Record]) -> bool:
            info = self.app.get(OBJECT_ID)
            return info.waiting_event == "approval" and info.status == "dormant"

        self.until("waiting for the agent to ask for approval", waiting, timeout=60)

        self.say("4. The agent waits for approval (a dormant object costs a row, no process)")
        self.app.send(OBJECT_ID, "approval", {"by": "perdure demo"})
        console.print("  sent event 'approval' {\"by\": \"perdure demo\"}")
        result = self.app.handle(OBJECT_ID).result(timeout=60)
        self.follow()
        self.workers[-1].stop()

        self.say("5. Check: executions per step, memory, signatures")
        return self.check(result, done_before, time.monotonic() - started)

    def check(self, result: Any, done_before: list[str], elapsed: float) -> int:
        console = self.console
        problems: list[str] = []
        records = self.records()
        recorded = Counter(str(r.body.get("name")) for r in records if r.kind == Kind.STEP_DONE)
        began: Counter[str] = Counter()
        finished: Counter[str] = Counter()
        pids: dict[str, list[int]] = {}
        effects = self.root / _EFFECTS
        for raw in effects.read_text(encoding="utf-8").splitlines():
            line = json.loads(raw)
            step = str(line["step"])
            if line["event"] == "began":
                began[step] += 1
            else:
                finished[step] += 1
                pids.setdefault(step, []).append(int(line["pid"]))
        pid_label = {w.pid: w.label for w in self.workers}
        table = Table(box=None, pad_edge=False)
        table.add_column("step", no_wrap=True)
        for col in ("began", "done", "records", "worker", "note"):
            table.add_column(col)
        for step in recorded:
            note = ""
            if step in done_before:
                note = "before the kill"
                if began[step] != 1:
                    problems.append(f"{step} was completed before the kill yet began "
                                    f"{began[step]} times")
            elif began[step] > finished[step]:
                note = "killed mid-step, rerun"
            if finished[step] != 1:
                problems.append(f"{step} finished {finished[step]} times")
            if recorded[step] != 1:
                problems.append(f"{step} has {recorded[step]} step records")
            by = ", ".join(pid_label.get(pid, str(pid)) for pid in pids.get(step, []))
            table.add_row(step, str(began[step]), str(finished[step]), str(recorded[step]),
                          by, note)
        console.print(table)
        reports = sorted((self.root / "reports").glob("report-*.md"))
        if len(reports) != 1:
            problems.append(f"expected one report file, found {len(reports)}")
        report = self.app.verify(OBJECT_ID)
        console.print(("[green]verify ok[/] " if report.ok else "[red]verify FAILED[/] ")
                      + str(report))
        if not report.ok:
            problems.append(f"verification failed: {report}")
        if not isinstance(result, dict) or result.get("approved_by") != "perdure demo":
            problems.append(f"unexpected result {result!r}")
        if problems:
            for problem in problems:
                console.print(f"[red]problem:[/] {problem}")
            return 1
        twice = sum(1 for step in recorded if finished[step] > 1)
        analysed_before = sum(1 for step in done_before if step.startswith("analyse "))
        console.rule("[bold green]demo passed")
        console.print(
            f"{OBJECT_ID} completed in {elapsed:.1f}s: {result['documents']} documents, "
            f"{result['words']} words, report {result['report']}.\n"
            f"Worker A was killed with SIGKILL after {analysed_before} documents; "
            f"worker B resumed from memory. Steps run twice after completing: {twice}. "
            f"Memory: {report.records} signed, hash-chained records; verify ok.\n"
            f"Look closer: perdure --store sqlite:///{self.root / 'demo.db'} show {OBJECT_ID}"
        )
        return 0


def run_demo(folder: str | Path = DEFAULT_DIR, *, fresh: bool = False,
             console: Console | None = None) -> int:
    """Run the crash-and-resume story in ``folder``; return the exit code (0 when all held).

    ``fresh`` deletes the folder first (only if an earlier demo made it).
    """
    out = console or Console(highlight=False)
    story = _Story(Path(folder).resolve(), out)
    try:
        return story.run(fresh)
    except (DemoError, PerdureError) as exc:
        out.print(f"[bold red]demo failed:[/] {exc}")
        for worker in story.workers:
            tail = worker.log_tail()
            if tail:
                out.print(f"[dim]last lines of worker {worker.label}'s log:[/]")
                out.print(tail, markup=False)
        return 1
    finally:
        for worker in story.workers:
            worker.stop()
        story.app.close()
