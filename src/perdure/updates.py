"""Updates: a caller sends a request into a running object and gets its reply.

An agent declares the updates its objects take, and sets their handlers while it runs::

    @app.agent()
    async def cart(run: perdure.Run, owner: str) -> list[str]:
        items: list[str] = []

        async def add_item(item: str) -> int:
            await run.step(reserve, item)          # recorded: done once
            items.append(item)
            return len(items)

        run.on_update("add_item", add_item)
        await run.wait_for("checkout")             # takes updates while it waits
        return items

    @app.define_update(cart, name="add_item")
    def check_item(item: str) -> None:             # pure: raise to refuse
        if not item:
            raise ValueError("an item has a name")

    app.update("cart-1", "add_item", "tea", timeout=30)   # -> 1

``App.update`` runs the declared validator in the caller first: a refused request
raises ``UpdateRefusedError`` with the reason and nothing is written. An accepted one
is sent as the reserved event ``perdure:update`` with an id of its own; the object,
waiting in ``run.wait_for``, receives it at a recorded position, asks the validators
again, runs the handler (recorded work: replay never does its steps twice) and emits the
reply, which the caller waits for on the store's pushes (``perdure.follow``). See
``perdure.engine.commands.updates`` for the rules of memory.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from perdure.core.codec import MAX_DEPTH, encode
from perdure.core.events import UPDATE_EVENT
from perdure.core.names import check_name
from perdure.errors import (
    ConfigurationError,
    ObjectTerminatedError,
    UnknownUpdateError,
    UpdateFailedError,
    UpdateRefusedError,
)
from perdure.follow import StreamEvent, afollow, follow
from perdure.keys.at_rest import sealed_payload
from perdure.keys.client import lookup_id

if TYPE_CHECKING:
    from perdure.app import App

__all__ = ["Sent", "await_reply", "declare", "send_update", "wait_reply"]

Sent = tuple[str, int]
"""An update sent: its id and the head of memory before it (the reply comes after)."""


def send_update(app: App, object_id: str, name: str, args: Sequence[Any]) -> Sent:
    """Validate update ``name`` of ``object_id`` with ``args`` in this process, then
    send it; ``UnknownUpdateError``, ``UpdateRefusedError``, ``ObjectTerminatedError``,
    ``ObjectNotFoundError``, ``SerializationError``."""
    lookup_id(object_id)
    check_name(name, "update name")
    info = app.get(object_id, explain=False)
    if info.terminal:
        raise ObjectTerminatedError(f"object {object_id!r} has {info.status}; it takes no "
                                    "updates")
    agent = app.agents.get(info.agent)
    declared = agent.updates if agent is not None else {}
    if name not in declared:
        known = ", ".join(sorted(declared)) or "none"
        raise UnknownUpdateError(f"agent {info.agent!r} declares no update {name!r} (its "
                                 f"updates: {known}; app.define_update declares one)")
    args = list(args)
    encode(args, what=f"arguments of update {name!r}", max_depth=MAX_DEPTH)
    validator = declared[name]
    if validator is not None:
        try:
            validator(*args)
        except Exception as exc:
            raise UpdateRefusedError(f"update {name!r} of {object_id!r} refused: "
                                     f"{type(exc).__name__}: {exc}") from exc
    uid = uuid.uuid4().hex
    request = {"id": uid, "name": name, "args": args}
    data = sealed_payload(app.store, app.data_keys, object_id, UPDATE_EVENT, request)
    key = f"update:{uid}"
    app.store.send(object_id, UPDATE_EVENT, data, key, app.clock(),
                   app.client.seal_event(object_id, UPDATE_EVENT, data, key))
    return uid, info.records


def _reply(object_id: str, uid: str, event: StreamEvent) -> tuple[bool, Any]:
    """``(True, result)`` when ``event`` is the reply to ``uid``; raises for a refused or
    failed one, and when the object ended without replying."""
    data = event.data
    if (event.kind == "emitted" and event.name == UPDATE_EVENT and isinstance(data, dict)
            and data.get("id") == uid):
        if data.get("ok"):
            return True, data.get("result")
        if "refused" in data:
            raise UpdateRefusedError(f"update {data.get('name')!r} of {object_id!r} refused "
                                     f"by the object: {data['refused']}")
        raise UpdateFailedError(f"update {data.get('name')!r} of {object_id!r} failed: "
                                f"{data.get('error')}")
    if event.ended:
        raise UpdateFailedError(f"object {object_id!r} ended before it took the update")
    return False, None


def wait_reply(app: App, object_id: str, sent: Sent, timeout: float | None) -> Any:
    """The reply to ``sent``, waited for on the store's pushes; ``ResultTimeoutError``
    after ``timeout`` seconds (the request stays queued: the object applies it when it
    next waits)."""
    uid, after = sent
    for event in follow(app, object_id, after, timeout=timeout, opened=True):
        done, result = _reply(object_id, uid, event)
        if done:
            return result
    raise UpdateFailedError(f"object {object_id!r} ended before it took the update")


async def await_reply(app: App, object_id: str, sent: Sent, timeout: float | None) -> Any:
    """``wait_reply`` without holding a thread while it waits."""
    uid, after = sent
    async for event in afollow(app, object_id, after, timeout=timeout, opened=True):
        done, result = _reply(object_id, uid, event)
        if done:
            return result
    raise UpdateFailedError(f"object {object_id!r} ended before it took the update")


def declare(agent_updates: dict[str, Callable[..., Any] | None], name: str,
            validator: Callable[..., Any] | None) -> None:
    """Declare update ``name`` with ``validator`` (``App.define_update``)."""
    check_name(name, "update name")
    if validator is not None and not callable(validator):
        raise ConfigurationError(f"the validator of update {name!r} is a function")
    agent_updates[name] = validator
