"""What waiting agents ask: the prompts of ``run.wait_for(event, prompt=..., choices=...)``.

A wait that asks something records its ``prompt`` and ``choices`` in its ``dormant``
record. A question is *pending* while memory holds that record and neither an
``event_received`` nor a ``wait_timed_out`` record at the same position (nor a
terminal record): the agent still waits for its answer. ``pending_questions`` finds
them in an object's memory, ``App.get`` puts them in ``ObjectInfo.asking`` and
``App.questions`` lists them across the store, newest first (the dashboard's inbox).
Answering is sending the event the question names: ``App.send(object_id, event,
payload)``.

Pure reads: nothing here writes to memory.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from perdure.core.records import Kind, Record

__all__ = ["ASKING_MARK", "Question", "asking_note", "forked_from", "pending_questions",
           "question_text"]

ASKING_MARK = "(answer: event "
"""What the note of an object that asks a question holds (``asking_note``): ``App.get``,
``App.list`` and ``App.questions`` read memory only for objects whose note says so."""

_DORMANT = Kind.DORMANT.value
_ANSWERED = frozenset({Kind.EVENT_RECEIVED.value, Kind.WAIT_TIMED_OUT.value})
_TERMINATED = Kind.TERMINATED.value
_INSTANTIATED = Kind.INSTANTIATED.value


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
    else as JSON, cut short) and the choices it offers; control characters escaped."""
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


def _asks(body: dict[str, Any]) -> bool:
    return body.get("cmd") == "wait" and ("prompt" in body or "choices" in body)


def pending_questions(records: Sequence[Record], agent: str = "") -> list[Question]:
    """The questions ``records`` (an object's memory, in order) ask and have not had
    answered, in the order they were asked."""
    pending: dict[Any, Question] = {}
    for rec in records:
        kind = rec.kind
        body = rec.body
        if kind == _DORMANT:
            if _asks(body) and isinstance(body.get("event"), str):
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


def forked_from(records: Sequence[Record]) -> dict[str, Any] | None:
    """Where the object was forked from (``{"object_id", "seq", "hash"}``), as its first
    record's context says, or ``None``."""
    if not records or records[0].kind != _INSTANTIATED:
        return None
    context = records[0].body.get("context")
    origin = context.get("forked_from") if isinstance(context, dict) else None
    return dict(origin) if isinstance(origin, dict) else None
