"""The one way execution-state payloads (resource descriptors, progress markers) become
what memory holds: through the canonical encoder every recorded value takes (a step's
result included), and back, so the value the agent keeps is the value memory holds.

Anything that changes how recorded values are stored (encryption of payloads at rest)
applies here to descriptors and markers alike.
"""

from __future__ import annotations

from typing import Any

from perdure.core.codec import decode, encode
from perdure.core.sealing import canonical_with_secrets, has_secrets
from perdure.errors import SerializationError

__all__ = ["recorded_payload"]


def recorded_payload(value: Any, *, what: str) -> Any:
    """``value`` as memory holds it; ``SerializationError`` naming ``what`` if it is not
    a JSON value. ``perdure.Secret`` values stay ``Secret`` objects: the body that
    memory keeps seals them (``Run._stored``) when the record is written."""
    try:
        return decode(encode(value, what=what))
    except SerializationError:
        if not has_secrets(value):
            raise
    return canonical_with_secrets(value, what=what)
