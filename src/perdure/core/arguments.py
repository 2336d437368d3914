"""An agent's arguments: checked against its signature, compared with a recorded start.

An agent function takes its run handle first and then the arguments given to
``start``. A call that could never bind (a missing or unexpected argument) would
otherwise be stored and fail on the first node that runs it; it is refused here.
A start under an id that is already taken is compared with what that object was
started with, so the caller hears when the object is not the one asked for.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from perdure.core.codec import encode
from perdure.errors import ConfigurationError

__all__ = ["agent_signature", "check_arguments", "start_differences"]

_RUN = object()  # stands in for the run handle the engine passes first


def _signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fn, eval_str=True)
    except Exception:  # noqa: BLE001 - an annotation that does not evaluate here
        try:
            return inspect.signature(fn)
        except (TypeError, ValueError):  # a callable without a signature to read
            return None


def agent_signature(fn: Callable[..., Any]) -> str:
    """``fn``'s signature as a person writes the call: without the run parameter."""
    signature = _signature(fn)
    if signature is None:
        return "(...)"
    params = list(signature.parameters.values())
    if params and params[0].kind in (inspect.Parameter.POSITIONAL_ONLY,
                                     inspect.Parameter.POSITIONAL_OR_KEYWORD):
        params = params[1:]
    return str(signature.replace(parameters=params,
                                 return_annotation=inspect.Signature.empty))


def check_arguments(fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any],
                    *, agent: str) -> None:
    """Raise ``ConfigurationError`` unless ``fn(run, *args, **kwargs)`` would bind.

    ``agent`` names the agent in the message, which also gives its signature (without
    the run parameter) and what is wrong. A function whose signature cannot be read is
    not checked.
    """
    signature = _signature(fn)
    if signature is None:
        return
    try:
        signature.bind(_RUN, *args, **kwargs)
    except TypeError as exc:
        raise ConfigurationError(
            f"agent {agent!r} takes {agent_signature(fn)}: {exc}; pass arguments that match"
        ) from None


def _json(value: Any) -> str:
    """``value`` for a one-line message: compact JSON, ASCII only, cut short when long."""
    text = json.dumps(value, ensure_ascii=True, sort_keys=True, separators=(",", ":"))
    return text if len(text) <= 100 else f"{text[:97]}..."


def start_differences(object_id: str, first: Mapping[str, Any], *, args: Sequence[Any],
                      kwargs: Mapping[str, Any], labels: Mapping[str, str],
                      max_failures: int | None, deadline: float | None) -> str | None:
    """One sentence saying how a start differs from the object's recorded one, or ``None``.

    ``first`` is the body of the object's ``instantiated`` record. Arguments, labels
    and the failure budget are compared as recorded; the deadline, recorded as a point
    in time while a start gives seconds from now, only as given or not.
    """
    intent, context = first.get("intent", {}), first.get("context", {})
    recorded: dict[str, dict[str, str]] = {}
    asked: dict[str, dict[str, str]] = {}
    was = {"args": intent.get("args", []), "kwargs": intent.get("kwargs", {})}
    now = {"args": list(args), "kwargs": dict(kwargs)}
    if encode(was) != encode(now):
        recorded["arguments"] = {key: _json(value) for key, value in was.items()}
        asked["arguments"] = {key: _json(value) for key, value in now.items()}
    if dict(context.get("labels", {})) != dict(labels):
        recorded["labels"] = {"labels": _json(context.get("labels", {}))}
        asked["labels"] = {"labels": _json(dict(labels))}
    if intent.get("max_failures") != max_failures:
        recorded["failure budget"] = {"max_failures": _json(intent.get("max_failures"))}
        asked["failure budget"] = {"max_failures": _json(max_failures)}
    if (intent.get("deadline") is None) != (deadline is None):
        recorded["deadline"] = {"deadline": "none" if intent.get("deadline") is None
                                else f"at {intent['deadline']:.0f}"}
        asked["deadline"] = {"deadline": "none" if deadline is None else f"in {deadline:g}s"}
    if not recorded:
        return None
    names = list(recorded)
    what = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"

    def fields(parts: dict[str, dict[str, str]]) -> str:
        return " ".join(f"{key}={text}" for part in parts.values() for key, text in part.items())

    return (f"object {object_id!r} already exists with other {what}: "
            f"recorded {fields(recorded)}, asked {fields(asked)}")
