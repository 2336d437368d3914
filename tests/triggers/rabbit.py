"""A test's own RabbitMQ queue, with its dead-letter exchange and queue, deleted after."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import aio_pika

T = TypeVar("T")


def _run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


class Rabbit:
    """Queue ``queue`` at ``url``, dead-lettered (rejected without requeue) through
    exchange ``<queue>.dlx`` to queue ``<queue>.dead``: the set-up docs/howto/triggers.md
    shows."""

    def __init__(self, url: str, queue: str) -> None:
        self.url = url
        self.queue = queue
        self.dead_queue = f"{queue}.dead"
        self.dlx = f"{queue}.dlx"
        _run(self._declare())

    async def _declare(self) -> None:
        connection = await aio_pika.connect(self.url)
        async with connection:
            channel = await connection.channel()
            dlx = await channel.declare_exchange(self.dlx, aio_pika.ExchangeType.FANOUT,
                                                 durable=True)
            dead = await channel.declare_queue(self.dead_queue, durable=True)
            await dead.bind(dlx)
            await channel.declare_queue(self.queue, durable=True,
                                        arguments={"x-dead-letter-exchange": self.dlx})

    def publish(self, *messages: tuple[bytes, str | None, dict[str, Any]]) -> None:
        """Publish ``(body, message_id, headers)`` each, persistent, confirmed."""

        async def go() -> None:
            connection = await aio_pika.connect(self.url)
            async with connection:
                channel = await connection.channel()
                for body, message_id, headers in messages:
                    await channel.default_exchange.publish(
                        aio_pika.Message(body, message_id=message_id, headers=headers,
                                         delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                        routing_key=self.queue)

        _run(go())

    def ready(self, queue: str | None = None) -> int:
        """How many messages wait in ``queue`` (default: the test's), not handed out."""

        async def go() -> int:
            connection = await aio_pika.connect(self.url)
            async with connection:
                channel = await connection.channel()
                declared = await channel.declare_queue(queue or self.queue, passive=True)
                count = declared.declaration_result.message_count
                return int(count or 0)

        return _run(go())

    def dead(self) -> list[aio_pika.abc.AbstractIncomingMessage]:
        """The dead letters, taken off the dead-letter queue."""

        async def go() -> list[aio_pika.abc.AbstractIncomingMessage]:
            connection = await aio_pika.connect(self.url)
            async with connection:
                channel = await connection.channel()
                declared = await channel.declare_queue(self.dead_queue, passive=True)
                found = []
                while (message := await declared.get(no_ack=True, fail=False)) is not None:
                    found.append(message)
                return found

        return _run(go())

    def delete(self) -> None:
        """Delete the queues and the exchange."""

        async def go() -> None:
            connection = await aio_pika.connect(self.url)
            async with connection:
                channel = await connection.channel()
                for name in (self.queue, self.dead_queue):
                    await channel.queue_delete(name)
                await channel.exchange_delete(self.dlx)

        _run(go())
