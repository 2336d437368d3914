"""``Secret``: a value that memory keeps encrypted and nothing prints.

Wrap a credential (an API key, a password, a token) in ``Secret`` before it goes into
an agent's arguments, a step's result, an event or a progress note::

    app.start(deploy, Secret(os.environ["API_KEY"]))

    async def deploy(run, key: Secret) -> None:
        await run.step(call_api, key)          # the step gets the Secret; .reveal() it

Memory then holds it sealed with AES-GCM under the object's data key (see
``perdure.core.sealing``); replay hands the agent a ``Secret`` again. ``repr`` and
``str`` never show the value, so a log line, an exception or ``perdure show`` that
prints one shows ``Secret('***')``. Pure: no I/O.
"""

from __future__ import annotations

import hmac
from typing import Any, Generic, TypeVar

from perdure.core.codec import MAX_DEPTH, encode
from perdure.errors import SerializationError

__all__ = ["Secret"]

T = TypeVar("T")

_SHOWN = "Secret('***')"


class Secret(Generic[T]):
    """A JSON value (usually a ``str``) kept encrypted at rest; ``reveal()`` gives it.

    Two secrets are equal when their values are (compared in constant time). A
    ``Secret`` is not JSON: code that tries to encode one without perdure's sealing
    (``json.dumps``) fails instead of writing the value out.
    """

    __slots__ = ("_value",)

    def __init__(self, value: T) -> None:
        if isinstance(value, Secret):
            value = value.reveal()
        # Checked now, where the caller can see the mistake (the message never holds it).
        try:
            encode(value, what="a Secret's value", max_depth=MAX_DEPTH)
        except SerializationError:  # its message could quote the value: say it anew
            raise SerializationError(
                "a Secret holds a JSON value (str, int, float, bool, None, or lists and "
                "dicts of them); convert it first") from None
        self._value = value

    def reveal(self) -> T:
        """The value itself: pass it to the one call that needs it, never to a log."""
        return self._value

    def __repr__(self) -> str:
        return _SHOWN

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return _SHOWN

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        return hmac.compare_digest(encode(self._value), encode(other._value))

    def __hash__(self) -> int:
        return hash(encode(self._value))

    def __reduce__(self) -> Any:  # a pickled Secret would carry the value in the clear
        raise TypeError("a Secret cannot be pickled; pass it to a step, which keeps it sealed")
