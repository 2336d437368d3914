"""``perdure triggers`` (list the App's declared triggers) and ``perdure triggers run
[NAMES]`` (consume in the foreground until SIGTERM, draining); ``perdure worker
--triggers`` runs them beside a worker (``declared_triggers``). See
``perdure.triggers``."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

import click

from perdure.app import App
from perdure.triggers import DRAIN_SECONDS, Triggers

__all__ = ["declared_triggers", "triggers"]


def declared_triggers(obj: Any) -> Triggers:
    """The triggers the ``--app`` App declared (``Triggers.of``); one CLI line without
    ``--app``."""
    base = obj.loaded()
    if not isinstance(base, App):
        click.echo("error: triggers are declared by your App: pass --app module:app or set "
                   "PERDURE_APP", err=True)
        sys.exit(1)
    return Triggers.of(base)


def _listing(found: Triggers) -> list[str]:
    lines = []
    for trigger in found:
        doc = trigger.describe()
        what = (f"starts {doc['agent'] or '(the agent each message names)'}"
                if doc["mode"] == "start"
                else f"sends {doc['event']!r} to the object in {doc['object']}")
        lines.append(f"{doc['name']}  {doc['kind']}  {doc['source']}  {what}")
    return lines


@click.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@click.pass_context
def triggers(ctx: click.Context, as_json: bool) -> None:
    """List the triggers your App declares (``perdure triggers run`` runs them)."""
    if ctx.invoked_subcommand is None:
        _show(ctx.obj, as_json)


@triggers.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@click.pass_obj
def list_(obj: Any, as_json: bool) -> None:
    """List the triggers your App declares (as ``perdure triggers`` does)."""
    _show(obj, as_json)


def _show(obj: Any, as_json: bool) -> None:
    found = declared_triggers(obj)
    if as_json:
        click.echo(json.dumps([t.describe() for t in found], indent=2, ensure_ascii=False))
        return
    if not len(found):
        click.echo("no trigger is declared (perdure.triggers.Triggers.of(app).rabbitmq(...), "
                   ".nats(...), .folder(...))")
        return
    for line in _listing(found):
        click.echo(line)


@triggers.command(name="run")
@click.argument("names", nargs=-1)
@click.option("--drain", "drain_seconds", type=click.FloatRange(min=0), default=DRAIN_SECONDS,
              show_default=True, metavar="SECONDS",
              help="On Ctrl-C/SIGTERM: take no more messages and let those in hand be "
                   "committed and acknowledged for up to SECONDS (what is not acknowledged "
                   "is delivered again).")
@click.pass_obj
def run(obj: Any, names: Sequence[str], drain_seconds: float) -> None:
    """Consume with the triggers named (all by default) until Ctrl-C/SIGTERM."""
    found = declared_triggers(obj)
    chosen = found.select(names)  # an unknown name is one line before anything connects
    app = obj.app(need_agents=True)
    logging.getLogger("perdure").setLevel(min(logging.getLogger().level, logging.INFO))
    shown = ", ".join(t.name for t in chosen) or "no trigger"
    click.echo(f"triggers {shown} for {app.store_url} (node {app.node_id})", err=True)
    found.run_forever(app=app, names=[t.name for t in chosen], drain_seconds=drain_seconds)
