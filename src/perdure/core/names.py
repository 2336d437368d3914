"""Names and ids: the rules every name or id that enters perdure must follow.

Object ids, node ids, agent names, event names, label keys and values and dedupe keys
are checked here, before any store is touched, so SQLite and PostgreSQL give the same
answer to the same input (PostgreSQL refuses a NUL in text that SQLite would keep;
neither can hold a lone surrogate).

Every name:

- is a ``str`` and not empty;
- holds no lone surrogate (it must be encodable as UTF-8);
- holds no control character (Unicode category Cc: NUL, tab, newline, escape, DEL, ...)
  and no line or paragraph separator (U+2028, U+2029);
- is at most ``NAME_MAX`` characters (``LABEL_VALUE_MAX`` for a label value).

An id (object id, node id) also holds no whitespace and no invisible format character
(category Cf, such as U+202E RIGHT-TO-LEFT OVERRIDE, which would make one id print as
another), and is at most ``ID_MAX`` characters.

A broken rule is a ``ConfigurationError`` naming the rule and showing the value with
anything unprintable escaped.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping

from perdure.errors import ConfigurationError

__all__ = [
    "ID_MAX",
    "LABEL_VALUE_MAX",
    "NAME_MAX",
    "check_labels",
    "check_name",
    "check_object_id",
    "shown",
]

ID_MAX = 200  # object ids and node ids
NAME_MAX = 200  # agent names and versions, event names, label keys, dedupe keys, capabilities
LABEL_VALUE_MAX = 1000

_SHOWN_MAX = 60  # characters of a value quoted in a message


def shown(value: object) -> str:
    """``value`` for an error message: its repr (which escapes lone surrogates, control
    and format characters), cut short when long."""
    if isinstance(value, str) and len(value) > _SHOWN_MAX:
        return f"{value[:_SHOWN_MAX]!r}... ({len(value)} characters)"
    text = repr(value)
    return text if len(text) <= _SHOWN_MAX + 2 else f"{text[:_SHOWN_MAX]}..."


def _fail(what: str, value: object, problem: str, rule: str) -> ConfigurationError:
    return ConfigurationError(f"{what} {shown(value)} {problem}; use {rule}")


def _where(text: str, index: int) -> str:
    return f"U+{ord(text[index]):04X} at position {index}"


def _check(value: object, what: str, max_length: int, *, is_id: bool) -> str:
    rule = (f"1-{max_length} characters without whitespace, control or format characters"
            if is_id else f"1-{max_length} characters without control characters")
    if not isinstance(value, str):
        raise ConfigurationError(
            f"{what} must be a string, not {type(value).__name__} ({shown(value)}); use {rule}"
        )
    if not value:
        raise ConfigurationError(f"{what} is empty; use {rule}")
    if len(value) > max_length:
        raise _fail(what, value, "is too long", rule)
    # The common case in one C-speed call: printable means no Cc, Cf or Cs character and
    # no whitespace but the ASCII space.
    if value.isprintable() and not (is_id and " " in value):
        return value
    for index, char in enumerate(value):
        category = unicodedata.category(char)
        if category == "Cs":
            raise _fail(what, value, f"holds a lone surrogate ({_where(value, index)}), which "
                        "is not valid Unicode text", rule)
        if category == "Cc":
            raise _fail(what, value, f"holds a control character ({_where(value, index)})",
                        rule)
        if category in ("Zl", "Zp"):
            raise _fail(what, value, f"holds a line break ({_where(value, index)})", rule)
        if is_id and char.isspace():
            raise _fail(what, value, f"holds whitespace ({_where(value, index)})", rule)
        if is_id and category == "Cf":
            raise _fail(what, value, f"holds an invisible format character "
                        f"({_where(value, index)})", rule)
    return value


def check_object_id(value: object, what: str = "object id") -> str:
    """Return ``value`` if it is a valid id, else raise ``ConfigurationError``.

    An id is a ``str`` of 1-``ID_MAX`` characters with no whitespace, no control
    character (Cc), no format character (Cf) and no lone surrogate. ``what`` names the
    id in the message (``"object id"``, ``"node id"``, ...).
    """
    return _check(value, what, ID_MAX, is_id=True)


def check_name(value: object, what: str, *, max_length: int = NAME_MAX) -> str:
    """Return ``value`` if it is a valid name, else raise ``ConfigurationError``.

    A name is a ``str`` of 1-``max_length`` characters (``NAME_MAX`` unless given) with
    no control character (Cc), no line or paragraph separator and no lone surrogate;
    spaces and format characters such as the zero-width joiner of an emoji are allowed.
    ``what`` names it in the message (``"event name"``, ``"label key"``, ...).
    """
    return _check(value, what, max_length, is_id=False)


def check_labels(labels: object) -> dict[str, str]:
    """Return ``labels`` as a dict if it maps names to names, else raise ``ConfigurationError``.

    ``None`` is no labels. Keys are names of up to ``NAME_MAX`` characters, values of
    up to ``LABEL_VALUE_MAX``.
    """
    if labels is None:
        return {}
    if not isinstance(labels, Mapping):
        raise ConfigurationError(
            f"labels must be a mapping of names to names, not {type(labels).__name__}"
        )
    for key, value in labels.items():
        check_name(key, "label key")
        check_name(value, f"label {shown(key)} value", max_length=LABEL_VALUE_MAX)
    return dict(labels)
