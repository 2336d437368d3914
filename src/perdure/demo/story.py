"""``run_demo``: the crash-and-resume story told with real worker processes.

It starts the object, runs a worker, kills that worker with SIGKILL while the documents
are being analysed, runs a second worker that resumes from memory, approves, waits for
the result and verifies the signed memory, printing memory as it grows.
"""

from __future__ import annotations

import json
import shutil
import signal
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from perdure import App, Kind, Record
from perdure.demo.agents import AGENT, DEFAULT_DIR, EFFECTS, LEASE_SECONDS, build_app
from perdure.demo.samples import MARKER, write_samples
from perdure.demo.workers import WorkerProcess, report_failure
from perdure.describe import Narrator
from perdure.errors import ObjectNotFoundError, PerdureError

__all__ = ["KILL_AFTER", "OBJECT_ID", "DemoError", "ReviewNarrator", "run_demo", "unused_id"]

OBJECT_ID = "demo-1"  # the first run's object; a later run takes the next free demo-N
KILL_AFTER = 2  # documents analysed before worker A is killed


class DemoError(Exception):
    """Something in the demo did not go as it should; the message says what."""


def _prepare(root: Path, fresh: bool, console: Console) -> None:
    """Make ``root`` ready for a run: with ``fresh`` delete the whole folder (only one an
    earlier demo made); without, keep the store and every object and file in it (one
    made by hand included), so a run touches only the objects it starts itself."""
    ours = (root / MARKER).exists() or (root / "demo.db").exists()
    if root.exists() and any(root.iterdir()) and not ours:
        raise DemoError(
            f"{root} is not empty and was not made by `perdure demo`; "
            "pick another folder with --dir"
        )
    if fresh and root.exists():
        shutil.rmtree(root)
        console.print(f"deleted the old demo folder {root}")
    root.mkdir(parents=True, exist_ok=True)
    (root / MARKER).write_text("made by `perdure demo`; safe to delete\n", encoding="utf-8")


def unused_id(app: App, first: str) -> str:
    """``first`` (such as ``demo-1``) if the store has no such object, else the first
    free ``<prefix>-N`` after it: a run never reuses an object it did not start."""
    prefix, _, number = first.rpartition("-")
    n = int(number)
    while True:
        candidate = f"{prefix}-{n}"
        try:
            app.get(candidate)
        except ObjectNotFoundError:
            return candidate
        n += 1


class ReviewNarrator(Narrator):
    """The review's memory in the demo's words: workers by letter, documents counted."""

    def who(self, record: Record) -> str:
        if record.node_id.startswith("demo-node-"):
            return f"worker {record.node_id.removeprefix('demo-node-').upper()}"
        return "you" if record.kind in (Kind.INSTANTIATED,) else record.node_id

    def result(self, value: Any) -> str:
        if isinstance(value, dict) and "words" in value and "key_terms" in value:
            return f"{value['words']} words; {', '.join(value['key_terms'][:3])}"
        if isinstance(value, list):
            return f"{len(value)} documents"
        if isinstance(value, dict) and "documents" in value:
            return f"{value['documents']} documents, {value['words']} words"
        return super().result(value)

    def progress(self, fields: Mapping[str, Any]) -> str:
        return f"{fields.get('analysed')}/{fields.get('of')} documents analysed"

    def outcome(self, result: Any) -> str | None:
        if isinstance(result, dict):
            return ", ".join(f"{k}={v}" for k, v in result.items() if k != "report")
        return None


_NARRATOR = ReviewNarrator()


def _line(rec: Record) -> str:
    """One record of the story, as the demo prints it (rich markup)."""
    return (f"  [dim]#{rec.seq:<3}[/] [cyan]{_NARRATOR.who(rec):<9}[/] "
            f"{_NARRATOR.what(rec)}")


class _Story:
    """One run of the demo: the steps of the story and the checks at the end."""

    def __init__(self, root: Path, console: Console) -> None:
        self.root = root
        self.console = console
        self.app = build_app(root, node_id="demo-launcher")
        self.shown = 0
        self.workers: list[WorkerProcess] = []
        self.object_id = OBJECT_ID

    def say(self, text: str) -> None:
        self.console.print(f"\n[bold]{text}[/]")

    def records(self) -> list[Record]:
        return self.app.history(self.object_id)

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

    def start_worker(self, label: str) -> WorkerProcess:
        worker = WorkerProcess(label, self.root)
        self.workers.append(worker)
        self.console.print(f"  started worker {label} (pid {worker.pid}, node "
                           f"{worker.node_id}); log in {worker.log_path.name}")
        return worker

    def run(self, fresh: bool) -> int:
        console = self.console
        started = time.monotonic()
        console.rule("[bold]perdure demo: an agent that survives SIGKILL")
        _prepare(self.root, fresh, console)
        self.object_id = unused_id(self.app, OBJECT_ID)
        names = write_samples(self.root)
        console.print(f"folder {self.root}: {len(names)} documents in docs/, "
                      f"store demo.db, node keys in keys/")

        self.say(f"1. Start object {self.object_id} (agent {AGENT!r}) and a worker to run "
                 "it")
        self.app.options(object_id=self.object_id).start(AGENT)
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
        epoch_a = self.app.get(self.object_id).epoch
        console.print(f"  worker A (pid {worker_a.pid}) is gone; it held {self.object_id} "
                      f"with epoch {epoch_a}. Memory holds {len(before_kill)} records; the "
                      "document it was reading is lost work.")
        console.print(f"  its lease lapses within {LEASE_SECONDS:g}s; until then nobody "
                      "else may touch the object.")

        self.say("3. Start worker B: it claims the object and replays memory")
        self.start_worker("B")
        self.until("waiting for worker B to claim the object",
                   lambda recs: self.app.get(self.object_id).epoch > epoch_a, timeout=30)
        console.print(f"  worker B claimed {self.object_id} with epoch "
                      f"{self.app.get(self.object_id).epoch}: a late write from A would be "
                      "refused.")
        console.print("  replaying, the steps in memory return their recorded results "
                      "without running:")
        console.print(f"  {', '.join(done_before)}")

        def waiting(_: list[Record]) -> bool:
            info = self.app.get(self.object_id)
            return info.waiting_event == "approval" and info.status == "dormant"

        self.until("waiting for the agent to ask for approval", waiting, timeout=60)

        self.say("4. The agent waits for approval (a dormant object costs a row, no process)")
        self.app.send(self.object_id, "approval", {"by": "perdure demo"})
        console.print("  sent event 'approval' {\"by\": \"perdure demo\"}")
        result = self.app.handle(self.object_id).result(timeout=60)
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
        effects = self.root / EFFECTS
        reports: set[str] = set()
        for raw in effects.read_text(encoding="utf-8").splitlines():
            line = json.loads(raw)
            if line.get("object") != self.object_id:
                continue  # another object's step (an earlier run, or one started by hand)
            if line.get("report"):
                reports.add(str(line["report"]))
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
        if len(reports) != 1 or not all((self.root / "reports" / name).exists()
                                        for name in reports):
            problems.append(f"expected one report file, found {sorted(reports)}")
        report = self.app.verify(self.object_id)
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
            f"{self.object_id} completed in {elapsed:.1f}s: {result['documents']} documents, "
            f"{result['words']} words, report {result['report']}.\n"
            f"Worker A was killed with SIGKILL after {analysed_before} documents; "
            f"worker B resumed from memory. Steps run twice after completing: {twice}. "
            f"Memory: {report.records} signed, hash-chained records; verify ok.\n"
            f"Look closer: perdure --store sqlite:///{self.root / 'demo.db'} show "
            f"{self.object_id}"
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
        return report_failure(out, exc, story.workers)
    finally:
        for worker in story.workers:
            worker.stop()
        story.app.close()
