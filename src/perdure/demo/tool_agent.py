"""The ``perdure demo --agent`` agent: a housekeeper that plans with a model, runs
low-risk tools on its own and asks a person before a risky one.

Its task: free space in a sandbox folder's ``tmp`` directory and tell the team. The model
(offline: the scripted local server, answered by ``planner``; any OpenAI-compatible
endpoint through ``OPENAI_BASE_URL``) proposes tool calls; the gate decides each under
``POLICY``: ``list_files`` and ``disk_usage`` (low risk) run at once, ``delete_files``
and ``send_message`` (high risk) wait for a person, with the object dormant (no process,
no lease) until someone runs ``perdure approve``. Paths are confined to the sandbox by a
``PathPrefix`` constraint, so a proposal to delete anything else is denied.

``perdure.demo.tool_agent:app`` is the App for worker processes; its folder comes from
``PERDURE_DEMO_DIR`` (default ``demo-agent``).
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from perdure import Allow, App, PathPrefix, Policy, Run
from perdure.demo.agents import DEMO_DIR_ENV, LEASE_SECONDS
from perdure.llm import ChatCompletionsClient, Message  # without perdure[llm]: says so
from perdure.llm.scripted import RecordedRequest, ScriptedReply, ScriptedToolCall, Step

importlib.import_module("openai")  # now, not on a worker's loop at its first model call

__all__ = ["AGENT_DEFAULT_DIR", "HOUSEKEEPER", "OFFLINE_KEY", "POLICY", "TASK", "app",
           "build_agent_app", "outbox", "planner", "sandbox"]

HOUSEKEEPER = "housekeeper"
AGENT_DEFAULT_DIR = "demo-agent"
OFFLINE_KEY = "offline-demo"
TASK = ("Free disk space under {root}/tmp: look at what is there, delete the old build "
        "files, then tell #ops what you did. Use the tools.")


def sandbox(folder: str | Path) -> Path:
    """The folder the housekeeper's tools may touch."""
    return Path(folder).resolve() / "srv"


def outbox(folder: str | Path) -> Path:
    """The file ``send_message`` appends to (one JSON line per message, once per key)."""
    return Path(folder).resolve() / "outbox.jsonl"


POLICY = Policy(
    "housekeeping",
    rules=(Allow({"list_files", "disk_usage", "delete_files", "send_message"},
                 agents={HOUSEKEEPER}, name="housekeeping-tools", max_per_object=12),),
    approval_from="high",
)
"""Low and medium risk run at once; high risk waits for a person."""


def build_agent_app(folder: str | Path, *, node_id: str | None = None) -> App:
    """The agent demo App: store ``<folder>/demo.db``, keys in ``<folder>/keys``, agent
    ``housekeeper`` and its four tools."""
    root = Path(folder).resolve()
    box = sandbox(root)
    demo_app = App(store=f"sqlite:///{root / 'demo.db'}", key_dir=root / "keys",
                   node_id=node_id, lease_seconds=LEASE_SECONDS, poll_interval=0.05)
    inside = (PathPrefix("path", (str(box),)),)

    @demo_app.tool(risk="low", constraints=inside)
    def list_files(path: str) -> list[dict[str, Any]]:
        """List the files in a directory with their sizes in bytes.

        Args:
            path: the directory
        """
        where = Path(path)
        if not where.is_dir():
            return []
        return [{"name": p.name, "bytes": p.stat().st_size}
                for p in sorted(where.iterdir()) if p.is_file()]

    @demo_app.tool(risk="low", constraints=inside)
    def disk_usage(path: str) -> dict[str, int]:
        """Bytes used by the files under a directory.

        Args:
            path: the directory
        """
        return {"bytes": sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())}

    @demo_app.tool(risk="high", constraints=inside)
    def delete_files(path: str, names: list[str]) -> dict[str, Any]:
        """Delete files from a directory (asks a person first).

        Args:
            path: the directory
            names: the file names to delete in it
        """
        deleted, missing = [], []
        for name in names:
            target = (Path(path) / name).resolve()
            if target.parent != Path(path).resolve():
                missing.append(name)  # a name that leaves the directory: not touched
            elif target.exists():
                target.unlink()
                deleted.append(name)
            else:
                missing.append(name)  # deleted by an earlier run of this very call
        return {"deleted": deleted, "not_found": missing}

    @demo_app.tool(risk="high")
    def send_message(channel: str, text: str, idempotency_key: str) -> str:
        """Post a message to a team channel (asks a person first).

        Args:
            channel: the channel, such as #ops
            text: the message
        """
        box_file = outbox(root)
        sent = box_file.read_text().splitlines() if box_file.exists() else []
        if not any(json.loads(line)["key"] == idempotency_key for line in sent):
            with open(box_file, "a", encoding="utf-8") as out:
                out.write(json.dumps({"key": idempotency_key, "channel": channel,
                                      "text": text}) + "\n")
        return f"posted to {channel}"

    @demo_app.agent(name=HOUSEKEEPER)
    async def housekeeper(run: Run, model: str, base_url: str | None = None,
                          offline: bool = True) -> dict[str, Any]:
        """Plan with the model and carry out its tool calls through the gate."""
        client = (ChatCompletionsClient(base_url=base_url, api_key=lambda: OFFLINE_KEY)
                  if offline else ChatCompletionsClient(base_url=base_url))
        try:
            result = await run.agent(
                client, model=model,
                messages=[Message.system("You are a careful operations assistant."),
                          Message.user(TASK.format(root=box))],
                tools=demo_app.tools, policy=POLICY, max_turns=8, name="plan")
        finally:
            await client.aclose()
        return {"answer": result.text, "stopped": result.stopped, "turns": result.turns,
                "calls": [f"{o.tool}: {o.outcome}" for o in result.calls]}

    return demo_app


def seed(folder: str | Path) -> list[str]:
    """Fill the sandbox with a few files to clean up; their names."""
    tmp = sandbox(folder) / "tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    names = {"build-0412.tar": 4096, "build-0413.tar": 8192, "notes.txt": 120}
    for name, size in names.items():
        (tmp / name).write_bytes(b"x" * size)
    return sorted(names)


def _turn(request: RecordedRequest) -> int:
    return sum(1 for m in request.body.get("messages") or () if m.get("role") == "assistant")


def _tmp_of(request: RecordedRequest) -> str:
    text = request.last_user_text() or ""
    for message in request.body.get("messages") or ():
        if message.get("role") == "user":
            text = str(message.get("content"))
    return text.split("under ", 1)[1].split(":", 1)[0] if "under " in text else "."


def planner(request: RecordedRequest) -> Step:
    """The scripted model: look (two tools at once), delete the builds, tell #ops, answer."""
    tmp = _tmp_of(request)
    turn = _turn(request)
    if turn == 0:
        return ScriptedReply(text="Let me look first.", tool_calls=(
            ScriptedToolCall("list_files", json.dumps({"path": tmp})),
            ScriptedToolCall("disk_usage", json.dumps({"path": tmp}))))
    if turn == 1:
        return ScriptedReply(tool_calls=(ScriptedToolCall("delete_files", json.dumps(
            {"path": tmp, "names": ["build-0412.tar", "build-0413.tar"]})),))
    if turn == 2:
        return ScriptedReply(tool_calls=(ScriptedToolCall("send_message", json.dumps(
            {"channel": "#ops", "text": f"Deleted two old build archives from {tmp}."})),))
    return ScriptedReply(text="Done: I deleted the two old build archives (12 KiB) and told "
                              "#ops. notes.txt was kept.")


app = build_agent_app(os.environ.get(DEMO_DIR_ENV) or AGENT_DEFAULT_DIR)
"""The agent demo App for ``perdure --app perdure.demo.tool_agent:app worker``."""
