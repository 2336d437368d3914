"""What waiting agents ask: the waits of ``run.wait_for(event, prompt=..., choices=...)``.

What waits for a person, everywhere perdure says it (``App.questions``,
``App.approvals``, ``perdure questions``, ``perdure approvals``, the dashboard's inbox):

- a **question**: a ``run.wait_for(event)`` whose event is not perdure's own
  (``perdure:...``), with or without a prompt (without one it asks just for the event);
  pending while memory holds its ``dormant`` record and neither an ``event_received``
  nor a ``wait_timed_out`` record at the same position (nor a terminal record);
- an **approval**: a tool call the gate sent to a person that nobody decided on yet
  (``perdure.approvals.pending_in``);
- a **parked** object: it stopped for a person to fix its code or its node and retry it.

A wait records its ``prompt`` and ``choices`` (when it asks them) in its ``dormant``
record. ``pending_questions`` finds the pending questions in an object's memory,
``App.get`` puts them in ``ObjectInfo.asking`` and ``App.questions`` lists them across
the store, newest first (the dashboard's inbox shows the same list), reading the memory
of the objects whose row says they may ask (``may_ask``). Answering is sending the event
the question names: ``App.send(object_id, event, payload)``. While it waits, the
object's note says what it asks with a prompt (``waiting_note``, from memory alone).

Pure reads: nothing here writes to memory.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from perdure.core.approvals import pending_in
from perdure.core.records import Kind, Record
from perdure.core.sealing import sealed_shown

__all__ = ["ASKING_MARK", "Question", "answered_from_outside", "asking_note", "forked_from",
           "may_ask", "pending_questions", "question_text", "waiting_note"]

ASKING_MARK = "(answer: event "
"""What the note of an object that asks a question holds (``asking_note``): ``App.get``,
``App.list`` and ``App.questions`` read memory only for objects whose note says so."""

_DORMANT = Kind.DORMANT.value
_ANSWERED = frozenset({Kind.EVENT_RECEIVED.value, Kind.WAIT_TIMED_OUT.value})
_TERMINATED = Kind.TERMINATED.value
_INSTANTIATED = Kind.INSTANTIATED.value
_OURS = "perdure:"  # perdure's own events (approvals, refinements, signals): no questions


@dataclass(frozen=True, slots=True)
class Question:
    """A question a waiting object asks.

    ``event`` is the event that answers it (``App.send(object_id, event, payload)``);
    ``prompt`` the JSON value the agent gave (``None`` if it gave only choices);
    ``choices`` the answers offered (``None``: any payload); ``seq`` the record that
    asked it and ``asked_at`` when (seconds since the epoch); ``timeout_at`` when the
    wait gives up (``None``: never). ``agent`` is the object's agent.
    """

    object_id: str
    agent: str
    event: str
    prompt: Any
    choices: tuple[Any, ...] | None
    seq: int
    pos: int | str
    asked_at: float
    timeout_at: float | None

    def to_json(self) -> dict[str, Any]:
        """The question as a JSON object (``choices`` a list, or null)."""
        return {"object_id": self.object_id, "agent": self.agent, "event": self.event,
                "prompt": self.prompt,
                "choices": None if self.choices is None else list(self.choices),
                "seq": self.seq, "pos": self.pos, "asked_at": self.asked_at,
                "timeout_at": self.timeout_at}


def _json_text(value: Any, cap: int) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=repr)
    return text if len(text) <= cap else text[: cap - 1] + "…"


def question_text(prompt: Any, choices: Sequence[Any] | None) -> str:
    """A question a waiting agent asks, in one line: the prompt (a string quoted, anything
    else as JSON, cut short) and the choices it offers; control characters escaped.
    A sealed prompt or choice (an agent that encrypts all) reads ``<sealed>``."""
    prompt = sealed_shown(prompt)
    choices = None if choices is None else sealed_shown(list(choices))
    if prompt is None:
        shown = "a question"
    elif isinstance(prompt, str):
        shown = repr(prompt if len(prompt) <= 300 else prompt[:299] + "…")
    else:
        shown = _json_text(prompt, 300)
    if choices:
        offered = " / ".join(c if isinstance(c, str) and c.isprintable() else _json_text(c, 60)
                             for c in choices)
        shown += " [" + (offered if len(offered) <= 200 else offered[:199] + "…") + "]"
    return shown


def asking_note(event: str, prompt: Any, choices: Sequence[Any] | None) -> str:
    """The note of an object dormant on a wait that asks ``prompt``."""
    return f"asking {question_text(prompt, choices)} {ASKING_MARK}{event!r})"


def answered_from_outside(event: str) -> bool:
    """Whether a wait for ``event`` is a question: someone outside sends the answer
    (every event but perdure's own, ``perdure:...``)."""
    return not event.startswith(_OURS)


def may_ask(note: str | None, waiting_event: str | None) -> bool:
    """Whether an object's row says it may be asking a question, so that its memory is
    worth reading for one: its note says it asks (``ASKING_MARK``), or it waits for an
    event sent from outside (a wait without a prompt)."""
    return waiting_event is not None and (
        (note is not None and ASKING_MARK in note) or answered_from_outside(waiting_event))


def _asks(body: dict[str, Any]) -> bool:
    """Whether a ``dormant`` body is a wait someone outside answers (see the module)."""
    event = body.get("event")
    return body.get("cmd") == "wait" and isinstance(event, str) and answered_from_outside(
        event)


def pending_questions(records: Sequence[Record], agent: str = "") -> list[Question]:
    """The questions ``records`` (an object's memory, in order) ask and have not had
    answered, in the order they were asked."""
    pending: dict[Any, Question] = {}
    for rec in records:
        kind = rec.kind
        body = rec.body
        if kind == _DORMANT:
            if _asks(body):
                choices = body.get("choices")
                wake_at = body.get("wake_at")
                pos = body.get("pos")
                if isinstance(pos, int | str) and not isinstance(pos, bool):
                    pending[pos] = Question(
                        rec.object_id, agent, body["event"], body.get("prompt"),
                        tuple(choices) if isinstance(choices, list) else None, rec.seq,
                        pos, rec.ts, float(wake_at) if isinstance(wake_at, int | float)
                        and not isinstance(wake_at, bool) else None)
        elif kind in _ANSWERED:
            pending.pop(body.get("pos"), None)
        elif kind == _TERMINATED:
            pending.clear()
    return list(pending.values())


def waiting_note(records: Sequence[Record]) -> str | None:
    """The note of an object that stays dormant on what its memory says it waits for:
    the questions it asks with a prompt or choices (``asking_note``, joined) and the tool
    calls waiting for a person; ``None`` when it waits for neither (a wait without a
    prompt leaves the note empty: the row's ``waiting_event`` says it)."""
    notes = [asking_note(q.event, q.prompt, q.choices) for q in pending_questions(records)
             if q.prompt is not None or q.choices is not None]
    notes += [f"approval needed: {p.tool} ({p.proposal_id})" for p in pending_in(records)]
    return "; ".join(notes) or None


def forked_from(records: Sequence[Record]) -> dict[str, Any] | None:
    """Where the object was forked from (``{"object_id", "seq", "hash"}``), as its first
    record's context says, or ``None``."""
    if not records or records[0].kind != _INSTANTIATED:
        return None
    context = records[0].body.get("context")
    origin = context.get("forked_from") if isinstance(context, dict) else None
    return dict(origin) if isinstance(origin, dict) else None
