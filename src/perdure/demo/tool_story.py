"""``run_agent_demo``: an agent that asks a person before a risky tool, with its worker
killed while it waits and another one carrying on after the approval.

It starts the scripted model server (or uses ``OPENAI_BASE_URL``), seeds a sandbox,
starts the ``housekeeper`` object and worker A. The model's first turn (two low-risk
tools) runs at once; its ``delete_files`` proposal needs a person, so the object goes
dormant. The demo kills worker A with SIGKILL (nothing holds the object), shows
``perdure approvals``, approves as a person would with ``perdure approve``, starts worker
B, approves the ``send_message`` that follows, and checks: each effect happened once, no
model turn was asked twice, and memory verifies.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from perdure import App, Kind, PendingApproval, Record
from perdure.core.approvals import shown
from perdure.core.bodies.tools import DECIDED
from perdure.demo.story import DemoError, _prepare, unused_id
from perdure.demo.tool_agent import (
    AGENT_DEFAULT_DIR,
    HOUSEKEEPER,
    build_agent_app,
    outbox,
    planner,
    sandbox,
    seed,
)
from perdure.demo.workers import WorkerProcess, report_failure
from perdure.describe import describe
from perdure.errors import PerdureError

__all__ = ["AGENT_OBJECT_ID", "run_agent_demo"]

AGENT_OBJECT_ID = "agent-demo-1"
APP_REF = "perdure.demo.tool_agent:app"
DEFAULT_MODEL = "gpt-4o-mini"


class _AgentStory:
    """One run of the agent demo."""

    def __init__(self, root: Path, console: Console, model: str) -> None:
        self.root = root
        self.console = console
        self.model = model
        self.app: App = build_agent_app(root, node_id="demo-operator")
        self.workers: list[WorkerProcess] = []
        self.shown = 0
        self.object_id = AGENT_OBJECT_ID
        self.problems: list[str] = []
        self.decided: set[str] = set()

    def say(self, text: str) -> None:
        self.console.print(f"\n[bold]{text}[/]")

    def follow(self) -> list[Record]:
        records = self.app.history(self.object_id)
        for rec in records[self.shown:]:
            who = rec.node_id.removeprefix("demo-node-").upper()
            text = escape(describe(rec).text)[:120]
            self.console.print(f"  [dim]#{rec.seq:<3}[/] [cyan]{who:<4}[/] "
                               f"{rec.kind:<14} {text}")
        self.shown = len(records)
        return records

    def until(self, what: str, done: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            self.follow()
            for worker in self.workers:
                if not worker.alive() and worker.proc.returncode != -signal.SIGKILL:
                    raise DemoError(f"worker {worker.label} exited with code "
                                    f"{worker.proc.returncode} while {what}:\n"
                                    f"{worker.log_tail()}")
            if time.monotonic() > deadline:
                raise DemoError(f"timed out after {timeout:.0f}s {what}")
            time.sleep(0.05)
        self.follow()

    def start_worker(self, label: str) -> WorkerProcess:
        worker = WorkerProcess(label, self.root, app_ref=APP_REF)
        self.workers.append(worker)
        self.console.print(f"  started worker {label} (pid {worker.pid})")
        return worker

    def pending(self) -> list[PendingApproval]:
        return [p for p in self.app.approvals() if p.object_id == self.object_id
                and p.proposal_id not in self.decided]

    def approve_next(self, store: str) -> PendingApproval:
        self.until("waiting for a proposal that needs a person", lambda: bool(self.pending()),
                   timeout=60)
        item = self.pending()[0]
        self.decided.add(item.proposal_id)
        self.console.print(f"  [yellow]$ perdure --store {store} approvals[/]")
        self.console.print(f"    {item.object_id}  proposal {item.proposal_id}  {item.tool}  "
                           f"risk {item.risk}  ({escape(item.reason)})")
        self.console.print("    " + escape(shown(item.arguments)).replace("\n", "\n    "))
        info = self.app.get(self.object_id)
        self.console.print(f"  object status: {info.status}, lease held by: "
                           f"{info.lease_owner or 'nobody'}")
        self.console.print(f"  [yellow]$ perdure --store {store} approve {self.object_id} "
                           f"{item.proposal_id}[/]")
        self.app.approve(self.object_id, item.proposal_id)
        return item

    def run(self, fresh: bool, stack: ExitStack) -> int:
        console = self.console
        console.rule("[bold]perdure demo --agent: tools, a policy gate and a person")
        _prepare(self.root, fresh, console)
        self.object_id = unused_id(self.app, AGENT_OBJECT_ID)
        names = seed(self.root)
        console.print(f"sandbox {sandbox(self.root) / 'tmp'}: {', '.join(names)}")
        base_url = os.environ.get("OPENAI_BASE_URL")
        server = None
        if base_url:
            if not os.environ.get("OPENAI_API_KEY"):
                raise DemoError("OPENAI_BASE_URL is set but OPENAI_API_KEY is not")
            console.print(f"endpoint {base_url} (OPENAI_BASE_URL), model {self.model}")
        else:
            from perdure.llm.scripted import ScriptedServer

            server = stack.enter_context(ScriptedServer(responder=planner))
            base_url = server.openai_base_url
            console.print(f"endpoint: the scripted local model server at {base_url} "
                          "(offline; set OPENAI_BASE_URL to use a real one)")
        store = f"sqlite:///{self.root / 'demo.db'}"

        self.say(f"1. Start {self.object_id} (agent {HOUSEKEEPER!r}) and worker A: "
                 "low-risk tools run on their own")
        self.app.options(object_id=self.object_id).start(
            HOUSEKEEPER, self.model, base_url, server is not None)
        worker_a = self.start_worker("A")
        self.until("waiting for the first approval request", lambda: bool(self.pending()),
                   timeout=60)

        self.say("2. A risky call waits for a person; kill worker A with SIGKILL meanwhile")
        if worker_a.kill() != -signal.SIGKILL:
            raise DemoError("worker A was not killed by SIGKILL")
        console.print("  worker A is gone; the object is a dormant row, no process holds it")

        self.say("3. A person approves from the CLI; worker B picks the object up")
        self.approve_next(store)
        self.start_worker("B")
        self.say("4. Worker B carries on; every further risky call is approved as it comes")
        for _ in range(6):  # a real model may ask for more (or fewer) risky calls
            self.until("waiting for the next approval or the end",
                       lambda: bool(self.pending())
                       or self.app.get(self.object_id).terminal, timeout=90)
            if self.app.get(self.object_id).terminal:
                break
            self.approve_next(store)
        result = self.app.handle(self.object_id).result(timeout=90)
        self.follow()
        self.workers[-1].stop()
        return self.check(result, server)

    def check(self, result: Any, server: Any) -> int:
        console = self.console
        self.say("5. What memory proves")
        records = self.app.history(self.object_id)
        decided = [r.body for r in records if r.kind == Kind.TOOL_DECIDED]
        for body in decided:
            console.print(f"  {body['name']} {DECIDED[body['decision']]} by "
                          f"{body['identity']} "
                          f"(key {body['key'][:16]}...) for arguments "
                          f"{body['args_hash'][:16]}...")
        gated = {r.body["verdict"] for r in records if r.kind == Kind.TOOL_GATED}
        policies = {r.body["policy"] for r in records if r.kind == Kind.TOOL_GATED}
        console.print(f"  gate verdicts: {sorted(gated)}, under policy {sorted(policies)}")
        console.print(f"  answer: {escape(str(result.get('answer')))}")
        left = sorted(p.name for p in (sandbox(self.root) / "tmp").iterdir())
        console.print(f"  left in tmp: {left}")
        posted = outbox(self.root).read_text().splitlines() if outbox(self.root).exists() else []
        sent = [line for line in posted  # this object's messages (keys are object_id/...)
                if str(json.loads(line)["key"]).startswith(f"{self.object_id}/")]
        console.print(f"  messages posted: {len(sent)}")
        calls = sum(1 for r in records if r.kind == Kind.MODEL_CALL)
        if server is not None:
            console.print(f"  the model was asked {len(server.requests)} times for "
                          f"{calls} recorded turns")
            if len(server.requests) != calls:
                sizes = [len(r.body.get("messages") or ()) for r in server.requests]
                self.problems.append(f"a model turn was asked twice (message counts {sizes})")
            if left != ["notes.txt"]:
                self.problems.append(f"expected only notes.txt left, found {left}")
            if len(sent) != 1 or json.loads(sent[0])["channel"] != "#ops":
                self.problems.append(f"expected one message to #ops, found {sent}")
            if len(decided) != 2:
                self.problems.append(f"expected two decisions, found {len(decided)}")
        report = self.app.verify(self.object_id)
        console.print(("[green]verify ok[/] " if report.ok else "[red]verify FAILED[/] ")
                      + str(report))
        if not report.ok:
            self.problems.append(f"verification failed: {report}")
        if self.problems:
            for problem in self.problems:
                console.print(f"[red]problem:[/] {problem}")
            return 1
        console.rule("[bold green]agent demo passed")
        console.print(f"Look closer: perdure --store sqlite:///{self.root / 'demo.db'} "
                      f"show {self.object_id}")
        return 0


def run_agent_demo(folder: str | Path = AGENT_DEFAULT_DIR, *, fresh: bool = False,
                   model: str | None = None, console: Console | None = None) -> int:
    """Run the approval story in ``folder``; return 0 when all held (see the module)."""
    out = console or Console(highlight=False)
    chosen = model or os.environ.get("OPENAI_MODEL") or DEFAULT_MODEL
    story = _AgentStory(Path(folder).resolve(), out, chosen)
    try:
        with ExitStack() as stack:
            return story.run(fresh, stack)
    except (DemoError, PerdureError) as exc:
        return report_failure(out, exc, story.workers)
    finally:
        for worker in story.workers:
            worker.stop()
        story.app.close()
