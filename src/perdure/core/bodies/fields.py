"""What every typed body builds on: the ``Body`` base and the ``BodyReader``.

``BodyReader`` takes each key of a stored body once, checks the value's type and hands
it back as it is (no value is coerced, copied or defaulted, so a body read and written
again gives the same canonical bytes); ``finish`` refuses any key left over. A problem
raises ``MalformedBodyError``, which ``perdure.core.bodies.decode`` turns into a
``RecordDecodeError`` naming the record. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar

from perdure.core.records import Kind, RecordDraft

__all__ = ["JSON", "Body", "BodyReader", "MalformedBodyError", "Position", "put"]

Position = int | str
"""A command's position: ``5`` on the agent's main line, ``"5.1.0"`` inside a gather."""

JSON = Any
"""A JSON value as memory holds it (a step's result, an event's payload, ...)."""

_SEALED = "perdure:sealed"  # perdure.core.sealing.SEALED (the one key of a sealed value)


def _is_sealed(value: object) -> bool:
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get(_SEALED), dict)


_BRANCH_POSITION = re.compile(r"[0-9]+(\.[0-9]+)+").fullmatch


class MalformedBodyError(Exception):
    """A body does not have the keys or value types its kind writes; ``problem`` says
    which. Internal: decoding reports it as ``RecordDecodeError``."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


class BodyReader:
    """One body (or one object inside it, named ``where``), read a key at a time."""

    __slots__ = ("_body", "_left", "_where")

    def __init__(self, body: Mapping[str, Any], where: str = "") -> None:
        self._body = body
        self._left = set(body)
        self._where = where

    def _name(self, key: str) -> str:
        return f"{self._where}.{key}" if self._where else key

    def _wrong(self, key: str, value: object, wanted: str) -> MalformedBodyError:
        return MalformedBodyError(f"{self._name(key)!r} is {_type_name(value)}, not {wanted}")

    def has(self, key: str) -> bool:
        """Whether the body holds ``key`` (at all: a key holding null counts)."""
        return key in self._body

    def value(self, key: str) -> JSON:
        """The value of ``key``, any JSON value; a missing key is refused."""
        try:
            value = self._body[key]
        except KeyError:
            raise MalformedBodyError(f"no {self._name(key)!r}") from None
        self._left.discard(key)
        return value

    def text(self, key: str) -> str:
        value = self.value(key)
        if type(value) is not str:
            raise self._wrong(key, value, "a string")
        return value

    def text_or_sealed(self, key: str) -> str | dict[str, Any]:
        """A string, or a sealed value in its place (``{"perdure:sealed": {...}}``: an
        agent that encrypts all keeps the text sealed; opened, it is the string)."""
        value = self.value(key)
        if type(value) is not str and not _is_sealed(value):
            raise self._wrong(key, value, "a string or a sealed value")
        return value  # type: ignore[no-any-return]

    def optional_text_or_sealed(self, key: str) -> str | dict[str, Any] | None:
        """``text_or_sealed``, or ``None`` when the key is absent."""
        return self.text_or_sealed(key) if key in self._body else None

    def nullable_text(self, key: str) -> str | None:
        """A string or null (the key must be there)."""
        value = self.value(key)
        if value is not None and type(value) is not str:
            raise self._wrong(key, value, "a string or null")
        return value

    def optional_text(self, key: str) -> str | None:
        """A string, or ``None`` when the key is absent (null is refused: absent and null
        would encode differently)."""
        return self.text(key) if key in self._body else None

    def integer(self, key: str) -> int:
        value = self.value(key)
        if type(value) is not int:
            raise self._wrong(key, value, "an integer")
        return value

    def nullable_integer(self, key: str) -> int | None:
        """An integer or null (the key must be there)."""
        value = self.value(key)
        if value is not None and type(value) is not int:
            raise self._wrong(key, value, "an integer or null")
        return value

    def optional_integer(self, key: str) -> int | None:
        """An integer, or ``None`` when the key is absent."""
        return self.integer(key) if key in self._body else None

    def number(self, key: str) -> float:
        """An integer or a float, kept as it is (``5`` and ``5.0`` encode differently)."""
        value = self.value(key)
        if type(value) is not int and type(value) is not float:
            raise self._wrong(key, value, "a number")
        return value

    def nullable_number(self, key: str) -> float | None:
        value = self.value(key)
        if value is not None and type(value) is not int and type(value) is not float:
            raise self._wrong(key, value, "a number or null")
        return value

    def optional_number(self, key: str) -> float | None:
        """A number, or ``None`` when the key is absent."""
        return self.number(key) if key in self._body else None

    def flag(self, key: str) -> bool:
        value = self.value(key)
        if type(value) is not bool:
            raise self._wrong(key, value, "a boolean")
        return value

    def position(self, key: str) -> Position:
        """A command position: an integer from 0, or a branch position like ``"5.1.0"``."""
        value = self.value(key)
        if type(value) is int and value >= 0:
            return value
        if type(value) is str and _BRANCH_POSITION(value):
            return value
        raise MalformedBodyError(
            f"{self._name(key)!r} is {value!r}, not a command position (0, 1, ... or "
            "a branch position like \"5.1.0\")")

    def optional_position(self, key: str) -> Position | None:
        """A command position, or ``None`` when the key is absent."""
        return self.position(key) if key in self._body else None

    def const_flag(self, key: str, expected: bool) -> bool:
        """``key`` must hold exactly the boolean ``expected`` (a key written only when
        true)."""
        value = self.value(key)
        if value is not expected:
            raise MalformedBodyError(f"{self._name(key)!r} is {value!r}, not {expected!r}")
        return bool(value)

    def const(self, key: str, expected: str) -> str:
        """``key`` must hold exactly ``expected``."""
        value = self.value(key)
        if value != expected or type(value) is not str:
            raise MalformedBodyError(f"{self._name(key)!r} is {value!r}, not {expected!r}")
        return expected

    def choice(self, key: str, options: tuple[str, ...]) -> str:
        """One of the strings in ``options``."""
        value = self.value(key)
        if type(value) is not str or value not in options:
            raise MalformedBodyError(
                f"{self._name(key)!r} is {value!r}, not one of {', '.join(options)}")
        return value

    def mapping(self, key: str) -> dict[str, Any]:
        """A JSON object."""
        value = self.value(key)
        if type(value) is not dict:
            raise self._wrong(key, value, "an object")
        return value

    def optional_mapping(self, key: str) -> dict[str, Any] | None:
        """A JSON object, or ``None`` when the key is absent."""
        return self.mapping(key) if key in self._body else None

    def array(self, key: str) -> list[Any]:
        """A JSON list."""
        value = self.value(key)
        if type(value) is not list:
            raise self._wrong(key, value, "a list")
        return value

    def texts(self, key: str) -> tuple[str, ...]:
        """A list of strings, as a tuple."""
        items = self.array(key)
        if not all(type(item) is str for item in items):
            raise MalformedBodyError(f"{self._name(key)!r} holds something other than strings")
        return tuple(items)

    def nested(self, key: str) -> BodyReader:
        """A reader of the JSON object under ``key`` (finish it too)."""
        return BodyReader(self.mapping(key), self._name(key))

    def finish(self) -> None:
        """Refuse keys nothing read: a body holds exactly what its kind writes."""
        if self._left:
            where = f" in {self._where!r}" if self._where else ""
            raise MalformedBodyError(
                f"unexpected key{'s' if len(self._left) > 1 else ''} "
                f"{', '.join(repr(k) for k in sorted(self._left))}{where}")


class Body:
    """What every typed body has: its ``kind``, ``encode()`` and ``draft()``."""

    __slots__ = ()
    kind: ClassVar[Kind]

    def encode(self) -> dict[str, Any]:
        """The body as the engine writes it: a dict of JSON values."""
        raise NotImplementedError

    def draft(self) -> RecordDraft:
        """A ``RecordDraft`` of this body, ready to be sealed and appended."""
        return RecordDraft(self.kind, self.encode())

    @classmethod
    def read(cls, fields: BodyReader) -> Body:
        """The body from a stored one (``decode_body`` then refuses what is left over)."""
        raise NotImplementedError


def put(body: dict[str, Any], key: str, value: object) -> None:
    """Write ``key`` unless ``value`` is ``None`` (a key the body leaves out)."""
    if value is not None:
        body[key] = value
