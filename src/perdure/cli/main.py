"""The ``perdure`` command line: run nodes, start and inspect objects, verify memory.

Settings come from flags or ``PERDURE_<FLAG>`` environment variables (shown in
``--help``); this is the only place perdure reads the environment.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import os
import sys
import textwrap
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from perdure import __version__
from perdure import describe as view
from perdure.app import App
from perdure.cli.api import api, api_token
from perdure.cli.approvals import approvals, approve, reject
from perdure.cli.data_keys import data_key
from perdure.cli.keys import keys
from perdure.cli.queues import queues
from perdure.cli.quotas import quotas
from perdure.cli.schedules import schedules
from perdure.cli.steer import fork, query, questions, retry
from perdure.cli.tail import tail
from perdure.cli.triggers import declared_triggers, triggers
from perdure.cli.ui import start_ui, ui
from perdure.core.chain import VerifyReport
from perdure.core.lifecycle import Status
from perdure.core.records import Record
from perdure.core.sealing import sealed_shown
from perdure.core.secret import Secret
from perdure.core.usage import usage_totals
from perdure.engine import ReplayReport
from perdure.engine.settings import DRAIN_SECONDS
from perdure.errors import (
    AgentFailedError,
    ConfigurationError,
    PerdureError,
    RecordDecodeError,
    StoreError,
)
from perdure.info import ObjectInfo
from perdure.keys.folder import KeyFolder, default_key_dir
from perdure.keys.identity import NodeIdentity
from perdure.resources.lines import shown_body, slot_lines
from perdure.testing import History, Replayer, history_files
from perdure.triggers import Triggers

__all__ = ["main"]

F = TypeVar("F", bound=Callable[..., Any])

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def _fail(message: str, code: int = 1) -> NoReturn:
    err.print(Text.assemble(("error:", "bold red"), " ", message))  # the message is not markup
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
    apps = sorted(name for name, value in vars(module).items() if isinstance(value, App))
    hint = f"; its Apps: {', '.join(f'{module_name}:{name}' for name in apps)}" if apps else ""
    if not hasattr(module, attr):
        _fail(f"--app {spec}: module {module_name!r} has no attribute {attr!r}{hint}")
    app = getattr(module, attr)
    if not isinstance(app, App):
        _fail(f"--app {spec}: {attr!r} is a {type(app).__name__}, not a perdure.App{hint}")
    return app


# Commands that may set a key folder up, or never read or sign with one.
_MAY_MAKE_KEYS = frozenset({"worker", "start", "api", "fork", "demo", "keys", "cancel", "pause",
                            "resume", "retry", "forget-heads", "triggers"})


class _Ctx:
    def __init__(self, store: str | None, app_spec: str | None, key_dir: str | None,
                 node_id: str | None, trust: str | None, passphrase: bytes | None) -> None:
        self.store_url = store
        self.app_spec = app_spec
        self.key_dir = key_dir
        self.node_id = node_id
        self.trust = trust
        self.passphrase = passphrase
        self.data_keys: str | None = None  # --data-keys
        self._app: App | None = None
        self._loaded: App | None = None

    def loaded(self) -> App | None:
        """The App that ``--app`` names, imported once (``None`` without ``--app``)."""
        if self._loaded is None and self.app_spec:
            self._loaded = _load_app(self.app_spec)
        return self._loaded

    def app(self, *, need_agents: bool = False) -> App:
        if self._app is not None:
            return self._app
        base = self.loaded()
        if base is not None:
            app = base
            if (self.store_url or self.key_dir or self.node_id or self.trust
                    or self.passphrase):
                app = app.with_settings(store=self.store_url, key_dir=self.key_dir,
                                        node_id=self.node_id, trust=self.trust,
                                        key_passphrase=self.passphrase)
        elif need_agents:
            _fail("this command needs your agents: pass --app module:app or set PERDURE_APP")
        elif self.store_url:
            app = App(store=self.store_url, key_dir=self.key_dir, node_id=self.node_id,
                      trust=self.trust, key_passphrase=self.passphrase)
        else:
            _fail("no store: pass --store URL (e.g. sqlite:///agents.db) or set PERDURE_STORE")
        if self.data_keys:
            app = app.with_settings(data_keys=self.data_keys)
        app.open_sealed = False  # the CLI never opens: sealed values print as <sealed>
        self._require_keys(app)
        self._app = app
        return app

    def _require_keys(self, app: App) -> None:
        """A command that only reads or answers never makes a fresh root: with no roots
        in the key folder (and no ``--trust``), one line naming the folder and what to
        run. ``worker``, ``start``, ``fork``, ``demo`` and ``keys`` may set a folder up."""
        command = click.get_current_context(silent=True)
        inner = command.info_name if command is not None else None
        while command is not None and command.parent is not None and (
                command.parent.parent is not None):
            command = command.parent  # up to the top-level command (``keys``, not ``list``)
        top = command.info_name if command is not None and command.parent is not None else None
        if top is None or top in _MAY_MAKE_KEYS or app.identity.explicit_trust:
            return
        if top == "schedules" and inner != top:  # create, pause, ...: not the listing
            return
        app.store  # noqa: B018 - a store that cannot be opened says so first, in its own words
        folder = app.identity.folder
        if folder.roots():
            return
        given = ("--key-dir / PERDURE_KEY_DIR" if self.key_dir else
                 f"the default for {app.store_url}")
        _fail(f"no trusted root in key folder {folder.path} ({given}), and `perdure "
              f"{top}` does not make one: pass --key-dir FOLDER (or set PERDURE_KEY_DIR) "
              "to the folder your workers use, or start a worker or an object on this store "
              "first (that sets the folder up)")

    def key_folder(self) -> KeyFolder:
        """The key folder: ``--key-dir``, else the ``--app`` App's, else the default."""
        return self.identity().folder

    def identity(self) -> NodeIdentity:
        """This node's identity as the options (and ``--app``) give it, without a store."""
        base = self.loaded()
        if self.key_dir:
            folder = Path(self.key_dir)
        elif base is not None and (base.key_dir_setting is not None or not self.store_url):
            folder = base.identity.folder.path
        else:
            folder = default_key_dir(self.store_url)
        node_id = self.node_id or (base.identity.node_id_setting if base is not None else None)
        trust = self.trust or (base.trust_setting if base is not None else None)
        return NodeIdentity(folder, node_id=node_id, trust=trust, passphrase=self.passphrase)


def _object_line(info: ObjectInfo, indent: str = "") -> Text:
    """An object on one line (``tree``, ``show``'s children); its id is not markup."""
    return Text.assemble(indent, *view.object_parts(info))


# -- machine-readable output (--json) -------------------------------------------------


def _print_json(document: Any) -> None:
    """Write one JSON document to stdout: no markup, colour or wrapping."""
    click.echo(json.dumps(document, indent=2, ensure_ascii=False, default=str))


def _info_json(info: ObjectInfo) -> dict[str, Any]:
    """Every ``ObjectInfo`` field, as JSON values."""
    doc = {field.name: getattr(info, field.name) for field in dataclasses.fields(info)}
    doc["status"] = str(info.status)
    doc["requires"] = list(info.requires)
    doc["asking"] = [q.to_json() for q in info.asking]
    return doc


def _record_json(rec: Record) -> dict[str, Any]:
    return {"seq": rec.seq, "ts": rec.ts, "node_id": rec.node_id, "kind": str(rec.kind),
            "body": shown_body(rec.kind, rec.body)}  # (resource secrets masked)


def _report_json(report: VerifyReport) -> dict[str, Any]:
    return {"object_id": report.object_id, "ok": report.ok, "records": report.records,
            "bad_seq": report.bad_seq, "reason": report.reason, "head_hash": report.head_hash}


# -- text layout at the terminal's width ------------------------------------------------


def _explained(app: App, info: ObjectInfo) -> ObjectInfo:
    """A failed object without a note gets its failure, read from its memory, as note."""
    if info.status is not Status.FAILED or info.note:
        return info
    try:
        note = view.failure(app.history(info.object_id))
    except StoreError:
        raise
    except PerdureError as exc:  # damaged memory: say so rather than stop the listing
        note = f"memory cannot be read: {exc}"
    return dataclasses.replace(info, note=note) if note else info


def _wrap(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` characters; nothing is dropped."""
    return textwrap.wrap(text, max(width, 10), break_on_hyphens=False) or [""]


def _flow(parts: Sequence[str | Text], width: int, indent: str = "    ") -> list[Text]:
    """Join ``parts`` with two spaces, starting a new (indented) line where one would
    run past ``width``; a part is never split, so an id is never cut."""
    lines: list[Text] = []
    line = Text()
    for part in parts:
        if line and len(line) + 2 + len(part) > width:
            lines.append(line)
            line = Text(indent)
        elif line:
            line.append("  ")
        line.append(part)
    lines.append(line)
    return lines


_LS_COLUMNS = view.LISTING_COLUMNS
_NOTE_ROOM = 30  # the least width at which notes stay in a column of their own


def _ls_lines(infos: Sequence[ObjectInfo], width: int) -> list[Text]:
    """The ``ls`` listing, fitted to ``width`` without cutting ids or notes.

    Wide enough: one row per object, the note in the last column, wrapped beneath
    itself. Narrower: each object's note goes on indented lines below its row, and
    columns that do not fit (records, epoch, updated) go there too.
    """
    rows = [view.listing_row(info) for info in infos]
    widths = [max([len(col), *(len(row[i]) for row in rows)])
              for i, col in enumerate(_LS_COLUMNS)]
    styles = [view.STATUS_STYLE.get(info.status, "white") for info in infos]
    full = sum(widths) + 2 * len(widths)
    if full + _NOTE_ROOM <= width or (full + 4 <= width
                                      and all(not info.note for info in infos)):
        shown = len(_LS_COLUMNS)
        note_at: int | None = full
    else:
        shown, note_at = 4, None  # id, agent, status, phase always stay on the row
        while (shown < len(_LS_COLUMNS)
               and sum(widths[: shown + 1]) + 2 * shown <= width):
            shown += 1

    def row_text(cells: Sequence[str], style: str | None) -> Text:
        line = Text()
        for i, cell in enumerate(cells[:shown]):
            padded = cell.ljust(widths[i]) + "  " if i < shown - 1 or note_at else cell
            line.append(padded, style=style if i == 2 else None)
        return line

    lines = [row_text(_LS_COLUMNS, None)]
    if note_at is not None:
        lines[0].append("note")
    indent = "    "
    for info, row, style in zip(infos, rows, styles, strict=True):
        line = row_text(row, style)
        notes = _wrap(info.note, width - note_at) if info.note and note_at else []
        if notes:
            line.append(notes[0])
        line.rstrip()
        lines.append(line)
        if note_at is not None:
            lines.extend(Text(" " * note_at + more) for more in notes[1:])
            continue
        rest = [f"{col} {value}" for col, value in zip(_LS_COLUMNS[shown:], row[shown:],
                                                         strict=True)]
        if rest:
            lines.extend(Text(indent) + text
                         for text in _flow(rest, width - len(indent), indent=""))
        if info.note:
            lines.extend(Text(indent + text) for text in _wrap(info.note, width - len(indent)))
    return lines


@click.group(context_settings={"help_option_names": ["-h", "--help"],
                                "auto_envvar_prefix": "PERDURE"})
@click.option("--store", envvar="PERDURE_STORE", show_envvar=True,
              help="Store URL, e.g. sqlite:///agents.db (default: the App's own).")
@click.option("--app", "app_spec", envvar="PERDURE_APP", show_envvar=True,
              help="Your App as module:attribute, e.g. myagents:app.")
@click.option("--key-dir", envvar="PERDURE_KEY_DIR", show_envvar=True,
              help="Folder of this node's Ed25519 key pair (default: keys/ beside a SQLite "
                   "store's file, else ~/.perdure/keys).")
@click.option("--node-id", envvar="PERDURE_NODE_ID", show_envvar=True,
              help="The name this node acts under; a trusted root must have certified its "
                   "key under it (default: the name in the key folder's node.cert).")
@click.option("--trust", envvar="PERDURE_TRUST", show_envvar=True,
              help="Root public keys this node trusts: keys (64 hex digits), roots files or "
                   "key folders, comma-separated (default: the key folder's roots file).")
@click.option("--key-passphrase-file", envvar="PERDURE_KEY_PASSPHRASE_FILE",
              show_envvar=True, type=click.Path(dir_okay=False),
              help="File holding the passphrase of protected private keys (or set "
                   "PERDURE_KEY_PASSPHRASE).")
@click.option("--data-keys", envvar="PERDURE_DATA_KEYS", show_envvar=True,
              help="Key-encryption keys of secrets at rest: a folder, env:NAME or "
                   "keyring:SERVICE/USER (default: data-keys in the key folder).")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
@click.version_option(__version__, "--version", prog_name="perdure",
                      message="%(prog)s %(version)s", help="Print perdure's version and exit.")
@click.pass_context
def cli(ctx: click.Context, store: str | None, app_spec: str | None, key_dir: str | None,
        node_id: str | None, trust: str | None, key_passphrase_file: str | None,
        data_keys: str | None, verbose: int) -> None:
    """perdure: durable agents that survive crashes and resume on any node."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # The PostgreSQL pool logs every failed reconnection; perdure says it once itself.
    logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL if verbose < 2 else logging.DEBUG)
    passphrase = os.environ.get("PERDURE_KEY_PASSPHRASE")
    secret: bytes | None = passphrase.encode() if passphrase else None
    if key_passphrase_file:
        try:
            secret = Path(key_passphrase_file).read_bytes().rstrip(b"\r\n")
        except OSError as exc:
            _fail(f"--key-passphrase-file {key_passphrase_file}: {exc.strerror or exc}")
    ctx.obj = _Ctx(store, app_spec, key_dir, node_id, trust, secret)
    ctx.obj.data_keys = data_keys


@cli.command()
@click.option("--concurrency", default=16, show_default=True, envvar="PERDURE_CONCURRENCY",
              show_envvar=True, help="Objects this node runs at once.")
@click.option("--lease", "lease_seconds", type=float, envvar="PERDURE_LEASE", show_envvar=True,
              help="Lease length in seconds (default: the App's, 30).")
@click.option("--poll", "poll_interval", type=float, envvar="PERDURE_POLL", show_envvar=True,
              help="Idle poll interval in seconds where the store cannot push wake-ups "
                   "(default: the App's, 0.1); with pushes the node waits for them.")
@click.option("--drain", "drain_seconds", type=click.FloatRange(min=0), default=DRAIN_SECONDS,
              show_default=True, envvar="PERDURE_DRAIN", show_envvar=True, metavar="SECONDS",
              help="On Ctrl-C/SIGTERM: stop claiming, and let the steps already running "
                   "finish and be recorded for up to SECONDS before the node lets their "
                   "objects go (a second Ctrl-C lets go at once; an abandoned step runs "
                   "again on the next node). Keep it under your supervisor's kill timeout.")
@click.option("--warn-stalls", "warn_stalls", type=click.FloatRange(min=1), default=None,
              envvar="PERDURE_WARN_STALLS", show_envvar=True, metavar="MS",
              help="Log a WARNING, with the stack, whenever the node's event loop is "
                   "blocked longer than MS milliseconds (finding slow code in agents).")
@click.option("--capability", "capabilities", multiple=True, metavar="NAME",
              help="A capability this node has (repeatable), added to the App's own; objects "
                   "and steps that require one go only to nodes that have it.")
@click.option("--triggers", "with_triggers", is_flag=True,
              help="Run the App's declared triggers too (see `perdure triggers`): their "
                   "consumers stop taking messages at the first Ctrl-C/SIGTERM.")
@click.option("--metrics", "metrics_port", type=click.IntRange(0, 65535), default=None,
              envvar="PERDURE_METRICS", show_envvar=True, metavar="PORT",
              help="Serve Prometheus metrics of this node and of the store on PORT "
                   "(http://HOST:PORT/metrics; needs perdure[prometheus]).")
@click.option("--metrics-host", default="127.0.0.1", show_default=True,
              envvar="PERDURE_METRICS_HOST", show_envvar=True,
              help="Address the metrics server listens on (with --metrics).")
@click.option("--log-json", "log_json", is_flag=True, envvar="PERDURE_LOG_JSON",
              show_envvar=True,
              help="Log one JSON object per line (time, level, logger, message, action, "
                   "object_id, trace_id) instead of text.")
@click.option("--otlp", "otlp_url", default=None, envvar="PERDURE_OTLP", show_envvar=True,
              metavar="URL",
              help="Send OpenTelemetry traces over OTLP/HTTP to URL (a collector's "
                   "http://HOST:4318/v1/traces; needs perdure[otel]).")
@click.option("--ui", "with_ui", is_flag=True,
              help="Serve the dashboard too (see `perdure ui`; 127.0.0.1 by default).")
@click.option("--ui-host", default="127.0.0.1", show_default=True, envvar="PERDURE_UI_HOST",
              help="Address the dashboard listens on (with --ui).")
@click.option("--ui-port", default=8377, show_default=True, type=click.IntRange(1, 65535),
              envvar="PERDURE_UI_PORT",
              help="Port the dashboard listens on (with --ui).")
@click.pass_obj
def worker(obj: _Ctx, concurrency: int, lease_seconds: float | None,
           poll_interval: float | None, capabilities: tuple[str, ...], with_ui: bool = False,
           ui_host: str = "127.0.0.1", ui_port: int = 8377,
           drain_seconds: float = DRAIN_SECONDS, warn_stalls: float | None = None,
           with_triggers: bool = False, metrics_port: int | None = None,
           metrics_host: str = "127.0.0.1", log_json: bool = False,
           otlp_url: str | None = None) -> None:
    """Run a node: claim runnable objects and carry them forward until Ctrl-C/SIGTERM.

    The first Ctrl-C (or SIGTERM) stops claiming, says which objects and steps it waits
    for, and lets running steps finish and be recorded (up to --drain seconds); a second
    one lets the objects go at once."""
    app = obj.app(need_agents=True).with_settings(
        lease_seconds=lease_seconds, poll_interval=poll_interval, capabilities=set(capabilities))
    logging.getLogger("perdure").setLevel(min(logging.getLogger().level, logging.INFO))
    _telemetry(app, metrics_port, metrics_host, log_json, otlp_url)
    serving = ", ".join(f"{a.name}@{a.version}" for a in app.agents.values()) or "no agents"
    caps = f", capabilities {', '.join(sorted(app.capabilities))}" if app.capabilities else ""
    err.print(f"node {app.node_id} serving {serving} from {app.store_url} "
              f"(concurrency {concurrency}{caps})")
    also = []
    if with_triggers:
        declared = declared_triggers(obj)
        also.append(declared.runner(app=app, drain_seconds=drain_seconds))
        err.print(f"with triggers {', '.join(t.name for t in declared) or '(none declared)'}")
    from perdure.telemetry.alerts import Alerts

    loaded = obj.loaded()
    alerts = Alerts.of(loaded) if loaded is not None else None
    if alerts is not None:
        also.append(alerts.bound(app).run)
        err.print(f"with alerts {', '.join(alerts.names)} every {alerts.every:g} s")
    if with_ui:
        start_ui(app, host=ui_host, port=ui_port, background=True,
                 triggers=Triggers.of(obj.loaded() or app))
    abandoned = app.run_worker(concurrency=concurrency, drain_seconds=drain_seconds,
                               warn_stalls=None if warn_stalls is None else warn_stalls / 1000,
                               also=also)
    if abandoned:
        # Steps left running on code threads would hold the process until they end:
        # their objects were let go, so exit now.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _telemetry(app: App, metrics_port: int | None, metrics_host: str, log_json: bool,
               otlp_url: str | None) -> None:
    """Set up what ``worker`` exports: JSON logs, Prometheus metrics, OTLP traces."""
    from perdure import telemetry

    if log_json:
        telemetry.json_logging(app)
    try:
        if otlp_url is not None:
            telemetry.otel_traces(app, otlp_url)
            err.print(f"traces to {otlp_url}")
        if metrics_port is not None:
            metrics = telemetry.prometheus_metrics(app)
            try:
                server = metrics.serve(metrics_port, metrics_host)
            except OSError as exc:
                _fail(f"cannot serve metrics on {metrics_host}:{metrics_port}: "
                      f"{exc.strerror or exc}")
            where = f"[{metrics_host}]" if ":" in metrics_host else metrics_host
            err.print(f"metrics on http://{where}:{server.server_port}/metrics")
    except ConfigurationError as exc:
        _fail(str(exc))


def _moment(text: str, what: str) -> float:
    """Seconds since the epoch from ``text``: a number, or ISO 8601 with a zone."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        _fail(f"{what} is an ISO 8601 time with a zone or seconds since the epoch, not "
              f"{text[:80]!r}")
    if moment.tzinfo is None:
        _fail(f"{what} {text[:80]!r} has no zone; add one (+00:00 or Z)")
    return moment.timestamp()


def _json_arg(text: str | None, what: str) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        _fail(f"{what} is not valid JSON ({exc.msg} at column {exc.colno}): {text[:200]!r}")
    except RecursionError:
        _fail(f"{what} is nested too deeply to be read (perdure keeps values of at most "
              "128 levels)")


def _secret_arg(text: str | None) -> Secret[Any]:
    """A secret payload: its JSON value, or (not JSON) the text itself without its final
    newline; never quoted in an error."""
    if text is None:
        _fail("--secret needs a PAYLOAD: give - and pipe it in (out of the shell's history)")
    try:
        return Secret(json.loads(text))
    except (json.JSONDecodeError, RecursionError):
        return Secret(text.removesuffix("\n").removesuffix("\r"))


@cli.command()
@click.argument("agent")
@click.option("--args", "args_json", default="[]", show_default=True,
              help="Positional arguments as a JSON list (a single JSON value is one argument).")
@click.option("--kwargs", "kwargs_json", default="{}", show_default=True,
              help="Keyword arguments as a JSON object.")
@click.option("--id", "object_id", help="Object id (idempotent: an existing id is reused).")
@click.option("--deadline", type=float, help="Seconds from now before the object is terminated.")
@click.option("--delay", type=click.FloatRange(min=0), metavar="SECONDS",
              help="Create the object now but run it no sooner than SECONDS from now.")
@click.option("--at", "at_text", metavar="WHEN",
              help="Create the object now but run it no sooner than WHEN (ISO 8601 with a "
                   "zone, e.g. 2025-01-31T02:30:00+01:00, or seconds since the epoch).")
@click.pass_obj
def start(obj: _Ctx, agent: str, args_json: str, kwargs_json: str, object_id: str | None,
          deadline: float | None, delay: float | None = None,
          at_text: str | None = None) -> None:
    """Start an object running AGENT (now, or later with --delay or --at)."""
    if delay is not None and at_text is not None:
        _fail("give --delay or --at, not both")
    start_at = None if at_text is None else _moment(at_text, "--at")
    args = _json_arg(args_json, "--args")
    if not isinstance(args, list):
        args = [args]
    kwargs = _json_arg(kwargs_json, "--kwargs")
    if not isinstance(kwargs, dict):
        _fail("--kwargs must be a JSON object")
    app = obj.app(need_agents=True)
    handle = app.options(object_id=object_id, deadline=deadline, delay=delay,
                         start_at=start_at).start(agent, *args, **kwargs)
    created = handle.created
    differs = handle.differs
    if differs:
        err.print(Text(f"warning: {differs}"))
    elif not created:
        err.print(Text(f"note: object {handle.object_id} already exists "
                       f"({handle.info().status}); this is that object"))
    out.print(Text(handle.object_id))


@cli.command(name="ls")
@click.option("--status", help="Only objects with this status (ready, running, dormant, ...).")
@click.option("--phase", help="Only objects in this lifecycle phase.")
@click.option("--agent", help="Only objects of this agent.")
@click.option("--limit", default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of objects instead.")
@click.pass_obj
def ls_(obj: _Ctx, status: str | None, phase: str | None, agent: str | None, limit: int,
        as_json: bool) -> None:
    """List objects, newest first; a failed object's note says why it failed."""
    app = obj.app()
    infos = [_explained(app, info)
             for info in app.list(status=status, phase=phase, agent=agent, limit=limit)]
    if as_json:
        _print_json([_info_json(info) for info in infos])
        return
    for line in _ls_lines(infos, out.width):
        out.print(line)


@cli.command()
@click.argument("object_id")
@click.option("--json", "as_json", is_flag=True,
              help="Print the object, its records and its children as one JSON document.")
@click.pass_obj
def show(obj: _Ctx, object_id: str, as_json: bool) -> None:
    """Show an object and its memory timeline."""
    app = obj.app()
    info = app.get(object_id)
    if as_json:
        records = app.history(object_id)
        children = app.list(parent=object_id, limit=1000)
        document = {"object": _info_json(info),
                    "records": [_record_json(rec) for rec in records],
                    "children": [_info_json(child) for child in reversed(children)]}
        totals = usage_totals(records)
        if totals.calls or totals.failed_attempts:  # it made model calls
            document["usage"] = totals.to_json()
        _print_json(document)
        return
    width = out.width
    head = [Text(text, style=style) for text, style in view.headline(info)]
    for head_line in _flow(head, width):
        out.print(head_line)
    if info.note:
        for index, line in enumerate(_wrap(info.note, width - 6)):
            out.print(Text(("note: " if index == 0 else "      ") + line))
    if info.forked_from:
        out.print(Text(view.origin(info) or ""))
    asks = view.waiting_for(info)
    if asks:
        out.print(Text(asks))
    table = Table(box=None, pad_edge=False)
    records = app.history(object_id)
    rows = view.timeline(records)
    widths = [max([len(col), *(len(str(row[i])) for row in rows)])
              for i, col in enumerate(("seq", "time", "node", "kind"))]
    for col, width_ in zip(("seq", "time", "node", "kind"), widths, strict=True):
        table.add_column(col, no_wrap=True, min_width=width_)
    table.add_column("what", overflow="fold")
    room = max(20, width - sum(widths) - 2 * len(widths) - 1)  # one line per record
    for seq, time_, node, kind, what, whole in rows:
        if not whole and len(what) > room:
            what = what[: room - 1] + "…"
        table.add_row(*(Text(cell) for cell in (seq, time_, node, kind, what)))  # not markup
    out.print(table)
    if slots := slot_lines(app.store.checkpoints(object_id)):
        out.print(Text("checkpoint slots (outside the chain, latest only):\n" + "\n".join(slots)))
    ledger = view.usage(usage_totals(records))
    if ledger:
        out.print(Text(ledger))
    children = app.list(parent=object_id, limit=1000)
    if children:
        out.print(f"children ({len(children)}):")
        for child in reversed(children):
            out.print(_object_line(child, "  "))


@cli.command()
@click.argument("object_id")
@click.pass_obj
def tree(obj: _Ctx, object_id: str) -> None:
    """Print an object's lineage: its descendants with each one's status and phase."""
    app = obj.app()
    root = app.get(object_id)
    lines = view.lineage(root, lambda parent: list(reversed(app.list(parent=parent,
                                                                      limit=10_000))))
    for line in lines:
        out.print(_object_line(line.info, line.prefix))


@cli.command(name="replay-check")
@click.argument("object_ids", nargs=-1)
@click.option("--history", "histories", multiple=True, metavar="PATH",
              help="Replay a history file (perdure export-history, perdure.testing) "
                   "instead of live memory; a folder means its *.json files. Repeatable; "
                   "no store is opened.")
@click.pass_obj
def replay_check(obj: _Ctx, object_ids: tuple[str, ...], histories: tuple[str, ...]) -> None:
    """Replay live objects' memory against the current code (--app) without running steps.

    Reports which objects would diverge after a deploy, and where (recorded vs found);
    exit 1 if any would. Checks the named objects, or every object not yet terminated.
    With --history, checks history files instead (say, those checked into your
    repository), with no store: a file that does not verify counts as a failure too.
    """
    if histories:
        if object_ids:
            _fail("replay-check takes object ids or --history files, not both")
        _replay_histories(obj, histories)
        return
    app = obj.app(need_agents=True)
    reports = app.replay_check(list(object_ids) or None)
    bad = 0
    for report in reports:
        bad += _report_line(report)
    out.print(f"{len(reports)} checked, {bad} would diverge")
    if bad:
        sys.exit(1)


def _report_line(report: ReplayReport, where: str = "") -> int:
    """Print one replay report; 1 if it fails, else 0."""
    style = {"compatible": "green", "not-served": "yellow"}.get(report.verdict, "red")
    out.print(Text.assemble((f"{report.verdict:<11}", style),
                            f" {where}{report.object_id} ({report.agent}@{report.version}): "
                            f"{report.detail}"))
    return 0 if report.ok else 1


def _replay_histories(obj: _Ctx, histories: Sequence[str]) -> None:
    app = obj.loaded()
    if app is None:
        _fail("replay-check --history needs your agents: pass --app module:app or set "
              "PERDURE_APP")
    replayer = Replayer(app)
    files = history_files(histories)
    if not files:
        _fail(f"no history files in {', '.join(histories)}")
    bad = 0
    for path in files:
        try:
            report = replayer.replay(path, raise_on_failure=False)
        except PerdureError as exc:  # unreadable, not a history, or tampered with
            out.print(Text.assemble(("unreadable ", "red"), f" {path}: {exc}"))
            bad += 1
            continue
        bad += _report_line(report, f"{path}: ")
    out.print(f"{len(files)} checked, {bad} failed")
    if bad:
        sys.exit(1)


@cli.command(name="export-history")
@click.argument("object_ids", nargs=-1, required=True)
@click.option("--out", "out_path", required=True, metavar="PATH",
              help="A folder (one ID.json per object), or a .json file for one object.")
@click.pass_obj
def export_history(obj: _Ctx, object_ids: tuple[str, ...], out_path: str) -> None:
    """Write objects' memory as history files to check into a repository and replay with
    `replay-check --history` (or perdure.testing.Replayer) without a store.

    The memory must verify first; records keep their hashes and signatures, so a
    changed file is found when it is read.
    """
    app = obj.app()
    target = Path(out_path)
    single = target.suffix == ".json"
    if single and len(object_ids) > 1:
        _fail(f"--out {out_path} is one file; give a folder for {len(object_ids)} objects")
    for object_id in object_ids:
        path = target if single else target / f"{object_id}.json"
        try:
            written = History.of(app, object_id).write(path)
        except OSError as exc:
            _fail(f"cannot write {path}: {exc.strerror or exc}")
        out.print(f"{object_id}: {written}")


@cli.command()
@click.argument("object_id")
@click.argument("event")
@click.argument("payload", required=False)
@click.option("--dedupe-key", help="Deliver at most once per key.")
@click.option("--secret", is_flag=True,
              help="Send the payload as a perdure.Secret (encrypted at rest); PAYLOAD - reads "
                   "it from stdin, out of the shell's history.")
@click.pass_obj
def send(obj: _Ctx, object_id: str, event: str, payload: str | None,
         dedupe_key: str | None, secret: bool) -> None:
    """Send EVENT (with a JSON PAYLOAD, - for stdin) to an object."""
    if payload == "-":
        payload = sys.stdin.read()
    value = _json_arg(payload, "PAYLOAD") if not secret else _secret_arg(payload)
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
@click.option("--anchors", "anchors_file", type=click.Path(dir_okay=False),
              help="Heads exported earlier with `perdure export-heads`: each object's "
                   "memory must still reach its head there (catches a store rolled back).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of reports instead.")
@click.pass_obj
def verify(obj: _Ctx, object_ids: tuple[str, ...], all_: bool, anchors_file: str | None,
           as_json: bool) -> None:
    """Verify hash chain and signatures; exit 1 naming the first bad record.

    Every signature must verify under a key certified by a root this node trusts. Every
    object is checked and reported, also after one that fails; a store that cannot be
    read at all stops the command with one error line.
    """
    app = obj.app()
    ids = list(object_ids)
    anchors = _read_anchors(anchors_file) if anchors_file else None
    if all_:
        ids += [info.object_id for info in app.list(limit=1_000_000)]
    if anchors is not None and not ids:
        ids = list(anchors)
    if not ids:
        _fail("name an object id, or pass --all")
    reports = []
    for object_id in ids:
        report = _verify_one(app, object_id, anchors)
        reports.append(report)
        if as_json:
            continue
        if report.ok:
            out.print(Text.assemble(("ok", "green"), f"   {report}"))
        elif report.untrusted:
            out.print(Text.assemble(("FAIL", "red"), (
                f" {report.object_id}: record #{report.bad_seq} is signed by a key that no "
                f"root in {app.identity.folder.path} certifies ({report.reason}); pass "
                "--key-dir FOLDER (PERDURE_KEY_DIR) naming the key folder its workers use, "
                "or trust their root with `perdure keys trust ROOT_PUBLIC_KEY`")))
        elif report.bad_seq is None:
            out.print(Text.assemble(("FAIL", "red"), f" {report.object_id}: {report.reason}"))
        else:
            out.print(Text.assemble(("FAIL", "red"), f" {report}"))
    if as_json:
        _print_json([_report_json(report) for report in reports])
    if not all(report.ok for report in reports):
        sys.exit(1)


def _read_anchors(path: str) -> dict[str, tuple[int, str]]:
    """``export-heads`` output: one JSON object per line, ``{object_id, seq, hash}``."""
    anchors: dict[str, tuple[int, str]] = {}
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        _fail(f"--anchors {path}: {exc.strerror or exc}")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            anchors[str(item["object_id"])] = (int(item["seq"]), str(item["hash"]))
        except (ValueError, KeyError, TypeError):
            _fail(f"--anchors {path}, line {number}: not a head written by "
                  "`perdure export-heads`")
    return anchors


def _verify_one(app: App, object_id: str,
                anchors: dict[str, tuple[int, str]] | None = None) -> VerifyReport:
    """``App.verify``, with an object whose memory cannot even be read reported as failed."""
    try:
        return app.verify(object_id, anchors=anchors)
    except (StoreError, ConfigurationError):
        raise  # the store or this node's settings: not one object's fault
    except RecordDecodeError as exc:
        return VerifyReport(object_id, False, 0, exc.seq, exc.reason)
    except PerdureError as exc:
        return VerifyReport(object_id, False, 0, getattr(exc, "seq", None), str(exc))


@cli.command(name="export-heads")
@click.argument("object_ids", nargs=-1)
@click.option("--out", type=click.Path(dir_okay=False),
              help="Write the heads here (default: standard output).")
@click.pass_obj
def export_heads(obj: _Ctx, object_ids: tuple[str, ...], out: str | None) -> None:
    """Export the head of every object that verifies now (or of OBJECT_IDS), one JSON per
    line, to keep outside the store; `perdure verify --anchors FILE` checks against it."""
    heads = obj.app().export_heads(list(object_ids) or None)
    text = "".join(json.dumps(head, sort_keys=True) + "\n" for head in heads)
    if out:
        Path(out).write_text(text)
        err.print(f"{len(heads)} head(s) written to {out}")
    else:
        sys.stdout.write(text)


@cli.command(name="forget-heads")
@click.argument("object_ids", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="Forget every head this node saw.")
@click.pass_obj
def forget_heads(obj: _Ctx, object_ids: tuple[str, ...], all_: bool) -> None:
    """Forget the heads this node saw (after restoring a store from a backup on purpose):
    its workers then accept the store's shorter memory of OBJECT_IDS (or of all)."""
    if not object_ids and not all_:
        _fail("name object ids, or pass --all")
    anchors = obj.identity().anchors()
    count = anchors.forget(None if all_ else list(object_ids))
    anchors.close()
    out.print(f"forgot {count} head(s) in {obj.key_folder().heads_path}")


keys.add_command(data_key)
cli.add_command(keys)
cli.add_command(tail)
cli.add_command(queues)
cli.add_command(quotas)
for _steer in (questions, query, fork, retry):
    cli.add_command(_steer)
cli.add_command(ls_, name="list")  # the same listing under its long name
cli.add_command(ui)
cli.add_command(api)
cli.add_command(api_token)
cli.add_command(schedules)
cli.add_command(triggers)
for _command in (approvals, approve, reject):
    cli.add_command(_command)


@cli.command()
@click.argument("object_id")
@click.option("--wait", type=float, default=0.0, help="Seconds to wait for the result.")
@click.option("--json", "as_json", is_flag=True,
              help='Print {"object_id", "status", "result"} (or "error") as JSON.')
@click.pass_obj
def result(obj: _Ctx, object_id: str, wait: float, as_json: bool) -> None:
    """Print an object's result as JSON (waiting up to --wait seconds)."""
    app = obj.app()
    if not as_json:
        out.print_json(json.dumps(sealed_shown(app.handle(object_id).result(timeout=wait)),
                                  default=str))
        return
    try:
        value = sealed_shown(app.handle(object_id).result(timeout=wait))
    except StoreError:
        raise
    except PerdureError as exc:
        try:
            status: str | None = str(app.get(object_id).status)
        except PerdureError:
            status = None  # no such object, or the store went away meanwhile
        if isinstance(exc, AgentFailedError):
            error = {"type": exc.error_type, "message": exc.message}
        else:
            error = {"type": type(exc).__name__, "message": str(exc)}
        _print_json({"object_id": object_id, "status": status, "error": error})
        _fail(str(exc))
    _print_json({"object_id": object_id, "status": "completed", "result": value})


@cli.command()
@click.option("--dir", "folder", default=None,
              help="Folder for the demo's store, keys and input files "
                   "(default demo-data, or demo-llm with --llm).")
@click.option("--fresh", is_flag=True,
              help="Delete the demo folder first (only a folder an earlier demo made).")
@click.option("--llm", is_flag=True,
              help="The model-call demo: a stream killed mid-way and continued from its "
                   "salvaged text (offline, or OPENAI_BASE_URL/OPENAI_API_KEY when set).")
@click.option("--agent", "agent_demo", is_flag=True,
              help="The tool-call demo: an agent that runs low-risk tools itself and asks "
                   "a person (perdure approve) before risky ones, its worker killed while "
                   "it waits.")
@click.option("--model", default=None,
              help="With --llm or --agent: the model to ask (default OPENAI_MODEL, else "
                   "gpt-4o-mini).")
def demo(folder: str | None, fresh: bool, llm: bool, model: str | None,
         agent_demo: bool) -> None:
    """Run the crash-and-resume demo end to end on an embedded SQLite store."""
    if agent_demo:
        from perdure.demo.tool_story import run_agent_demo

        sys.exit(run_agent_demo(folder or "demo-agent", fresh=fresh, model=model,
                                console=out))
    if llm:
        from perdure.demo.llm_story import LLM_DEFAULT_DIR, run_llm_demo

        sys.exit(run_llm_demo(folder or LLM_DEFAULT_DIR, fresh=fresh, model=model,
                              console=out))
    if model is not None:
        _fail("--model goes with --llm")
    from perdure.demo import run_demo

    sys.exit(run_demo(folder or "demo-data", fresh=fresh, console=out))


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
    except ImportError as exc:  # a package of an extra that is not installed
        _fail(_import_hint(exc))
    except OSError as exc:  # a file or folder the command was given or needs
        _fail(_os_error_text(exc))


_EXTRAS = {"openai": "llm", "anthropic": "llm", "bpe_openai": "llm", "psycopg": "postgres",
           "psycopg_pool": "postgres", "starlette": "ui", "uvicorn": "ui", "mcp": "mcp",
           "keyring": "keyring", "httpx": "resources", "pydantic_ai": "pydantic-ai",
           "aio_pika": "rabbitmq", "aiormq": "rabbitmq", "nats": "nats"}


def _import_hint(exc: ImportError) -> str:
    """What is missing, and the install that brings it, for an import that failed."""
    top = (exc.name or "").partition(".")[0]
    if top in _EXTRAS:
        return (f"this needs the {top!r} package, which is not installed: "
                f"pip install 'perdure[{_EXTRAS[top]}]'")
    return f"cannot import {exc.name or 'a module'}: {exc}"


def _os_error_text(exc: OSError) -> str:
    """An operating-system error as one line: what failed, on which file."""
    what = exc.strerror or type(exc).__name__
    files = [str(name) for name in (exc.filename, exc.filename2) if name is not None]
    return f"{what}: {' -> '.join(files)}" if files else f"{what}: {exc}"
