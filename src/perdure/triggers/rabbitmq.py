"""RabbitMQ (AMQP 0-9-1) consumer: a queue whose messages start or signal objects.

Needs the ``perdure[rabbitmq]`` extra (``aio-pika``). The consumer connects with
``aio_pika.connect_robust``: when the connection drops it connects again by itself and
consumes on, and when the broker cannot be reached at the start it keeps trying. The
queue must exist (declared by whoever owns it, with its dead-letter exchange: see
``docs/howto/triggers.md``); the consumer only looks it up.

Each message is acknowledged only after its start or send is committed. A message the
connection lost before its acknowledgement comes again (the broker requeues what was
not acknowledged) and changes nothing: its id names the object or the event. A message
that can never apply is rejected without requeue, so the broker moves it to the queue's
dead-letter exchange; the reason is logged (``perdure.triggers``, WARNING). While the
store cannot be reached a message is handed back (``nack`` with requeue) after a pause.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlsplit

from perdure.errors import ConfigurationError
from perdure.triggers.common import AfterCommit, Message, Outcome, Trigger, handle_message

if TYPE_CHECKING:
    import aio_pika.abc

    from perdure.app import App

__all__ = ["DEFAULT_URL", "RabbitMQTrigger"]

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/"
RETRY_PAUSE = 1.0  # seconds before a message is handed back while the store is down

log = logging.getLogger("perdure.triggers")


def _redacted(url: str) -> str:
    """``url`` with its password masked."""
    password = urlsplit(url).password
    return url if password is None else url.replace(f":{password}@", ":***@", 1)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _aio_pika() -> Any:
    try:
        import aio_pika
    except ImportError as exc:
        raise ConfigurationError("RabbitMQ triggers need aio-pika: pip install "
                                 "'perdure[rabbitmq]'") from exc
    return aio_pika


@dataclass(frozen=True, kw_only=True)
class RabbitMQTrigger(Trigger):
    """Consume ``queue`` at ``url`` (``Triggers.rabbitmq`` declares one).

    A message is known by its header ``id_header`` (default ``x-message-id``), else by
    its AMQP ``message_id`` property; a message with neither is dead-lettered. (Some
    clients, aio-pika's among them, give every message they publish a random
    ``message_id``: stable across redeliveries, but new when the producer publishes
    again after a lost confirmation; set the id yourself.)
    ``prefetch`` bounds the messages handled at once; ``reconnect_interval`` is the
    pause between attempts to connect again.
    """

    queue: str
    url: str = DEFAULT_URL
    id_header: str = "x-message-id"
    prefetch: int = 16
    reconnect_interval: float = 1.0

    kind: ClassVar[str] = "rabbitmq"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.queue:
            raise ConfigurationError(f"trigger {self.name!r}: the queue name is empty")
        if urlsplit(self.url).scheme not in ("amqp", "amqps"):
            raise ConfigurationError(f"trigger {self.name!r}: url is amqp://... or "
                                     f"amqps://..., not {_redacted(self.url)!r}")
        if isinstance(self.prefetch, bool) or not isinstance(self.prefetch, int) or (
                self.prefetch < 1):
            raise ConfigurationError(f"trigger {self.name!r}: prefetch is a whole number, at "
                                     f"least 1, not {self.prefetch!r}")

    def source(self) -> str:
        """The queue and the broker, its password masked."""
        return f"queue {self.queue} at {_redacted(self.url)}"

    def message_of(self, incoming: aio_pika.abc.AbstractIncomingMessage) -> Message:
        """The ``Message`` an AMQP delivery is."""
        headers = {str(k): _text(v) for k, v in (incoming.headers or {}).items()}
        wanted = self.id_header.lower()
        message_id = next((v for k, v in headers.items() if k.lower() == wanted and v),
                          None) or incoming.message_id
        return Message(body=bytes(incoming.body), headers=headers, message_id=message_id,
                       source=self.queue, redelivered=bool(incoming.redelivered))

    async def consume(self, app: App, stop: asyncio.Event, *,
                      after_commit: AfterCommit | None = None,
                      drain_seconds: float = 10.0) -> None:
        """Consume until ``stop`` is set; then take no more messages, let those being
        handled finish (up to ``drain_seconds``) and close the connection (the broker
        requeues whatever was not acknowledged)."""
        pika = _aio_pika()
        connection = await self._connect(pika, stop)
        if connection is None:
            return
        inflight: set[asyncio.Task[Any]] = set()
        try:
            channel = await connection.channel()
            await channel.set_qos(prefetch_count=self.prefetch)
            try:
                queue = await channel.declare_queue(self.queue, passive=True)
            except pika.exceptions.ChannelNotFoundEntity:
                raise ConfigurationError(
                    f"trigger {self.name!r}: queue {self.queue!r} does not exist at "
                    f"{_redacted(self.url)}; declare it (with its dead-letter exchange) "
                    "first") from None

            async def on_message(incoming: aio_pika.abc.AbstractIncomingMessage) -> None:
                task = asyncio.current_task()
                if task is not None:
                    inflight.add(task)
                try:
                    await self._settle(app, incoming, after_commit)
                finally:
                    if task is not None:
                        inflight.discard(task)

            tag = await queue.consume(on_message)
            log.info("trigger %s consuming %s", self.name, self.source(),
                     extra={"action": "trigger_consuming"})
            await stop.wait()
            with contextlib.suppress(Exception):  # the connection may be down right now
                await asyncio.wait_for(queue.cancel(tag), timeout=5)
            if inflight:
                await asyncio.wait(set(inflight), timeout=drain_seconds)
        finally:
            for task in inflight:
                task.cancel()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connection.close(), timeout=5)

    async def _connect(self, pika: Any, stop: asyncio.Event) -> Any:
        """A robust connection, trying again (backing off up to 5 s) until the broker
        answers or ``stop`` is set (then ``None``)."""
        delay, said = 0.25, False
        while not stop.is_set():
            try:
                connection = await pika.connect_robust(
                    self.url, timeout=5, reconnect_interval=self.reconnect_interval,
                    client_properties={"connection_name": f"perdure trigger {self.name}"})
            except (*pika.exceptions.CONNECTION_EXCEPTIONS, TimeoutError) as exc:
                if not said:
                    log.warning("trigger %s: cannot reach %s (%s); trying again",
                                self.name, _redacted(self.url), exc or type(exc).__name__,
                                extra={"action": "trigger_broker_down"})
                    said = True
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=delay)
                delay = min(delay * 2, 5.0)
                continue
            if said:
                log.warning("trigger %s: %s reachable", self.name, _redacted(self.url),
                            extra={"action": "trigger_broker_up"})
            connection.reconnect_callbacks.add(self._reconnected)
            return connection
        return None

    def _reconnected(self, *_: Any) -> None:
        log.warning("trigger %s: connected again to %s", self.name, _redacted(self.url),
                    extra={"action": "trigger_reconnected"})

    async def _settle(self, app: App, incoming: aio_pika.abc.AbstractIncomingMessage,
                      after_commit: AfterCommit | None) -> None:
        message = self.message_of(incoming)
        result = await handle_message(app, self, message, after_commit)
        try:
            if result.outcome is Outcome.DONE:
                await incoming.ack()
            elif result.outcome is Outcome.DEAD:
                await incoming.reject(requeue=False)
            else:
                await asyncio.sleep(RETRY_PAUSE)
                await incoming.nack(requeue=True)
        except Exception as exc:  # noqa: BLE001 - the channel it came on is gone
            log.warning("trigger %s: message %s not settled (%s: %s); the broker delivers "
                        "it again", self.name, message.message_id, type(exc).__name__, exc,
                        extra={"action": "trigger_unsettled"})
