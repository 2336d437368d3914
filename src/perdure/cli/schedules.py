"""``perdure schedules``: list schedules and steer them by name.

- ``perdure schedules [--json]``: every schedule, with its state, when it fires, its next
  and last fire and how many runs it started (``App.schedules``).
- ``perdure schedules create NAME AGENT (--cron EXPR [--tz ZONE] | --every SECONDS)
  [--overlap P] [--catch-up-window S] [--jitter S] [--args JSON] [--kwargs JSON]``.
- ``perdure schedules pause|resume|trigger|delete NAME``.
- ``perdure schedules backfill NAME --from WHEN --to WHEN``: WHEN is an ISO 8601 time
  with a zone (``2025-01-01T00:00:00+01:00``) or seconds since the epoch.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import click

from perdure.core.schedules import OVERLAPS, ScheduleInfo

__all__ = ["schedules"]


def _when(instant: float | None) -> str:
    if instant is None:
        return "-"
    return datetime.fromtimestamp(instant, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _moment(text: str, option: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise click.UsageError(f"{option} is an ISO 8601 time with a zone or seconds since "
                               f"the epoch, not {text!r}") from None
    if moment.tzinfo is None:
        raise click.UsageError(f"{option} {text!r} has no zone; add one (+00:00, Z)")
    return moment.timestamp()


def _json(text: str, option: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.UsageError(f"{option} is not valid JSON ({exc.msg} at column "
                               f"{exc.colno}): {text[:200]!r}") from None


def _line(info: ScheduleInfo) -> str:
    return (f"{info.name}  {info.state}  {info.spec.every}  {info.spec.agent}  "
            f"next {_when(info.next_fire)}  last {_when(info.last_fire)}  "
            f"runs {info.started}  skipped {info.skipped}  dropped {info.dropped}")


@click.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of schedules.")
@click.pass_context
def schedules(ctx: click.Context, as_json: bool) -> None:
    """List schedules (name, state, when, agent, next and last fire, runs started), or
    steer one with a subcommand."""
    if ctx.invoked_subcommand is not None:
        return
    found = ctx.obj.app().schedules()
    if as_json:
        click.echo(json.dumps([s.to_json() for s in found], indent=2, ensure_ascii=False))
        return
    if not found:
        click.echo("no schedules")
    for info in found:
        click.echo(_line(info))


@schedules.command()
@click.argument("name")
@click.argument("agent")
@click.option("--cron", help="Five cron fields, e.g. '0 * * * *', or @daily, @hourly, ...")
@click.option("--tz", "timezone", help="IANA time zone the cron is read in (default UTC).")
@click.option("--every", "interval", type=int, help="Fire every SECONDS seconds instead.")
@click.option("--overlap", type=click.Choice(OVERLAPS), default="skip", show_default=True,
              help="What a fire does while the previous run is live.")
@click.option("--catch-up-window", type=float,
              help="Seconds: after downtime, run the fires missed by less than this "
                   "(default: only the most recent missed fire).")
@click.option("--jitter", type=float, default=0.0, help="Delay each run by up to SECONDS.")
@click.option("--args", "args_json", default="[]", show_default=True,
              help="The agent's positional arguments as a JSON list.")
@click.option("--kwargs", "kwargs_json", default="{}", show_default=True,
              help="The agent's keyword arguments as a JSON object.")
@click.pass_obj
def create(obj: Any, name: str, agent: str, cron: str | None, timezone: str | None,
           interval: int | None, overlap: str, catch_up_window: float | None, jitter: float,
           args_json: str, kwargs_json: str) -> None:
    """Create schedule NAME starting AGENT (idempotent on NAME)."""
    args = _json(args_json, "--args")
    kwargs = _json(kwargs_json, "--kwargs")
    if not isinstance(args, list):
        args = [args]
    if not isinstance(kwargs, dict):
        raise click.UsageError("--kwargs must be a JSON object")
    app = obj.app(need_agents=True)
    handle = app.schedule(name, agent, *args, cron=cron, timezone=timezone,
                          interval=interval, overlap=overlap,
                          catch_up_window=catch_up_window, jitter=jitter, **kwargs)
    if handle.differs:
        click.echo(f"warning: {handle.differs}", err=True)
    elif not handle.created:
        click.echo(f"note: schedule {name} exists already; this is that schedule", err=True)
    click.echo(_line(handle.info()))


def _steer(op: str, summary: str) -> click.Command:
    @click.command(name=op, help=summary)
    @click.argument("name")
    @click.pass_obj
    def command(obj: Any, name: str) -> None:
        getattr(obj.app().schedule_handle(name), op)()
        click.echo(f"{op} sent to schedule {name}")

    return command


for _op, _summary in (("pause", "Stop NAME firing (missed fires are dropped)."),
                      ("resume", "Let NAME fire again from now on."),
                      ("trigger", "Start a run of NAME now."),
                      ("delete", "End NAME: it starts nothing more; its runs go on.")):
    schedules.add_command(_steer(_op, _summary))


@schedules.command()
@click.argument("name")
@click.option("--from", "start", required=True, help="First instant (ISO 8601 with a zone).")
@click.option("--to", "end", required=True, help="End, excluded (ISO 8601 with a zone).")
@click.pass_obj
def backfill(obj: Any, name: str, start: str, end: str) -> None:
    """Start NAME's runs for the fires in [--from, --to), by its overlap policy."""
    count = obj.app().schedule_handle(name).backfill(_moment(start, "--from"),
                                                     _moment(end, "--to"))
    click.echo(f"backfill of {count} fire(s) sent to schedule {name}")
