"""``Triggers``: the triggers declared for an App, and running them."""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from perdure.core.secret import Secret
from perdure.errors import ConfigurationError
from perdure.triggers.common import AfterCommit, Message, Mode, Trigger, agent_name
from perdure.triggers.folder import FolderTrigger
from perdure.triggers.nats import DEFAULT_SERVERS, NatsTrigger
from perdure.triggers.rabbitmq import DEFAULT_URL, RabbitMQTrigger
from perdure.triggers.webhook import WebhookTrigger

if TYPE_CHECKING:
    from perdure.app import App

__all__ = ["DRAIN_SECONDS", "Triggers"]

DRAIN_SECONDS = 10.0
"""How long a stopping consumer lets the messages in hand finish, by default."""


def _plain(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "x"


class Triggers:
    """The triggers declared for one App: ``Triggers.of(app)`` (the same object each
    time), then ``.rabbitmq(...)``, ``.nats(...)``, ``.folder(...)`` to declare, and
    ``run`` (or ``run_forever``, or ``perdure triggers run``, or ``perdure worker
    --triggers``) to consume.

    ``after_commit`` (``None`` by default) is called with the trigger, the message and
    the ``Result`` after a start or send is committed and before the message is
    acknowledged: for metrics, or for a test that kills the consumer right there.
    """

    _of: ClassVar[weakref.WeakKeyDictionary[App, Triggers]] = weakref.WeakKeyDictionary()
    _of_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, app: App | None = None) -> None:
        self._app = weakref.ref(app) if app is not None else None
        self._declared: dict[str, Trigger] = {}
        self.after_commit: AfterCommit | None = None

    @classmethod
    def of(cls, app: App) -> Triggers:
        """The triggers of ``app`` (made empty on first use)."""
        with cls._of_lock:
            found = cls._of.get(app)
            if found is None:
                found = cls._of[app] = cls(app)
            return found

    def __repr__(self) -> str:
        return f"Triggers({', '.join(self._declared) or 'none'})"

    def __iter__(self) -> Iterator[Trigger]:
        return iter(list(self._declared.values()))

    def __len__(self) -> int:
        return len(self._declared)

    def __contains__(self, name: object) -> bool:
        return name in self._declared

    def get(self, name: str) -> Trigger:
        """The trigger named ``name``; ``ConfigurationError`` naming those declared."""
        found = self._declared.get(name)
        if found is None:
            known = ", ".join(self._declared) or "none"
            raise ConfigurationError(f"no trigger {name!r} is declared (declared: {known})")
        return found

    def add(self, trigger: Trigger) -> Trigger:
        """Declare a trigger built by hand; ``ConfigurationError`` if its name is taken."""
        if not isinstance(trigger, Trigger):
            raise ConfigurationError(f"a trigger is a perdure.triggers.Trigger, not "
                                     f"{type(trigger).__name__}")
        if trigger.name in self._declared:
            raise ConfigurationError(f"a trigger named {trigger.name!r} is declared already; "
                                     "give this one another name (name=...)")
        self._declared[trigger.name] = trigger
        return trigger

    # -- declaring ----------------------------------------------------------------------

    def rabbitmq(self, queue: str, *, agent: Callable[..., Any] | str | None = None,
                 url: str = DEFAULT_URL, name: str | None = None, mode: Mode = "start",
                 event: str | None = None, object_field: str | None = None,
                 object_header: str | None = None, id_prefix: str | None = None,
                 id_header: str = "x-message-id", prefetch: int = 16,
                 decoder: Callable[[Message], Any] | None = None,
                 labels: Mapping[str, str] | None = None) -> RabbitMQTrigger:
        """Consume RabbitMQ queue ``queue`` at ``url``: each message starts an object
        of ``agent`` (``mode="start"``) or sends ``event`` to the object a header or a
        field names (``mode="signal"``). See ``Trigger`` for the message format and
        ``RabbitMQTrigger`` for the rest; ``name`` defaults to ``rabbitmq-<queue>``."""
        made = RabbitMQTrigger(
            name=name or f"rabbitmq-{_plain(queue)}", agent=agent_name(agent), mode=mode,
            event=event, object_field=object_field, object_header=object_header,
            id_prefix=id_prefix, decoder=decoder, labels=dict(labels or {}), queue=queue,
            url=url, id_header=id_header, prefetch=prefetch)
        self.add(made)
        return made

    def nats(self, subject: str, *, stream: str,
             agent: Callable[..., Any] | str | None = None, servers: str = DEFAULT_SERVERS,
             name: str | None = None, mode: Mode = "start", event: str | None = None,
             object_field: str | None = None, object_header: str | None = None,
             id_prefix: str | None = None, durable: str | None = None,
             dead_letter_subject: str | None = None, batch: int = 16, ack_wait: float = 30.0,
             decoder: Callable[[Message], Any] | None = None,
             labels: Mapping[str, str] | None = None) -> NatsTrigger:
        """Consume ``subject`` of JetStream stream ``stream`` at ``servers``, as
        ``rabbitmq`` does a queue (see ``NatsTrigger``); ``name`` defaults to
        ``nats-<stream>-<subject>``."""
        made = NatsTrigger(
            name=name or f"nats-{_plain(stream)}-{_plain(subject)}", agent=agent_name(agent),
            mode=mode, event=event, object_field=object_field, object_header=object_header,
            id_prefix=id_prefix, decoder=decoder, labels=dict(labels or {}), subject=subject,
            stream=stream, servers=servers, durable=durable,
            dead_letter_subject=dead_letter_subject, batch=batch, ack_wait=ack_wait)
        self.add(made)
        return made

    def folder(self, path: str | Path, *, agent: Callable[..., Any] | str,
               name: str | None = None, pattern: str = "*", recursive: bool = False,
               interval: float = 1.0, settle: float = 0.0, id_prefix: str | None = None,
               labels: Mapping[str, str] | None = None) -> FolderTrigger:
        """Watch folder ``path``: each new or changed file matching ``pattern`` starts an
        object of ``agent`` with the file's path, once (see ``FolderTrigger``); ``name``
        defaults to ``folder-<folder name>``."""
        made = FolderTrigger(
            name=name or f"folder-{_plain(Path(path).name)}", agent=agent_name(agent),
            id_prefix=id_prefix, labels=dict(labels or {}), path=str(path), pattern=pattern,
            recursive=recursive, interval=interval, settle=settle)
        self.add(made)
        return made

    def webhook(self, name: str, *, agent: Callable[..., Any] | str | None = None,
                secret: Secret[str] | None = None, secret_env: str | None = None,
                mode: Mode = "start", event: str | None = None,
                object_field: str | None = None, object_header: str | None = None,
                id_prefix: str | None = None, tolerance: float = 300.0, skew: float = 30.0,
                max_body: int = 1024 * 1024,
                decoder: Callable[[Message], Any] | None = None,
                labels: Mapping[str, str] | None = None) -> WebhookTrigger:
        """Serve ``POST /api/v1/hooks/<name>`` (``perdure api``, ``perdure ui``): each
        request signed with ``secret`` (a ``perdure.Secret``) or the secret in
        environment variable ``secret_env`` starts an object of ``agent`` or sends
        ``event`` to an object, as a message of the other triggers does (see
        ``WebhookTrigger`` for the signature and the replay window)."""
        made = WebhookTrigger(
            name=name, agent=agent_name(agent), mode=mode, event=event,
            object_field=object_field, object_header=object_header, id_prefix=id_prefix,
            decoder=decoder, labels=dict(labels or {}), secret=secret, secret_env=secret_env,
            tolerance=tolerance, skew=skew, max_body=max_body)
        self.add(made)
        return made

    def webhooks(self) -> dict[str, WebhookTrigger]:
        """The webhooks declared, by name (what the HTTP API serves)."""
        return {t.name: t for t in self._declared.values() if isinstance(t, WebhookTrigger)}

    # -- running ------------------------------------------------------------------------

    def select(self, names: Sequence[str] | None = None) -> list[Trigger]:
        """The triggers named (all when ``names`` is empty or ``None``)."""
        return [self.get(name) for name in names] if names else list(self)

    def _app_for(self, app: App | None) -> App:
        if app is not None:
            return app
        made_for = self._app() if self._app is not None else None
        if made_for is None:
            raise ConfigurationError("these triggers belong to no App: pass app=...")
        return made_for

    async def run(self, stop: asyncio.Event, *, app: App | None = None,
                  names: Sequence[str] | None = None,
                  drain_seconds: float = DRAIN_SECONDS) -> None:
        """Consume with the triggers named (all by default) until ``stop`` is set, then
        drain: no more messages are taken, those in hand finish (up to
        ``drain_seconds``) and the connections close. ``app`` (default: the App these
        triggers were declared for) is the one starting and signalling objects.

        A trigger that cannot run (its queue or stream missing, its extra not installed)
        stops the others and its ``ConfigurationError`` is raised; a broker that cannot
        be reached is waited for.
        """
        chosen = [t for t in self.select(names) if not isinstance(t, WebhookTrigger)]
        target = self._app_for(app)
        if not chosen:
            await stop.wait()
            return
        inner = asyncio.Event()
        tasks = [asyncio.create_task(
            trigger.consume(target, inner, after_commit=self._committed,
                            drain_seconds=drain_seconds),
            name=f"perdure trigger {trigger.name}") for trigger in chosen]
        stopping = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait([*tasks, stopping],
                               return_when=asyncio.FIRST_COMPLETED)
            inner.set()
            await asyncio.gather(*tasks)
        finally:
            inner.set()
            stopping.cancel()
            for task in tasks:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.gather(*tasks, stopping, return_exceptions=True)

    def _committed(self, trigger: Trigger, message: Message, result: Any) -> None:
        if self.after_commit is not None:
            self.after_commit(trigger, message, result)

    def runner(self, *, app: App | None = None, names: Sequence[str] | None = None,
               drain_seconds: float = DRAIN_SECONDS
               ) -> Callable[[asyncio.Event], Awaitable[None]]:
        """``run`` with these arguments, as a function of the stop event: what
        ``App.run_worker(also=...)`` takes to consume beside a worker."""
        chosen = self.select(names)  # unknown names fail now, not in the worker
        picked = [t.name for t in chosen]

        async def run(stop: asyncio.Event) -> None:
            await self.run(stop, app=app, names=picked or None, drain_seconds=drain_seconds)

        return run

    def run_forever(self, *, app: App | None = None, names: Sequence[str] | None = None,
                    drain_seconds: float = DRAIN_SECONDS, install_signals: bool = True,
                    until: Callable[[], bool] | None = None) -> None:
        """Consume until SIGINT/SIGTERM (or ``until()`` turns true), then drain and
        return. Blocks; a second signal stops without waiting for the messages in hand
        (what was not acknowledged is delivered again)."""

        async def main() -> None:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            runner = asyncio.create_task(self.run(stop, app=app, names=names,
                                                  drain_seconds=drain_seconds))

            def signalled() -> None:
                if stop.is_set():
                    runner.cancel()
                stop.set()

            if install_signals and threading.current_thread() is threading.main_thread():
                for sig in (signal.SIGINT, signal.SIGTERM):
                    with contextlib.suppress(NotImplementedError, RuntimeError):
                        loop.add_signal_handler(sig, signalled)
            watcher = None
            if until is not None:

                async def watch() -> None:
                    while not until():
                        await asyncio.sleep(0.05)
                    stop.set()

                watcher = asyncio.create_task(watch())
            try:
                with contextlib.suppress(asyncio.CancelledError):
                    await runner
            finally:
                if watcher is not None:
                    watcher.cancel()

        asyncio.run(main())
