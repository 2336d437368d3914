"""``perdure tail ID [--follow] [--json]``: an object's memory as it is written.

A streamed model call's batches are printed as the text they hold, as they arrive;
every other record as its one-line description (``perdure.describe.describe``), so a
recovery after a crash shows where it happened. With ``--follow`` it goes on until the
object ends; ``--json`` prints one JSON object per record (JSON Lines).
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

import click

from perdure import describe as view
from perdure.follow import StreamEvent, follow
from perdure.resources.lines import shown_body

__all__ = ["event_json", "event_line", "tail"]

_CHUNKS = "model_chunks"
_EMITTED = "emitted"


def event_json(event: StreamEvent) -> dict[str, Any]:
    """``event`` as one JSON object: seq, kind, and for a model record its call's
    position, name and attempt, a batch's text, a recovery; an emitted event its position,
    name and data; every record but a batch its body."""
    doc: dict[str, Any] = {"seq": event.seq, "kind": event.kind, "ts": event.record.ts}
    if event.kind == _EMITTED:
        doc.update(pos=event.pos, name=event.name, data=event.data)
    elif event.name is not None:
        doc.update(pos=event.pos, name=event.name, attempt=event.attempt)
    if event.kind == _CHUNKS:
        doc["text"] = event.text
    elif event.recovery is not None:
        doc["recovery"] = event.recovery
        doc["body"] = event.record.body
    else:
        doc["body"] = shown_body(event.kind, event.record.body)  # (resource secrets masked)
    return doc


def event_line(event: StreamEvent) -> str:
    """A record that is not a batch of text, in one line: seq, kind and what it says."""
    what, _ = view.describe(event.record)
    return f"[{event.seq} {event.kind}] {what}"


class _Printer:
    """Writes events to stdout: batches as bare text, other records as lines."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.mid_text = False  # the last thing written was stream text with no newline

    def write(self, event: StreamEvent) -> None:
        """Write ``event`` and flush, so a follower's reader sees it at once."""
        if self.as_json:
            sys.stdout.write(json.dumps(event_json(event), ensure_ascii=False,
                                        default=str) + "\n")
        elif event.kind == _CHUNKS and event.text:  # a batch of tool call pieces: a line
            sys.stdout.write(event.text)
            self.mid_text = True
        else:
            if self.mid_text:
                sys.stdout.write("\n")
                self.mid_text = False
            sys.stdout.write(event_line(event) + "\n")
        sys.stdout.flush()

    def close(self) -> None:
        """End an unfinished line of text."""
        if self.mid_text:
            sys.stdout.write("\n")
            sys.stdout.flush()


@click.command()
@click.argument("object_id")
@click.option("--follow", "-f", "follow_", is_flag=True,
              help="Keep printing records as they are written, until the object ends.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object per record (JSON Lines).")
@click.option("--after", type=int, default=0, show_default=True, metavar="SEQ",
              help="Start after this record (a follower that reconnects).")
@click.option("--timeout", type=float, default=None,
              help="With --follow: give up after this many seconds (exit 1).")
@click.pass_obj
def tail(obj: Any, object_id: str, follow_: bool, as_json: bool, after: int,
         timeout: float | None) -> None:
    """Print an object's memory: model stream text as it arrives, other records as lines."""
    app = obj.app()
    stop = None if follow_ else threading.Event()
    if stop is not None:
        stop.set()  # one read of what memory holds now
    printer = _Printer(as_json)
    try:
        for event in follow(app, object_id, after, every=True, timeout=timeout, stop=stop):
            printer.write(event)
    finally:
        printer.close()
