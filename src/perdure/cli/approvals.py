"""``perdure approvals``, ``perdure approve ID PROPOSAL [--edit JSON]`` and
``perdure reject ID PROPOSAL --reason TEXT``: people deciding on tool calls.

``approvals`` lists the tool calls waiting for a person across objects, with their
arguments shown readably; ``approve`` and ``reject`` send a decision sealed with this
client's key (its node id is the identity memory records). See ``perdure.approvals``.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import Any

import click

from perdure.core.approvals import PendingApproval, shown
from perdure.errors import ConfigurationError

__all__ = ["approvals", "approve", "reject"]


def _when(ts: float | None) -> str:
    return "never" if ts is None else datetime.fromtimestamp(ts).isoformat(" ", "seconds")


def _lines(item: PendingApproval) -> list[str]:
    who = ", ".join(item.approvers) or "any trusted identity"
    args = shown(item.arguments).replace("\n", "\n    ")
    return [f"{item.object_id}  proposal {item.proposal_id}  {item.tool}  risk {item.risk}",
            f"  why: {item.reason}  (policy {item.policy})",
            f"  who may approve: {who}",
            f"  asked {_when(item.requested_at)}, expires {_when(item.expires_at)}"
            + (" (passed: counts as rejected, no decision is taken)"
               if item.expires_at is not None and time.time() > item.expires_at else ""),
            f"  args {item.args_hash[:16]}: {args}"]


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@click.pass_obj
def approvals(obj: Any, as_json: bool) -> None:
    """List the tool calls waiting for a person, across objects."""
    found = obj.app().approvals()
    if as_json:
        click.echo(json.dumps([p.to_json() for p in found], indent=2, ensure_ascii=False))
        return
    if not found:
        click.echo("no tool call waits for approval")
        return
    for item in found:
        click.echo("\n".join(_lines(item)))


@click.command()
@click.argument("object_id")
@click.argument("proposal")
@click.option("--edit", "edit", metavar="JSON",
              help="Approve with these arguments instead (a JSON object; same tool). The "
                   "edit goes through the policy again.")
@click.pass_obj
def approve(obj: Any, object_id: str, proposal: str, edit: str | None) -> None:
    """Approve PROPOSAL of OBJECT_ID (signed with this client's key)."""
    new_args = None
    if edit is not None:
        try:
            new_args = json.loads(edit)
        except json.JSONDecodeError as exc:
            raise ConfigurationError(f"--edit is not valid JSON ({exc.msg}); give the new "
                                     "arguments as a JSON object") from None
        if not isinstance(new_args, dict):
            raise ConfigurationError("--edit must be a JSON object of the tool's arguments")
    item = obj.app().approve(object_id, proposal, edit=new_args)
    done = "approved with an edit" if new_args is not None else "approved"
    click.echo(f"{object_id}: proposal {proposal} ({item.tool}) {done}")


@click.command()
@click.argument("object_id")
@click.argument("proposal")
@click.option("--reason", required=True, help="Why (the model is told).")
@click.pass_obj
def reject(obj: Any, object_id: str, proposal: str, reason: str) -> None:
    """Reject PROPOSAL of OBJECT_ID; the model is told REASON."""
    item = obj.app().reject(object_id, proposal, reason=reason)
    click.echo(f"{object_id}: proposal {proposal} ({item.tool}) rejected")
