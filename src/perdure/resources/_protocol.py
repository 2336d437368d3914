"""The restore-recipe protocol: how a live thing becomes a descriptor and comes back.

A ``Resource`` subclass is a *recipe*. An instance carries what the agent asked for
(a path, a command, a URL); the class knows how to bring the live thing back from a
descriptor alone, on any node:

- ``open()`` makes the live thing the first time; ``describe(live)`` says what memory keeps
  of it (a JSON object: the descriptor, never a socket or a handle);
- ``restore(descriptor)`` brings it back on reentry; ``validate(descriptor, live)``
  says whether it still matches the world (``Fresh`` or ``Stale(reason)``);
- ``recapture(descriptor, live)`` is the descriptor as of now (a file's position, a new
  git HEAD): ``run.checkpoint_resources()`` and a refresh record it;
- ``close(live)`` lets it go.

A descriptor carries its recipe's ``version``: code that meets a version it does not
list in ``versions`` parks the object instead of guessing. Staleness checks
(``perdure.resources.checks``) may ride along in ``checks``: each notes what it saw in
the descriptor and compares on restore.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from perdure.errors import CannotRestoreError, ConfigurationError

__all__ = [
    "ON_STALE",
    "Fresh",
    "Invalidate",
    "Resource",
    "Stale",
    "Validity",
    "policy_text",
    "recipe_for",
    "type_name",
]

T = TypeVar("T")

ON_STALE = ("refresh", "park", "fail")
"""What a stale resource leads to, besides ``Invalidate(step)``."""


@dataclass(frozen=True, slots=True)
class Fresh:
    """The live thing matches its descriptor."""

    @property
    def stale(self) -> bool:
        """False."""
        return False


@dataclass(frozen=True, slots=True)
class Stale:
    """The live thing no longer matches its descriptor, for ``reason``."""

    reason: str

    @property
    def stale(self) -> bool:
        """True."""
        return True


Validity = Fresh | Stale


@dataclass(frozen=True, slots=True)
class Invalidate:
    """Stale policy: run the recorded commands again from the first step named ``step``
    on (memory keeps the old records, marked by an ``invalidated`` record)."""

    step: str


def policy_text(policy: str | Invalidate) -> str:
    """The ``on_stale`` policy as memory keeps it (``invalidate:<step>`` for one)."""
    if isinstance(policy, Invalidate):
        if not policy.step:
            raise ConfigurationError("Invalidate(step) needs the name of a step")
        return f"invalidate:{policy.step}"
    if policy not in ON_STALE:
        raise ConfigurationError(
            f"on_stale must be one of {', '.join(ON_STALE)} or Invalidate(step), not "
            f"{policy!r}")
    return policy


class Resource(Generic[T]):
    """A restore recipe for a live thing of type ``T``; subclass it for your own.

    Subclasses set ``versions`` (descriptor versions ``restore`` understands; the last
    is written) and implement ``open``, ``describe``, ``restore`` and ``close``;
    ``validate`` and ``recapture`` have defaults that run the declared checks.
    A recipe class must be importable by its module and name on every node that
    restores it (``type_name``); a node without it records that it cannot restore.
    """

    versions: ClassVar[tuple[int, ...]] = (1,)

    def __init__(self, *, on_stale: str | Invalidate = "refresh",
                 checks: Sequence[Any] = ()) -> None:
        self.on_stale = policy_text(on_stale)
        self.checks = tuple(checks)

    @property
    def version(self) -> int:
        """The descriptor version this code writes."""
        return self.versions[-1]

    async def open(self) -> T:
        """Make the live thing for the first time."""
        raise NotImplementedError

    def describe(self, live: T) -> dict[str, Any]:
        """The descriptor of ``live``: JSON values only, everything ``restore`` needs."""
        raise NotImplementedError

    @classmethod
    async def restore(cls, descriptor: dict[str, Any]) -> T:
        """Bring the live thing back from ``descriptor`` (raise ``CannotRestoreError``
        when this node cannot, any other exception when it failed)."""
        raise NotImplementedError

    @classmethod
    async def validate(cls, descriptor: dict[str, Any], live: T) -> Validity:
        """Whether ``live`` still matches ``descriptor``: by default, its checks."""
        from perdure.resources.checks import run_checks

        return await run_checks(descriptor, live)

    @classmethod
    async def recapture(cls, descriptor: dict[str, Any], live: T) -> dict[str, Any]:
        """The descriptor as of now: by default the same, with its checks seen again."""
        from perdure.resources.checks import see_checks

        return await see_checks(descriptor, live)

    @classmethod
    async def close(cls, live: T) -> None:
        """Let the live thing go (called once, also on rollback)."""


def type_name(cls: type[Resource[Any]]) -> str:
    """How memory names a recipe: ``module:QualifiedName``."""
    return f"{cls.__module__}:{cls.__qualname__}"


def recipe_for(name: str) -> type[Resource[Any]]:
    """The recipe class memory names ``module:Class``; ``CannotRestoreError`` when this
    node cannot import it (its code is not deployed here)."""
    module_name, _, qual = name.partition(":")
    if not module_name or not qual:
        raise CannotRestoreError(f"resource type {name!r} is not module:Class")
    try:
        target: Any = importlib.import_module(module_name)
        for part in qual.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise CannotRestoreError(
            f"this node has no recipe {name!r} ({type(exc).__name__}: {exc})") from None
    if not (isinstance(target, type) and issubclass(target, Resource)):
        raise CannotRestoreError(f"{name!r} is not a perdure.resources.Resource")
    return target
