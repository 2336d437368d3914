"""``run_llm_demo``: a model stream killed mid-way and continued from what was salvaged.

It starts the scripted model server (or, with ``OPENAI_BASE_URL`` set, uses that
endpoint), starts the ``brief`` object and a worker, kills the worker with SIGKILL while
the draft streams, runs a second worker that replays memory (the outline comes back
from memory, the model is not asked again) and continues the draft from the salvaged
text, then prints the story, the ledger and the verification of memory.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from perdure import Kind, Record
from perdure.demo.agents import LEASE_SECONDS
from perdure.demo.llm_agent import (
    DRAFT,
    LLM_AGENT,
    LLM_DEFAULT_DIR,
    TOPIC,
    build_llm_app,
    conversation,
    prompts,
)
from perdure.demo.story import DemoError, _prepare, unused_id
from perdure.demo.workers import WorkerProcess, report_failure
from perdure.describe import Narrator, describe, usage
from perdure.errors import PerdureError
from perdure.llm import recorded_calls

__all__ = ["DEFAULT_MODEL", "KILL_AFTER_BATCHES", "LLM_DEFAULT_DIR", "LLM_OBJECT_ID",
           "run_llm_demo"]

LLM_OBJECT_ID = "llm-demo-1"
KILL_AFTER_BATCHES = 3  # journaled batches of the draft before worker A is killed
DEFAULT_MODEL = "gpt-4o-mini"
APP_REF = "perdure.demo.llm_agent:app"
class _BriefNarrator(Narrator):
    """The brief's outcome as the length of each part, not its text."""

    def outcome(self, result: Any) -> str | None:
        if isinstance(result, dict):
            return ", ".join(f"{k} ({len(str(v))} chars)" for k, v in result.items())
        return None


_NARRATOR = _BriefNarrator()
_MODEL_KINDS = (Kind.MODEL_CALL, Kind.MODEL_FAILED, Kind.MODEL_CHUNKS, Kind.MODEL_RECOVERED)


def _who(record: Record) -> str:
    if record.node_id.startswith("demo-node-"):
        return f"worker {record.node_id.removeprefix('demo-node-').upper()}"
    return record.node_id


def _line(record: Record) -> str:
    what = describe(record).text if record.kind in _MODEL_KINDS else _NARRATOR.what(record)
    return f"  [dim]#{record.seq:<3}[/] [cyan]{_who(record):<9}[/] {escape(what)[:110]}"


def _draft_chunks(records: list[Record], attempt: int = 1) -> list[dict[str, Any]]:
    return [c for r in records if r.kind == Kind.MODEL_CHUNKS and r.body.get("name") == "draft"
            and r.body.get("attempt") == attempt for c in r.body.get("chunks", ())]


def _calls(records: list[Record]) -> dict[str, dict[str, Any]]:
    return {str(r.body["name"]): r.body for r in records if r.kind == Kind.MODEL_CALL}


def _short(text: str, width: int = 70) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else f"...{flat[-width:]}"


class _LlmStory:
    """One run of the LLM demo: the endpoint, the workers, the checks."""

    def __init__(self, root: Path, console: Console, model: str) -> None:
        self.root = root
        self.console = console
        self.model = model
        self.app = build_llm_app(root, node_id="demo-launcher")
        self.workers: list[WorkerProcess] = []
        self.shown = 0
        self.object_id = LLM_OBJECT_ID
        self.problems: list[str] = []

    def say(self, text: str) -> None:
        self.console.print(f"\n[bold]{text}[/]")

    def follow(self) -> list[Record]:
        records = self.app.history(self.object_id)
        for rec in records[self.shown:]:
            if rec.kind != Kind.MODEL_CHUNKS or rec.body.get("start") == 0:
                self.console.print(_line(rec))
        self.shown = len(records)
        return records

    def until(self, what: str, done: Callable[[list[Record]], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not done(self.follow()):
            for worker in self.workers:
                if not worker.alive() and worker.proc.returncode != -signal.SIGKILL:
                    raise DemoError(f"worker {worker.label} exited with code "
                                    f"{worker.proc.returncode} while {what}:\n"
                                    f"{worker.log_tail()}")
            if time.monotonic() > deadline:
                raise DemoError(f"timed out after {timeout:.0f}s {what}")
            time.sleep(0.02)

    def start_worker(self, label: str) -> WorkerProcess:
        worker = WorkerProcess(label, self.root, app_ref=APP_REF)
        self.workers.append(worker)
        self.console.print(f"  started worker {label} (pid {worker.pid}); "
                           f"log in {worker.log_path.name}")
        return worker

    def run(self, fresh: bool, stack: ExitStack) -> int:
        console = self.console
        console.rule("[bold]perdure demo --llm: a model stream that survives SIGKILL")
        _prepare(self.root, fresh, console)
        self.object_id = unused_id(self.app, LLM_OBJECT_ID)
        base_url = os.environ.get("OPENAI_BASE_URL")
        server = None
        if base_url:
            if not os.environ.get("OPENAI_API_KEY"):
                raise DemoError("OPENAI_BASE_URL is set but OPENAI_API_KEY is not: set it "
                                "(any non-empty string for a server that needs no key)")
            console.print(f"endpoint {base_url} (OPENAI_BASE_URL), model {self.model}, "
                          "key from OPENAI_API_KEY")
        else:
            from perdure.llm.scripted import ScriptedServer

            server = stack.enter_context(ScriptedServer(responder=conversation))
            base_url = server.openai_base_url
            console.print(f"endpoint: the scripted local model server at {base_url} "
                          "(offline; set OPENAI_BASE_URL to use a real one)")

        self.say(f"1. Start object {self.object_id} (agent {LLM_AGENT!r}: outline, draft, "
                 "summary, each a streamed run.model call)")
        self.app.options(object_id=self.object_id).start(
            LLM_AGENT, self.model, base_url, server is not None)
        worker_a = self.start_worker("A")
        self.until("waiting for the draft to stream",
                   lambda recs: len({r.seq for r in recs if r.kind == Kind.MODEL_CHUNKS
                                     and r.body.get("name") == "draft"}) >= KILL_AFTER_BATCHES
                   or "draft" in _calls(recs), timeout=60)

        self.say("2. Kill worker A with SIGKILL while the draft streams")
        code = worker_a.kill()
        if code != -signal.SIGKILL:
            raise DemoError(f"worker A was not killed by SIGKILL (exit code {code})")
        records = self.follow()
        salvaged = "".join(str(c.get("text", "")) for c in _draft_chunks(records))
        if "draft" in _calls(records):
            console.print("  the draft finished before the kill: nothing to salvage this time")
        else:
            console.print(f"  memory holds {len(salvaged)} chars of the draft, journaled in "
                          f"batches: [green]{escape(_short(salvaged))}[/]")
        epoch_a = self.app.get(self.object_id).epoch
        console.print(f"  its lease lapses within {LEASE_SECONDS:g}s")

        self.say("3. Start worker B: it replays memory and continues the draft")
        self.start_worker("B")
        self.until("waiting for worker B to claim the object",
                   lambda _: self.app.get(self.object_id).epoch > epoch_a, timeout=30)
        result = self.app.handle(self.object_id).result(timeout=90)
        self.follow()
        self.workers[-1].stop()
        return self.check(result, salvaged, server)

    def check(self, result: Any, salvaged: str, server: Any) -> int:
        console = self.console
        records = self.app.history(self.object_id)
        calls = _calls(records)
        self.say("4. What happened to the draft")
        if set(calls) != {"outline", "draft", "summary"} or len(
                [r for r in records if r.kind == Kind.MODEL_CALL]) != 3:
            self.problems.append(f"expected one model_call each for outline, draft and "
                                 f"summary, found {sorted(calls)}")
        draft = str(result.get("draft", "")) if isinstance(result, dict) else ""
        recovered = [r.body for r in records if r.kind == Kind.MODEL_RECOVERED]
        if salvaged:
            prefix = next((c.request.prefix for c in recorded_calls(records)
                           if c.name == "draft"), "")
            self._check_recovery(recovered, prefix, salvaged, draft, server)
        console.print(f"  joined draft ({len(draft)} chars): {escape(draft)}")

        self.say("5. The ledger (the demo's illustrative prices)")
        for body in calls.values():
            reply = body.get("reply", {})
            use = reply.get("usage", {})
            console.print(f"  {body['name']:<8} attempt {body.get('attempt')}: "
                          f"{use.get('input_tokens', 0)} in + {use.get('output_tokens', 0)} "
                          f"out, ${body.get('cost')}")
        console.print(f"  {usage(self.app.usage(self.object_id, lineage=True))}")
        report = self.app.verify(self.object_id)
        console.print(("[green]verify ok[/] " if report.ok else "[red]verify FAILED[/] ")
                      + str(report))
        if not report.ok:
            self.problems.append(f"verification failed: {report}")
        if self.problems:
            for problem in self.problems:
                console.print(f"[red]problem:[/] {problem}")
            return 1
        console.rule("[bold green]llm demo passed")
        console.print(f"Look closer: perdure --store sqlite:///{self.root / 'demo.db'} "
                      f"show {self.object_id}")
        return 0

    def _check_recovery(self, recovered: list[dict[str, Any]], prefix: str,
                        salvaged: str, draft: str, server: Any) -> None:
        console = self.console
        if not recovered or {b.get("recovery") for b in recovered} != {"continue"}:
            self.problems.append(f"expected a 'continue' recovery, found {recovered}")
        else:
            console.print(f"  worker B recorded the recovery: continue from "
                          f"{recovered[0]['chars']} salvaged chars "
                          f"({recovered[0]['chunks']} chunks)")
        if not prefix.startswith(salvaged):  # the continued request's, read from memory
            self.problems.append("the continuation did not start from the salvaged text")
        if server is not None:
            self._server_story(server.requests, salvaged, draft)
        if not draft.startswith(salvaged):
            self.problems.append("the joined draft does not start with the salvaged text")
        console.print(f"  salvaged part [green]{len(salvaged)}[/] chars + continuation "
                      f"[yellow]{len(draft) - len(salvaged)}[/] chars")


    def _server_story(self, sent: list[Any], salvaged: str, draft: str) -> None:
        """What the scripted server heard: the outline asked once (on replay it came from
        memory), and the continuation request carrying the salvaged text."""
        outline_q = prompts(TOPIC)[0]
        outlines = sum(1 for r in sent if r.last_user_text() == outline_q)
        continuations = [r.body["messages"][-2:] for r in sent
                         if len(r.body.get("messages") or ()) >= 2
                         and r.body["messages"][-2].get("content") == salvaged]
        self.console.print(f"  the model was asked {len(sent)} times; the outline "
                           f"{outlines} time(s): on replay it came from memory")
        if outlines != 1:
            self.problems.append(f"the outline was asked {outlines} times, expected once")
        if not continuations:
            self.problems.append("the model never got the salvaged text to continue from")
        else:
            assistant, turn = continuations[0]
            self.console.print(f"  the continuation request ends with the salvaged text as "
                               f"an {assistant.get('role')} message and the turn: "
                               f"[yellow]{escape(str(turn.get('content')))}[/]")
        if draft != DRAFT:
            self.problems.append("the joined draft is not the draft the model wrote")


def run_llm_demo(folder: str | Path = LLM_DEFAULT_DIR, *, fresh: bool = False,
                 model: str | None = None, console: Console | None = None) -> int:
    """Run the model-stream crash story in ``folder``; return 0 when all held.

    Offline against the scripted local server, or against ``OPENAI_BASE_URL`` with
    ``OPENAI_API_KEY`` when it is set; ``model`` defaults to ``OPENAI_MODEL`` or
    ``gpt-4o-mini``. ``fresh`` deletes the folder first (only one an earlier demo made).
    """
    out = console or Console(highlight=False)
    chosen = model or os.environ.get("OPENAI_MODEL") or DEFAULT_MODEL
    story = _LlmStory(Path(folder).resolve(), out, chosen)
    try:
        with ExitStack() as stack:
            return story.run(fresh, stack)
    except (DemoError, PerdureError) as exc:
        return report_failure(out, exc, story.workers)
    finally:
        for worker in story.workers:
            worker.stop()
        story.app.close()
