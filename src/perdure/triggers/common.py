"""What every trigger shares: a message, the trigger's declaration, and the one path
from a message to a committed start or send (``deliver``).

A consumer (one module per source) turns what it receives into a ``Message`` and calls
``deliver``; the outcome says what to do with the message: acknowledge it (``DONE``:
the start or send is committed, or was before), dead-letter it (``DEAD``: it can never
be applied; nothing was started or sent) or hand it back for later (``RETRY``: the store
could not be reached). The consumer acknowledges only after ``deliver`` returned
``DONE``, so a consumer killed in between gets the message again, and delivering it
again changes nothing: the message id names the started object (its id) or the sent
event (its dedupe key).
"""

from __future__ import annotations

import abc
import asyncio
import enum
import hashlib
import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from perdure.core.names import check_labels, check_name, check_object_id
from perdure.errors import (
    ConfigurationError,
    ObjectConflictError,
    ObjectNotFoundError,
    ObjectTerminatedError,
    PerdureError,
    StoreError,
)

if TYPE_CHECKING:
    from perdure.app import App

__all__ = [
    "AfterCommit",
    "Message",
    "Mode",
    "Outcome",
    "Result",
    "Trigger",
    "agent_name",
    "deliver",
    "handle_message",
    "id_token",
]

log = logging.getLogger("perdure.triggers")

Mode = Literal["start", "signal"]

_PLAIN_ID = re.compile(r"[A-Za-z0-9._:=+-]{1,100}")
_REASON_MAX = 500


def id_token(message_id: str) -> str:
    """The part of an object id or dedupe key a message id gives: the id itself when it
    is short and plain (letters, digits, ``._:=+-``), else ``sha256-`` and 40 hex digits
    of its hash."""
    if _PLAIN_ID.fullmatch(message_id):
        return message_id
    return "sha256-" + hashlib.sha256(message_id.encode("utf-8", "surrogatepass")).hexdigest()[:40]


def agent_name(agent: Callable[..., Any] | str | None) -> str | None:
    """The registered name of ``agent`` (a function decorated with ``@app.agent()`` or a
    name); ``ConfigurationError`` for a function that is not an agent."""
    if agent is None:
        return None
    if isinstance(agent, str):
        return check_name(agent, "agent name")
    name = getattr(agent, "__perdure_agent__", None)
    if not isinstance(name, str):
        shown = getattr(agent, "__qualname__", repr(agent))
        raise ConfigurationError(f"trigger agent {shown!r} is not an agent: decorate it with "
                                 "@app.agent() before declaring the trigger, or give its name")
    return name


@dataclass(frozen=True, slots=True)
class Message:
    """One message as a trigger sees it, whatever its source.

    ``body`` is the raw bytes; ``headers`` the message's headers (AMQP headers, NATS
    headers) as text; ``message_id`` the id the trigger knows it by, stable across
    redelivery (``None``: the message has none, and is dead-lettered); ``source`` the
    queue, subject or file it came from; ``redelivered`` whether the broker says it
    delivered it before.
    """

    body: bytes
    headers: Mapping[str, str]
    message_id: str | None
    source: str
    redelivered: bool = False


class Outcome(enum.Enum):
    """What a consumer does with a message after ``deliver``."""

    DONE = "done"  # committed (now or before): acknowledge
    DEAD = "dead"  # can never apply: dead-letter, with the reason
    RETRY = "retry"  # the store is unavailable: hand it back, try again later


@dataclass(frozen=True, slots=True)
class Result:
    """``deliver``'s answer: the outcome, the object concerned (if known), whether this
    delivery created it or queued the event (``False``: it was done before), and the
    reason of a ``DEAD`` or ``RETRY``, and its ``cause`` in one word: ``no-id``,
    ``undecodable``, ``invalid`` (arguments, agent, format), ``not-found`` (the object
    to signal), ``ended`` (it has terminated), ``conflict`` (the id was used otherwise),
    ``unavailable`` (the store)."""

    outcome: Outcome
    object_id: str | None = None
    applied: bool = False
    reason: str = ""
    cause: str = ""


AfterCommit = Callable[["Trigger", Message, Result], None]
"""What ``Triggers.after_commit`` is: called with the trigger, the message and the result
after a start or send committed, before the message is acknowledged."""


def _reason(text: str) -> str:
    """A reason on one line, short enough for a header."""
    one = " ".join(text.split())
    return one if len(one) <= _REASON_MAX else one[: _REASON_MAX - 3] + "..."


@dataclass(frozen=True, kw_only=True)
class Trigger(abc.ABC):
    """What every trigger declares: its ``name`` (unique among an App's triggers; it
    prefixes the ids it derives), the ``agent`` it starts or signals, and what it does
    with a message.

    ``mode="start"`` starts one object per message: the body is a JSON object with
    optional ``args`` (a list) and ``kwargs`` (an object), and ``agent`` (a name) when
    the trigger gives none; the object id is ``id_prefix`` (default: the name and a
    dash) followed by the message id. ``mode="signal"`` sends event ``event`` to an
    existing object: the whole body is the event's payload (any JSON), the object is
    named by header ``object_header`` or by the body's top-level field
    ``object_field``, and the dedupe key is the trigger's name, a colon and the message
    id. ``decoder`` (optional) replaces ``json.loads``: it takes the ``Message`` and
    returns the value the JSON would have been; whatever it raises dead-letters the
    message with its text. ``labels`` go on every object started (besides
    ``trigger=<name>``).
    """

    name: str
    agent: str | None = None
    mode: Mode = "start"
    event: str | None = None
    object_field: str | None = None
    object_header: str | None = None
    id_prefix: str | None = None
    decoder: Callable[[Message], Any] | None = None
    labels: Mapping[str, str] = field(default_factory=dict)

    kind: ClassVar[str] = "trigger"

    def __post_init__(self) -> None:
        check_object_id(self.name, "trigger name")
        if self.mode not in ("start", "signal"):
            raise ConfigurationError(f"trigger {self.name!r}: mode is 'start' or 'signal', "
                                     f"not {self.mode!r}")
        if self.mode == "signal":
            if self.event is None:
                raise ConfigurationError(f"trigger {self.name!r} signals: give event=NAME")
            check_name(self.event, "event name")
            if (self.object_field is None) == (self.object_header is None):
                raise ConfigurationError(
                    f"trigger {self.name!r} signals: name the object with exactly one of "
                    "object_field= (a field of the JSON body) or object_header= (a header)")
        elif self.event is not None or self.object_field or self.object_header:
            raise ConfigurationError(
                f"trigger {self.name!r} starts objects: event, object_field and "
                "object_header go with mode='signal'")
        if self.id_prefix is not None:
            check_object_id(self.id_prefix + "x", "id prefix")
        check_labels({**self.labels, "trigger": self.name})

    @property
    def prefix(self) -> str:
        """What the object ids this trigger starts begin with."""
        return self.id_prefix if self.id_prefix is not None else f"{self.name}-"

    def object_id_for(self, message_id: str) -> str:
        """The id of the object a message with this id starts."""
        return f"{self.prefix}{id_token(message_id)}"

    def dedupe_key_for(self, message_id: str) -> str:
        """The dedupe key of the event a message with this id sends."""
        return f"{self.name}:{id_token(message_id)}"

    @abc.abstractmethod
    def source(self) -> str:
        """Where its messages come from, in words (``perdure triggers`` lists it)."""

    @abc.abstractmethod
    async def consume(self, app: App, stop: asyncio.Event, *,
                      after_commit: AfterCommit | None = None,
                      drain_seconds: float = 10.0) -> None:
        """Take messages and apply them until ``stop`` is set, then drain and return."""

    def describe(self) -> dict[str, Any]:
        """The declaration as JSON values (``perdure triggers --json``)."""
        doc: dict[str, Any] = {"name": self.name, "kind": self.kind, "source": self.source(),
                               "mode": self.mode, "agent": self.agent}
        if self.mode == "signal":
            doc["event"] = self.event
            doc["object"] = (f"header {self.object_header}" if self.object_header
                             else f"field {self.object_field}")
        return doc


def _decode(trigger: Trigger, message: Message) -> Any:
    if trigger.decoder is not None:
        return trigger.decoder(message)
    return json.loads(message.body)


def _start_parts(trigger: Trigger, value: Any) -> tuple[str, list[Any], dict[str, Any]]:
    if not isinstance(value, dict):
        raise ValueError(f"a start message is a JSON object with args/kwargs, not "
                         f"{type(value).__name__}")
    unknown = set(value) - {"args", "kwargs", "agent"}
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(sorted(unknown))} in a start message "
                         "(it takes args, kwargs and agent)")
    args = value.get("args", [])
    kwargs = value.get("kwargs", {})
    if not isinstance(args, list):
        raise ValueError(f"args is a JSON list, not {type(args).__name__}")
    if not isinstance(kwargs, dict):
        raise ValueError(f"kwargs is a JSON object, not {type(kwargs).__name__}")
    named = value.get("agent")
    if named is not None and not isinstance(named, str):
        raise ValueError(f"agent is a name, not {type(named).__name__}")
    if trigger.agent is None:
        if named is None:
            raise ValueError("the message names no agent and the trigger gives none")
        return named, args, kwargs
    if named is not None and named != trigger.agent:
        raise ValueError(f"the message names agent {named!r}; this trigger starts "
                         f"{trigger.agent!r}")
    return trigger.agent, args, kwargs


def _target(trigger: Trigger, message: Message, value: Any) -> str:
    if trigger.object_header is not None:
        wanted = trigger.object_header.lower()
        found = next((v for k, v in message.headers.items() if k.lower() == wanted), None)
        if not found:
            raise ValueError(f"no header {trigger.object_header!r} naming the object")
        return found
    assert trigger.object_field is not None
    if not isinstance(value, dict) or not isinstance(value.get(trigger.object_field), str):
        raise ValueError(f"the body has no text field {trigger.object_field!r} naming the "
                         "object")
    return str(value[trigger.object_field])


async def deliver(app: App, trigger: Trigger, message: Message) -> Result:
    """Apply ``message`` as ``trigger`` says, through ``app.aio`` (store work off the
    event loop). Returns when the start or send is committed (``DONE``), or says why it
    cannot be (``DEAD``) or not now (``RETRY``). Never raises for a bad message."""
    if message.message_id is None:
        return Result(Outcome.DEAD, reason="the message has no id to know it by across "
                                           "redeliveries", cause="no-id")
    try:
        value = _decode(trigger, message)
    except Exception as exc:  # noqa: BLE001 - any failure of a user's decoder or of JSON
        return Result(Outcome.DEAD, reason=_reason(f"cannot decode the message: "
                                                   f"{type(exc).__name__}: {exc}"),
                      cause="undecodable")
    if trigger.mode == "start":
        return await _start(app, trigger, message.message_id, value)
    return await _signal(app, trigger, message, value)


async def _start(app: App, trigger: Trigger, message_id: str, value: Any) -> Result:
    try:
        agent, args, kwargs = _start_parts(trigger, value)
    except ValueError as exc:
        return Result(Outcome.DEAD, reason=_reason(str(exc)), cause="invalid")
    object_id = trigger.object_id_for(message_id)
    try:
        starter = app.aio.options(object_id=object_id,
                                  labels={**trigger.labels, "trigger": trigger.name})
        handle = await starter.start(agent, *args, **kwargs)
    except StoreError as exc:
        return Result(Outcome.RETRY, object_id, reason=_reason(str(exc)), cause="unavailable")
    except ObjectConflictError as exc:
        return Result(Outcome.DEAD, object_id, reason=_reason(str(exc)), cause="conflict")
    except (PerdureError, TypeError, ValueError) as exc:  # unknown agent, bad arguments, ...
        return Result(Outcome.DEAD, object_id, reason=_reason(str(exc)), cause="invalid")
    if not handle.created and handle.differs is not None:
        return Result(Outcome.DEAD, object_id, reason=_reason(
            f"object {object_id!r} exists, started otherwise: {handle.differs} (the message "
            "id was used before for other arguments)"), cause="conflict")
    return Result(Outcome.DONE, object_id, applied=handle.created)


async def _signal(app: App, trigger: Trigger, message: Message, value: Any) -> Result:
    assert message.message_id is not None and trigger.event is not None
    try:
        object_id = _target(trigger, message, value)
    except ValueError as exc:
        return Result(Outcome.DEAD, reason=_reason(str(exc)), cause="invalid")
    try:
        queued = await app.aio.send(object_id, trigger.event, value,
                                    dedupe_key=trigger.dedupe_key_for(message.message_id))
    except ObjectTerminatedError as exc:
        if message.redelivered:  # the first delivery may have been committed before the end
            return Result(Outcome.DONE, object_id)
        return Result(Outcome.DEAD, object_id, reason=_reason(str(exc)), cause="ended")
    except ObjectNotFoundError as exc:
        return Result(Outcome.DEAD, object_id, reason=_reason(str(exc)), cause="not-found")
    except ObjectConflictError as exc:
        return Result(Outcome.DEAD, object_id, reason=_reason(str(exc)), cause="conflict")
    except StoreError as exc:
        return Result(Outcome.RETRY, object_id, reason=_reason(str(exc)), cause="unavailable")
    except (PerdureError, TypeError, ValueError) as exc:  # a bad id or payload
        return Result(Outcome.DEAD, object_id, reason=_reason(str(exc)), cause="invalid")
    return Result(Outcome.DONE, object_id, applied=queued)


async def handle_message(app: App, trigger: Trigger, message: Message,
                         after_commit: AfterCommit | None) -> Result:
    """``deliver``, said in the log; on ``DONE``, ``after_commit`` is called before the
    consumer acknowledges (``Triggers.after_commit``)."""
    result = await deliver(app, trigger, message)
    if result.outcome is Outcome.DONE:
        log.info("trigger %s: message %s %s object %s", trigger.name, message.message_id,
                 ("started" if trigger.mode == "start" else "signalled") if result.applied
                 else "was applied before to", result.object_id,
                 extra={"action": "trigger_done"})
        if after_commit is not None:
            after_commit(trigger, message, result)
    elif result.outcome is Outcome.DEAD:
        log.warning("trigger %s: message %s from %s dead-lettered: %s", trigger.name,
                    message.message_id, message.source, result.reason,
                    extra={"action": "trigger_dead"})
    else:
        log.warning("trigger %s: message %s handed back, the store is unavailable: %s",
                    trigger.name, message.message_id, result.reason,
                    extra={"action": "trigger_retry"})
    return result
