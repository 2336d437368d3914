"""Watch and steer running agents from the command line: questions, queries, fork, retry.

- ``perdure questions [--agent NAME] [--limit N] [--json]``: what waiting objects ask
  (``App.questions``), newest first, with the event that answers each
  (``perdure send ID EVENT JSON`` answers), and how many tool calls wait for approval and
  objects are parked (what else waits for a person; see ``perdure.core.questions``).
- ``perdure query ID NAME [ARG_JSON ...] [--app module:app]``: a query declared in the
  agent's code, over the object's checked memory; prints the answer as JSON.
- ``perdure fork ID --at SEQ [--id NEW]``: a new object from the object's memory up to
  record SEQ (``App.fork``); prints the new id.
- ``perdure retry ID``: retry a parked object (``App.retry``).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from perdure import describe as view
from perdure.core.sealing import sealed_shown
from perdure.core.secret import Secret

__all__ = ["fork", "query", "questions", "retry"]


def _json_args(texts: tuple[str, ...]) -> list[Any]:
    values = []
    for at, text in enumerate(texts, 1):
        try:
            values.append(json.loads(text))
        except json.JSONDecodeError as exc:
            raise click.UsageError(
                f"argument {at} is not valid JSON ({exc.msg} at column {exc.colno}): "
                f"{text[:200]!r}; quote a string as '\"text\"'") from None
        except RecursionError:
            raise click.UsageError(f"argument {at} is nested too deeply to be read") from None
    return values


@click.command()
@click.option("--agent", default=None, help="Only questions of this agent's objects.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(min=0))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of questions.")
@click.pass_obj
def questions(obj: Any, agent: str | None, limit: int, as_json: bool) -> None:
    """List what waiting objects ask, newest first, and the event that answers each."""
    app = obj.app()
    found = app.questions(agent=agent, limit=limit)
    if as_json:
        click.echo(json.dumps([q.to_json() for q in found], indent=2, ensure_ascii=False))
        return
    if not found:
        click.echo("no object is asking anything")
    for q in found:
        asks = (f"asks {view.question(q.prompt, q.choices)}"
                if q.prompt is not None or q.choices is not None
                else f"waits for event {q.event!r}")
        click.echo(f"{q.object_id}  {q.agent}  {view.when(q.asked_at)}  {asks}  (answer: "
                   f"perdure send {q.object_id} {q.event} JSON)")
    if agent is None:  # what else waits for a person (the dashboard's inbox lists it too)
        approvals = len(app.approvals())
        parked = len(app.list(status="parked", limit=1000))
        if approvals:
            click.echo(f"also {approvals} tool call(s) wait for approval: perdure approvals")
        if parked:
            click.echo(f"also {parked} parked object(s) wait for a retry: perdure ls "
                       "--status parked")


def _shown_secret(value: Any) -> Any:
    """A ``Secret`` in a query's answer as the CLI shows it (never its value)."""
    if isinstance(value, Secret):
        return repr(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


@click.command()
@click.argument("object_id")
@click.argument("name")
@click.argument("args", nargs=-1)
@click.pass_obj
def query(obj: Any, object_id: str, name: str, args: tuple[str, ...]) -> None:
    """Answer query NAME over an object's memory (each ARG a JSON value); needs --app.

    The object is not woken and nothing is written.
    """
    values = _json_args(args)
    app = obj.app(need_agents=True)
    answer = sealed_shown(app.query(object_id, name, *values))
    try:
        text = json.dumps(answer, indent=2, ensure_ascii=False, allow_nan=False,
                          default=_shown_secret)
    except (TypeError, ValueError):
        text = json.dumps(repr(answer), ensure_ascii=False)
    click.echo(text)


@click.command()
@click.argument("object_id")
@click.option("--at", "at", type=int, required=True, metavar="SEQ",
              help="The last record of the original the fork keeps (see `perdure show`).")
@click.option("--id", "new_id", default=None, help="The fork's id (default: generated).")
@click.pass_obj
def fork(obj: Any, object_id: str, at: int, new_id: str | None) -> None:
    """Fork an object: a new object whose memory is the original's up to record SEQ.

    It runs from there on the workers with their current code; the original is untouched.
    """
    handle = obj.app().fork(object_id, at=at, new_id=new_id)
    if not handle.created:
        click.echo(f"note: {handle.object_id} is the fork made before", err=True)
    click.echo(handle.object_id)
    sys.stdout.flush()


@click.command()
@click.argument("object_id")
@click.pass_obj
def retry(obj: Any, object_id: str) -> None:
    """Retry a parked object after fixing what parked it (its code, a capability)."""
    info = obj.app().retry(object_id)
    click.echo(f"{object_id}: retry requested; now {info.status}")
