"""A test's own JetStream streams: one for the jobs, one keeping the dead letters;
deleted after."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import nats
from nats.js.api import RawStreamMsg

T = TypeVar("T")


def _run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


class JetStream:
    """Stream ``name`` with subject ``<name>.jobs``, and stream ``<name>_DEAD`` with
    subject ``<name>.dead`` (the trigger's dead-letter subject)."""

    def __init__(self, url: str, name: str) -> None:
        self.url = url
        self.stream = name
        self.subject = f"{name}.jobs"
        self.dead_stream = f"{name}_DEAD"
        self.dead_subject = f"{name}.dead"
        _run(self._declare())

    async def _declare(self) -> None:
        nc = await nats.connect(self.url)
        try:
            js = nc.jetstream()
            await js.add_stream(name=self.stream, subjects=[self.subject])
            await js.add_stream(name=self.dead_stream, subjects=[self.dead_subject])
        finally:
            await nc.close()

    def publish(self, *messages: tuple[bytes, dict[str, str]]) -> None:
        """Publish ``(body, headers)`` each through JetStream (stored when this returns)."""

        async def go() -> None:
            nc = await nats.connect(self.url)
            try:
                js = nc.jetstream()
                for body, headers in messages:
                    await js.publish(self.subject, body, headers=headers or None)
            finally:
                await nc.close()

        _run(go())

    def consumer(self, durable: str) -> tuple[int, int]:
        """The durable consumer's ``(pending, waiting for an acknowledgement)``."""

        async def go() -> tuple[int, int]:
            nc = await nats.connect(self.url)
            try:
                info = await nc.jetstream().consumer_info(self.stream, durable)
                return int(info.num_pending or 0), int(info.num_ack_pending or 0)
            finally:
                await nc.close()

        return _run(go())

    def dead(self) -> list[RawStreamMsg]:
        """The dead letters the dead-letter stream keeps, in order."""

        async def go() -> list[RawStreamMsg]:
            nc = await nats.connect(self.url)
            try:
                js = nc.jetstream()
                state = (await js.stream_info(self.dead_stream)).state
                if not state.messages:
                    return []
                return [await js.get_msg(self.dead_stream, seq)
                        for seq in range(state.first_seq, state.last_seq + 1)]
            finally:
                await nc.close()

        return _run(go())

    def dead_count(self) -> int:
        """How many dead letters the dead-letter stream keeps."""

        async def go() -> int:
            nc = await nats.connect(self.url)
            try:
                info = await nc.jetstream().stream_info(self.dead_stream)
                return int(info.state.messages)
            finally:
                await nc.close()

        return _run(go())

    def delete(self) -> None:
        """Delete both streams (and so their consumers)."""

        async def go() -> None:
            nc = await nats.connect(self.url)
            try:
                js = nc.jetstream()
                for name in (self.stream, self.dead_stream):
                    await js.delete_stream(name)
            finally:
                await nc.close()

        _run(go())
