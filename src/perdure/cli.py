"""The ``perdure`` command line: run nodes, start and inspect objects, verify memory.

Settings come from flags or ``PERDURE_<FLAG>`` environment variables (shown in
``--help``); this is the only place perdure reads the environment.
"""

from __future__ import annotations

import datetime as dt
import importlib
import json
import logging
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from perdure.app import App
from perdure.core.records import Kind, Record
from perdure.errors import PerdureError
from perdure.handle import ObjectInfo

__all__ = ["main"]

F = TypeVar("F", bound=Callable[..., Any])

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def _fail(message: str, code: int = 1) -> NoReturn:
    err.print(f"[bold red]error:[/] {message}", markup=True)
    sys.exit(code)


def _load_app(spec: str) -> App:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        _fail(f"--app {spec!r} must look like module:attribute (for example myagents:app)")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        _fail(f"cannot import {module_name!r} for --app: {exc}")
    app = getattr(module, attr, None)
    if not isinstance(app, App):
        _fail(f"{spec!r} is not a perdure.App (found {type(app).__name__})")
    return app


class _Ctx:
    def __init__(self, store: str | None, app_spec: str | None, key_dir: str | None,
                 node_id: str | None) -> None:
        self.store_url = store
        self.app_spec = app_spec
        self.key_dir = key_dir
        self.node_id = node_id
        self._app: App | None = None

    def app(self, *, need_agents: bool = False) -> App:
        if self._app is not None:
            return self._app
        if self.app_spec:
            app = _load_app(self.app_spec)
            if self.store_url or self.key_dir or self.node_id:
                app = app.with_settings(store=self.store_url, key_dir=self.key_dir,
                                        node_id=self.node_id)
        elif need_agents:
            _fail("this command needs your agents: pass --app module:app or set PERDURE_APP")
        elif self.store_url:
            app = App(store=self.store_url, key_dir=self.key_dir, node_id=self.node_id)
        else:
            _fail("no store: pass --store URL (e.g. sqlite:///agents.db) or set PERDURE_STORE")
        self._app = app
        return app


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


_STATUS_STYLE = {
    "completed": "green", "failed": "red", "cancelled": "yellow", "parked": "bold red",
    "running": "cyan", "dormant": "blue", "paused": "magenta", "ready": "white",
}


def _status(info: ObjectInfo) -> str:
    style = _STATUS_STYLE.get(info.status, "white")
    return f"[{style}]{info.status}[/]"


@click.group(context_settings={"help_option_names": ["-h", "--help"],
                                "auto_envvar_prefix": "PERDURE"})
@click.option("--store", envvar="PERDURE_STORE", show_envvar=True,
              help="Store URL, e.g. sqlite:///agents.db (default: the App's own).")
@click.option("--app", "app_spec", envvar="PERDURE_APP", show_envvar=True,
              help="Your App as module:attribute, e.g. myagents:app.")
@click.option("--key-dir", envvar="PERDURE_KEY_DIR", show_envvar=True,
              help="Folder of this node's Ed25519 key pair (default ~/.perdure/keys).")
@click.option("--node-id", envvar="PERDURE_NODE_ID", show_envvar=True,
              help="This node's id (default hostname-keyfingerprint).")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
@click.pass_context
def cli(ctx: click.Context, store: str | None, app_spec: str | None, key_dir: str | None,
        node_id: str | None, verbose: int) -> None:
    """perdure: durable agents that survive crashes and resume on any node."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # The PostgreSQL pool logs every failed reconnection; perdure says it once itself.
    logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL if verbose < 2 else logging.DEBUG)
    ctx.obj = _Ctx(store, app_spec, key_dir, node_id)


@cli.command()
@click.option("--concurrency", default=16, show_default=True, envvar="PERDURE_CONCURRENCY",
              show_envvar=True, help="Objects this node runs at once.")
@click.option("--lease", "lease_seconds", type=float, envvar="PERDURE_LEASE", show_envvar=True,
              help="Lease length in seconds (default: the App's, 30).")
@click.option("--poll", "poll_interval", type=float, envvar="PERDURE_POLL", show_envvar=True,
              help="Idle poll interval in seconds (default: the App's, 0.1).")
@click.option("--capability", "capabilities", multiple=True, metavar="NAME",
              help="A capability this node has (repeatable), added to the App's own; objects "
                   "and steps that require one go only to nodes that have it.")
@click.pass_obj
def worker(obj: _Ctx, concurrency: int, lease_seconds: float | None,
           poll_interval: float | None, capabilities: tuple[str, ...]) -> None:
    """Run a node: claim runnable objects and carry them forward until Ctrl-C/SIGTERM."""
    app = obj.app(need_agents=True)
    app.capabilities = app.capabilities | frozenset(capabilities)
    if lease_seconds is not None:
        app.lease_seconds = lease_seconds
    if poll_interval is not None:
        app.poll_interval = poll_interval
    logging.getLogger("perdure").setLevel(min(logging.getLogger().level, logging.INFO))
    serving = ", ".join(f"{a.name}@{a.version}" for a in app.agents.values()) or "no agents"
    caps = f", capabilities {', '.join(sorted(app.capabilities))}" if app.capabilities else ""
    err.print(f"node {app.node_id} serving {serving} from {app.store_url} "
              f"(concurrency {concurrency}{caps})")
    app.run_worker(concurrency=concurrency)


def _json_arg(text: str | None, what: str) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        _fail(f"{what} is not valid JSON ({exc.msg} at column {exc.colno}): {text!r}")


@cli.command()
@click.argument("agent")
@click.option("--args", "args_json", default="[]", show_default=True,
              help="Positional arguments as a JSON list (a single JSON value is one argument).")
@click.option("--kwargs", "kwargs_json", default="{}", show_default=True,
              help="Keyword arguments as a JSON object.")
@click.option("--id", "object_id", help="Object id (idempotent: an existing id is reused).")
@click.option("--deadline", type=float, help="Seconds from now before the object is terminated.")
@click.pass_obj
def start(obj: _Ctx, agent: str, args_json: str, kwargs_json: str, object_id: str | None,
          deadline: float | None) -> None:
    """Start an object running AGENT."""
    args = _json_arg(args_json, "--args")
    if not isinstance(args, list):
        args = [args]
    kwargs = _json_arg(kwargs_json, "--kwargs")
    if not isinstance(kwargs, dict):
        _fail("--kwargs must be a JSON object")
    app = obj.app(need_agents=True)
    handle = app.start(agent, *args, object_id=object_id, deadline=deadline, **kwargs)
    out.print(handle.object_id)


@cli.command(name="ls")
@click.option("--status", help="Only objects with this status (ready, running, dormant, ...).")
@click.option("--phase", help="Only objects in this lifecycle phase.")
@click.option("--agent", help="Only objects of this agent.")
@click.option("--limit", default=50, show_default=True)
@click.pass_obj
def ls_(obj: _Ctx, status: str | None, phase: str | None, agent: str | None, limit: int) -> None:
    """List objects, newest first."""
    infos = obj.app().list(status=status, phase=phase, agent=agent, limit=limit)
    table = Table(box=None, pad_edge=False)
    for col in ("id", "agent", "status", "phase", "records", "epoch", "updated", "note"):
        table.add_column(col)
    for info in infos:
        table.add_row(info.object_id, f"{info.agent}@{info.agent_version}", _status(info),
                      info.phase, str(info.records), str(info.epoch), _when(info.updated_at),
                      info.note or "")
    out.print(table)


def _describe(rec: Record) -> str:
    body = rec.body
    kind = rec.kind
    if kind == Kind.INSTANTIATED:
        intent = body["intent"]
        return f"{intent['agent']}@{intent['version']} args={json.dumps(intent['args'])}"
    if kind in (Kind.STEP_DONE, Kind.STEP_FAILED, Kind.STEP_STARTED, Kind.STEP_IN_DOUBT):
        text = f"#{body.get('pos')} {body.get('name')} attempt {body.get('attempt', '-')}"
        if kind == Kind.STEP_DONE:
            text += f" -> {json.dumps(body.get('result'))[:80]} ({body.get('latency', 0):.4f}s)"
        if kind == Kind.STEP_FAILED:
            error = body.get("error", {})
            text += f" {error.get('type')}: {error.get('message')} [{body.get('error_class')}]"
            text += " final" if body.get("final") else f" retry at {_when(body.get('retry_at'))}"
        return text
    if kind == Kind.DORMANT:
        until = f" until {_when(body['wake_at'])}" if body.get("wake_at") is not None else ""
        if body.get("event"):
            return f"#{body.get('pos')} waiting for event {body.get('event')!r}{until}"
        return f"#{body.get('pos')} {body.get('reason')}{until}"
    if kind == Kind.WOKE:
        return f"#{body.get('pos')} timer due"
    if kind == Kind.EVENT_RECEIVED:
        return f"#{body.get('pos')} {body.get('name')} = {json.dumps(body.get('payload'))[:80]}"
    if kind == Kind.TERMINATED:
        detail = body.get("result") if body.get("outcome") == "completed" else body.get("error")
        return f"{body.get('outcome')}: {json.dumps(detail)[:100]}"
    if kind == Kind.INTENT_REFINED:
        return f"intent v{body['intent'].get('version_no')}: {json.dumps(body.get('changes'))}"
    if kind == Kind.NONDETERMINISM:
        return str(body.get("reason"))
    if kind == Kind.PROGRESS:
        return json.dumps(body.get("fields"))
    return json.dumps(body)[:100]


@cli.command()
@click.argument("object_id")
@click.pass_obj
def show(obj: _Ctx, object_id: str) -> None:
    """Show an object and its memory timeline."""
    app = obj.app()
    info = app.get(object_id)
    out.print(f"[bold]{info.object_id}[/]  {info.agent}@{info.agent_version}  {_status(info)}  "
              f"phase {info.phase}  epoch {info.epoch}  created {_when(info.created_at)}")
    if info.note:
        out.print(f"note: {info.note}")
    if info.waiting_event:
        out.print(f"waiting for event {info.waiting_event!r}")
    table = Table(box=None, pad_edge=False)
    rows = [(str(rec.seq), _when(rec.ts)[11:], rec.node_id, str(rec.kind), _describe(rec))
            for rec in app.history(object_id)]
    widths = [max([len(col), *(len(row[i]) for row in rows)])
              for i, col in enumerate(("seq", "time", "node", "kind"))]
    for col, width in zip(("seq", "time", "node", "kind"), widths, strict=True):
        table.add_column(col, no_wrap=True, min_width=width)
    table.add_column("what")
    room = max(20, out.width - sum(widths) - 2 * len(widths) - 1)  # one line per record
    for row in rows:
        what = row[4] if len(row[4]) <= room else row[4][: room - 1] + "…"
        table.add_row(*(Text(cell) for cell in (*row[:4], what)))  # record text is not markup
    out.print(table)
    children = app.list(parent=object_id, limit=1000)
    if children:
        out.print(f"children ({len(children)}):")
        for child in reversed(children):
            out.print(f"  {child.object_id}  {child.agent}@{child.agent_version}  "
                      f"{_status(child)}  phase {child.phase}")


@cli.command()
@click.argument("object_id")
@click.pass_obj
def tree(obj: _Ctx, object_id: str) -> None:
    """Print an object's lineage: its descendants with each one's status and phase."""
    app = obj.app()
    root = app.get(object_id)
    lines: list[str] = []

    def walk(info: ObjectInfo, prefix: str, last: bool, top: bool) -> None:
        branch = "" if top else ("└── " if last else "├── ")
        lines.append(f"{prefix}{branch}{info.object_id}  {info.agent}@{info.agent_version}  "
                     f"{_status(info)}  phase {info.phase}")
        kids = list(reversed(app.list(parent=info.object_id, limit=10_000)))
        inner = prefix if top else prefix + ("    " if last else "│   ")
        for index, kid in enumerate(kids):
            walk(kid, inner, index == len(kids) - 1, False)

    walk(root, "", True, True)
    for line in lines:
        out.print(line)


@cli.command(name="replay-check")
@click.argument("object_ids", nargs=-1)
@click.pass_obj
def replay_check(obj: _Ctx, object_ids: tuple[str, ...]) -> None:
    """Replay live objects' memory against the current code (--app) without running steps.

    Reports which objects would diverge after a deploy, and where (recorded vs found);
    exit 1 if any would. Checks the named objects, or every object not yet terminated.
    """
    app = obj.app(need_agents=True)
    reports = app.replay_check(list(object_ids) or None)
    bad = 0
    for report in reports:
        style = {"compatible": "green", "not-served": "yellow"}.get(report.verdict, "red")
        out.print(Text.assemble((f"{report.verdict:<11}", style),
                                f" {report.object_id} ({report.agent}@{report.version}): "
                                f"{report.detail}"))
        bad += not report.ok
    out.print(f"{len(reports)} checked, {bad} would diverge")
    if bad:
        sys.exit(1)


@cli.command()
@click.argument("object_id")
@click.argument("event")
@click.argument("payload", required=False)
@click.option("--dedupe-key", help="Deliver at most once per key.")
@click.pass_obj
def send(obj: _Ctx, object_id: str, event: str, payload: str | None,
         dedupe_key: str | None) -> None:
    """Send EVENT (with a JSON PAYLOAD) to an object."""
    value = _json_arg(payload, "PAYLOAD")
    fresh = obj.app().send(object_id, event, value, dedupe_key=dedupe_key)
    out.print(f"sent {event!r} to {object_id}" if fresh else
              f"duplicate: {event!r} with key {dedupe_key!r} was already sent")


def _control(name: str, doc: str) -> None:
    @cli.command(name=name, help=doc)
    @click.argument("object_id")
    @click.pass_obj
    def command(obj: _Ctx, object_id: str) -> None:
        info = getattr(obj.app(), name)(object_id)
        out.print(f"{object_id}: {name} requested; now {info.status}")


_control("pause", "Hold an object at its next command boundary.")
_control("resume", "Release a paused object, or retry a parked one after fixing its code.")
_control("cancel", "Cancel an object; it terminates at its next command boundary.")


@cli.command()
@click.argument("object_ids", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Verify every object in the store.")
@click.pass_obj
def verify(obj: _Ctx, object_ids: tuple[str, ...], all_: bool) -> None:
    """Verify hash chain and signatures; exit 1 naming the first bad record."""
    app = obj.app()
    ids = list(object_ids)
    if all_:
        ids += [info.object_id for info in app.list(limit=1_000_000)]
    if not ids:
        _fail("name an object id, or pass --all")
    bad = 0
    for object_id in ids:
        report = app.verify(object_id)
        if report.ok:
            out.print(f"[green]ok[/]   {report}")
        else:
            bad += 1
            out.print(f"[red]FAIL[/] {report}")
    if bad:
        sys.exit(1)


@cli.command()
@click.argument("object_id")
@click.option("--wait", type=float, default=0.0, help="Seconds to wait for the result.")
@click.pass_obj
def result(obj: _Ctx, object_id: str, wait: float) -> None:
    """Print an object's result as JSON (waiting up to --wait seconds)."""
    value = obj.app().handle(object_id).result(timeout=wait)
    out.print_json(json.dumps(value))


@cli.command()
@click.option("--dir", "folder", default="demo-data", show_default=True,
              help="Folder for the demo's store, keys and input files.")
@click.option("--fresh", is_flag=True,
              help="Delete the demo folder first (only a folder an earlier demo made).")
def demo(folder: str, fresh: bool) -> None:
    """Run the crash-and-resume demo end to end on an embedded SQLite store."""
    from perdure.demo import run_demo

    sys.exit(run_demo(folder, fresh=fresh, console=out))


def main() -> None:
    """Entry point of the ``perdure`` console script."""
    try:
        cli(standalone_mode=False)
    except click.exceptions.Abort:
        err.print("aborted")
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except PerdureError as exc:
        _fail(str(exc))
    except KeyboardInterrupt:
        sys.exit(130)
