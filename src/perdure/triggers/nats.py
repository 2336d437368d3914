"""NATS JetStream consumer: a stream's subject whose messages start or signal objects.

Needs the ``perdure[nats]`` extra (``nats-py``). The consumer pulls from a durable
JetStream consumer (made on first use with explicit acknowledgement, else bound as it
is), so its place in the stream outlives the process. The client reconnects by itself
(forever, ``reconnect_interval`` apart) and pulls on; when no server answers at the
start it keeps trying. The stream must exist (see ``docs/howto/triggers.md``).

A message is known by its ``Nats-Msg-Id`` header (the id JetStream itself dedupes
publishes by), else by its stream and stream sequence, which JetStream keeps for each
redelivery of the same stored message. It is acknowledged only after its start or send
is committed; one whose acknowledgement was lost comes again after ``ack_wait`` and
changes nothing. A message that can never apply is published to
``dead_letter_subject`` (the body, its headers, and ``Perdure-Reason``,
``Perdure-Trigger``, ``Perdure-Subject``), through JetStream when a stream keeps that
subject, then terminated (``term``: never delivered again). While the store cannot be
reached a message is handed back (``nak``) to come again after a pause.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from perdure.errors import ConfigurationError
from perdure.triggers.common import AfterCommit, Message, Outcome, Trigger, handle_message

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.aio.msg import Msg

    from perdure.app import App

__all__ = ["DEFAULT_SERVERS", "NatsTrigger"]

DEFAULT_SERVERS = "nats://127.0.0.1:4222"
RETRY_PAUSE = 1.0  # seconds before a message handed back comes again

log = logging.getLogger("perdure.triggers")


def _nats() -> Any:
    try:
        import nats
        import nats.js.api
        import nats.js.errors
    except ImportError as exc:
        raise ConfigurationError("NATS triggers need nats-py: pip install "
                                 "'perdure[nats]'") from exc
    return nats


@dataclass(frozen=True, kw_only=True)
class NatsTrigger(Trigger):
    """Consume ``subject`` of JetStream stream ``stream`` (``Triggers.nats`` declares
    one).

    ``servers``: one URL or several, comma-separated. ``durable``: the JetStream
    consumer's name (default ``perdure-`` and the trigger's name). ``dead_letter_subject``
    (default ``perdure.dead.`` and the trigger's name). ``batch`` bounds the messages
    pulled and handled at once; ``ack_wait`` is how long JetStream waits for an
    acknowledgement before it delivers a message again (set when the consumer is made).
    """

    subject: str
    stream: str
    servers: str = DEFAULT_SERVERS
    durable: str | None = None
    dead_letter_subject: str | None = None
    batch: int = 16
    ack_wait: float = 30.0
    reconnect_interval: float = 1.0

    kind: ClassVar[str] = "nats"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.subject or not self.stream:
            raise ConfigurationError(f"trigger {self.name!r}: give a subject and a stream")
        if isinstance(self.batch, bool) or not isinstance(self.batch, int) or self.batch < 1:
            raise ConfigurationError(f"trigger {self.name!r}: batch is a whole number, at "
                                     f"least 1, not {self.batch!r}")
        if not isinstance(self.ack_wait, int | float) or self.ack_wait <= 0:
            raise ConfigurationError(f"trigger {self.name!r}: ack_wait is a number of "
                                     f"seconds, more than 0, not {self.ack_wait!r}")

    @property
    def consumer(self) -> str:
        """The durable JetStream consumer's name."""
        return self.durable or "perdure-" + re.sub(r"[^A-Za-z0-9_-]", "_", self.name)

    @property
    def dead_letters(self) -> str:
        """The subject dead letters are published to."""
        return self.dead_letter_subject or "perdure.dead." + re.sub(
            r"[^A-Za-z0-9_-]", "_", self.name)

    def source(self) -> str:
        """The subject, the stream, the consumer and the servers."""
        return (f"subject {self.subject} of stream {self.stream} (consumer "
                f"{self.consumer}) at {self.servers}")

    def describe(self) -> dict[str, Any]:
        """The declaration as JSON values, with the dead-letter subject."""
        return {**super().describe(), "dead_letter_subject": self.dead_letters}

    def message_of(self, msg: Msg) -> Message:
        """The ``Message`` a JetStream delivery is."""
        headers = dict(msg.headers or {})
        meta = msg.metadata
        message_id = headers.get("Nats-Msg-Id") or f"{meta.stream}:{meta.sequence.stream}"
        return Message(body=bytes(msg.data), headers=headers, message_id=message_id,
                       source=msg.subject, redelivered=(meta.num_delivered or 1) > 1)

    async def consume(self, app: App, stop: asyncio.Event, *,
                      after_commit: AfterCommit | None = None,
                      drain_seconds: float = 10.0) -> None:
        """Pull and handle batches until ``stop`` is set; the batch in hand is finished
        first (each message one commit), then the connection is closed. ``drain_seconds``
        is not needed here: a batch is short, and whatever is not acknowledged comes
        again after ``ack_wait``."""
        nats = _nats()
        closing = asyncio.Event()
        nc = await self._connect(nats, stop, closing)
        if nc is None:
            return
        try:
            js = nc.jetstream()
            config = nats.js.api.ConsumerConfig(
                ack_policy=nats.js.api.AckPolicy.EXPLICIT, ack_wait=self.ack_wait,
                max_ack_pending=max(self.batch * 4, 64))
            try:
                sub = await js.pull_subscribe(self.subject, durable=self.consumer,
                                              stream=self.stream, config=config)
            except nats.js.errors.NotFoundError:
                raise ConfigurationError(
                    f"trigger {self.name!r}: stream {self.stream!r} does not exist at "
                    f"{self.servers}; add it (with subjects {self.subject!r}) first") from None
            log.info("trigger %s consuming %s", self.name, self.source(),
                     extra={"action": "trigger_consuming"})
            while not stop.is_set():
                try:
                    msgs = await sub.fetch(self.batch, timeout=1.0)
                except nats.errors.TimeoutError:
                    continue
                except nats.errors.Error as exc:  # disconnected: the client reconnects
                    log.debug("trigger %s: fetch failed (%s)", self.name, exc)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), timeout=self.reconnect_interval)
                    continue
                await asyncio.gather(*(self._settle(app, nc, js, msg, after_commit)
                                       for msg in msgs))
            with contextlib.suppress(Exception):
                await asyncio.wait_for(sub.unsubscribe(), timeout=5)
        finally:
            closing.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(nc.close(), timeout=5)

    async def _connect(self, nats: Any, stop: asyncio.Event,
                       closing: asyncio.Event) -> Client | None:
        """A connection that reconnects by itself, trying again (backing off up to 5 s)
        until a server answers or ``stop`` is set (then ``None``); a disconnection is
        said unless ``closing`` is set."""
        name = self.name

        async def disconnected() -> None:
            if closing.is_set():
                return
            log.warning("trigger %s: disconnected from NATS; reconnecting", name,
                        extra={"action": "trigger_disconnected"})

        async def reconnected() -> None:
            log.warning("trigger %s: connected again to NATS", name,
                        extra={"action": "trigger_reconnected"})

        async def error(exc: Exception) -> None:
            log.debug("trigger %s: NATS client: %s", name, exc)

        servers = [s.strip() for s in self.servers.split(",") if s.strip()]
        delay, said = 0.25, False
        while not stop.is_set():
            try:
                nc: Client = await nats.connect(
                    servers=servers, name=f"perdure trigger {name}", allow_reconnect=True,
                    max_reconnect_attempts=-1, reconnect_time_wait=self.reconnect_interval,
                    connect_timeout=2, error_cb=error, disconnected_cb=disconnected,
                    reconnected_cb=reconnected)
            except (nats.errors.Error, OSError, TimeoutError) as exc:
                if not said:
                    log.warning("trigger %s: cannot reach %s (%s); trying again", name,
                                self.servers, exc or type(exc).__name__,
                                extra={"action": "trigger_broker_down"})
                    said = True
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=delay)
                delay = min(delay * 2, 5.0)
                continue
            if said:
                log.warning("trigger %s: %s reachable", name, self.servers,
                            extra={"action": "trigger_broker_up"})
            return nc
        return None

    async def _settle(self, app: App, nc: Client, js: Any, msg: Msg,
                      after_commit: AfterCommit | None) -> None:
        message = self.message_of(msg)
        result = await handle_message(app, self, message, after_commit)
        try:
            if result.outcome is Outcome.DONE:
                await msg.ack()
            elif result.outcome is Outcome.DEAD:
                await self._dead_letter(nc, js, msg, message, result.reason)
                await msg.term()
            else:
                await msg.nak(delay=RETRY_PAUSE)
        except Exception as exc:  # noqa: BLE001 - the connection dropped meanwhile
            log.warning("trigger %s: message %s not settled (%s: %s); JetStream delivers "
                        "it again", self.name, message.message_id, type(exc).__name__, exc,
                        extra={"action": "trigger_unsettled"})

    async def _dead_letter(self, nc: Client, js: Any, msg: Msg, message: Message,
                           reason: str) -> None:
        """Publish the message and why to the dead-letter subject: through JetStream
        (acknowledged by the stream that keeps the subject, deduplicated by its id), or,
        when no stream keeps it, to whoever listens."""
        import nats.js.errors

        headers = {**message.headers, "Perdure-Reason": reason, "Perdure-Trigger": self.name,
                   "Perdure-Subject": msg.subject}
        if message.message_id is not None:
            headers["Nats-Msg-Id"] = f"{self.name}:{message.message_id}"
        try:
            await js.publish(self.dead_letters, msg.data, timeout=5, headers=headers)
        except nats.js.errors.NoStreamResponseError:
            await nc.publish(self.dead_letters, msg.data, headers=headers)
            await nc.flush(timeout=5)
