"""The App's side of secrets at rest: sealing what it writes, opening what it reads.

``App.start`` seals an agent's arguments (each ``perdure.Secret``, or every argument of
an agent registered with ``encrypt=True``) under the new object's data key before the
first record is signed; ``App.send`` seals an event's payload under the receiving
object's data key (whole, when that object's agent encrypts all: the flag sits beside
its wrapped data key), as ``App.refine`` seals a goal; ``App.outcome`` opens a sealed
result. Each takes the App's
``DataKeys``; without the key it needs, ``DataKeyError`` says which key that is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from perdure.core.arguments import start_differences
from perdure.core.codec import MAX_DEPTH, encode
from perdure.core.records import Record
from perdure.core.sealing import has_secrets, marked
from perdure.core.secret import Secret
from perdure.errors import DataKeyError
from perdure.keys.data_keys import DataKeys
from perdure.keys.sealer import Sealer, needs_sealing, sealed_arguments
from perdure.stores.base import Store

__all__ = ["differences", "opened_body", "sealed_edit", "sealed_goal", "sealed_payload",
           "start_arguments"]


def start_arguments(store: Store, keys: DataKeys | None, agent: str, encrypt: bool,
                    object_id: str, args: Sequence[Any], kwargs: Mapping[str, Any]
                    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments as the object's first record keeps them (sealed where needed: all of
    them when the ``agent`` encrypts all)."""
    if not needs_sealing(args, kwargs, seal_all=encrypt):
        return tuple(args), dict(kwargs)
    sealer = Sealer(store, keys, object_id, seal_all=encrypt)
    return sealed_arguments(sealer, args, kwargs, agent=agent)


def sealed_payload(store: Store, keys: DataKeys | None, object_id: str, event: str,
                   payload: Any) -> bytes:
    """An event's payload as the inbox keeps it: its secrets sealed under the object's
    data key, or all of it when the object's agent encrypts all."""
    what = f"payload of event {event!r}"
    row = store.data_key(object_id)
    seal_all = row is not None and row.seal_all
    if not seal_all and not has_secrets(payload):
        data = encode(payload, what=what, max_depth=MAX_DEPTH)
        if marked(data):  # perdure's reserved keys: refused with the reason
            Sealer(store, keys, object_id).store_value(payload, what=what)
        return data
    sealer = Sealer(store, keys, object_id, seal_all=seal_all)
    return sealer.store_value(payload, what=what)[1]


def sealed_goal(store: Store, keys: DataKeys | None, object_id: str, goal: Any) -> Any:
    """A refinement's ``goal`` as memory keeps it: sealed whole (still a JSON object,
    of one key) when the object's agent encrypts all, its secrets sealed otherwise."""
    row = store.data_key(object_id)
    seal_all = row is not None and row.seal_all
    if not isinstance(goal, dict) or not (seal_all or has_secrets(goal)):
        return goal  # refused with the reason by ``Intent.refined``, or kept as it is
    sealer = Sealer(store, keys, object_id, seal_all=seal_all)
    return sealer.store_value(goal, what="goal of a refinement")[0]


def sealed_edit(store: Store, keys: DataKeys | None, object_id: str,
                edit: dict[str, Any]) -> Any:
    """A person's edit of a tool call's arguments as the approval event carries it:
    sealed whole under the object's data key when its agent encrypts all (the object
    refuses one in clear), as it is otherwise."""
    row = store.data_key(object_id)
    if row is None or not row.seal_all:
        return edit
    sealer = Sealer(store, keys, object_id, seal_all=True)
    return sealer.store_value(edit, what="edited arguments of a tool call")[0]


def opened_body(store: Store, keys: DataKeys | None, record: Record) -> dict[str, Any]:
    """``record``'s body with its sealed values opened (a copy only when it has any)."""
    if not marked(record.body_bytes):
        return dict(record.body)
    opened: dict[str, Any] = Sealer(store, keys, record.object_id).open(record.body)
    return opened


def _masked(value: Any) -> Any:
    if isinstance(value, Secret):
        return "Secret('***')"
    if isinstance(value, dict):
        return {key: _masked(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_masked(item) for item in value]
    return value


def _comparable(value: Any) -> Any:
    if isinstance(value, Secret):
        return {"perdure:secret": _comparable(value.reveal())}
    if isinstance(value, dict):
        return {key: _comparable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_comparable(item) for item in value]
    return value


def differences(store: Store, keys: DataKeys | None, object_id: str, first: Record, *,
                args: Sequence[Any], kwargs: Mapping[str, Any], labels: Mapping[str, str],
                max_failures: int | None, deadline: float | None) -> str | None:
    """``start_differences`` for a start whose arguments or memory hold secrets: compared
    by value (opened with the App's key), never quoted."""
    try:
        body = opened_body(store, keys, first)
    except DataKeyError:
        return (f"object {object_id!r} already exists and its arguments are sealed under a "
                "data key this node cannot open, so they were not compared")
    intent = dict(body.get("intent", {}))
    was = {"args": _comparable(intent.get("args", [])),
           "kwargs": _comparable(intent.get("kwargs", {}))}
    now = {"args": _comparable(list(args)), "kwargs": _comparable(dict(kwargs))}
    same_arguments = encode(was) == encode(now)
    intent["args"], intent["kwargs"] = _masked(intent.get("args", [])), _masked(
        intent.get("kwargs", {}))
    shown = {**body, "intent": intent}
    masked_args, masked_kwargs = _masked(list(args)), _masked(dict(kwargs))
    if not same_arguments and encode({"a": shown["intent"]["args"],
                                      "k": shown["intent"]["kwargs"]}) == encode(
            {"a": masked_args, "k": masked_kwargs}):
        # Only a secret's value differs: say so without quoting either.
        masked_args = [*masked_args, "(a secret differs)"]
    return start_differences(object_id, shown, args=masked_args, kwargs=masked_kwargs,
                             labels=labels, max_failures=max_failures, deadline=deadline)

