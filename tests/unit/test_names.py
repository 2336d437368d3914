"""The rules for names and ids: what is accepted, what is refused, and how it is shown."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perdure.core.names import (
    ID_MAX,
    LABEL_VALUE_MAX,
    NAME_MAX,
    check_labels,
    check_name,
    check_object_id,
    shown,
)
from perdure.errors import ConfigurationError
from tests.unit.builders import PROFILE


@pytest.mark.parametrize("good", ["demo-1", "a", "x" * ID_MAX, "Zoë.1/2:3@4", "持続-🦉",
                                  "parent.0.1", "a_b~c+d=e"])
def test_ids_that_are_accepted(good: str) -> None:
    """Letters of any script, digits, punctuation and emoji make an id, up to 200
    characters; the id comes back unchanged."""
    assert check_object_id(good) == good


@pytest.mark.parametrize(
    ("bad", "rule"),
    [
        ("", "is empty"),
        ("x" * (ID_MAX + 1), "is too long"),
        ("a b", "whitespace (U+0020 at position 1)"),
        ("a\tb", "control character (U+0009 at position 1)"),
        ("a\u00a0b", "whitespace (U+00A0 at position 1)"),
        ("a\x00b", "control character (U+0000 at position 1)"),
        ("a\x7fb", "control character (U+007F at position 1)"),
        ("\x85", "control character (U+0085 at position 0)"),
        ("a\u202eb", "format character (U+202E at position 1)"),
        ("a\u200bb", "format character (U+200B at position 1)"),
        ("ab\ufeff", "format character (U+FEFF at position 2)"),
        ("a\u2028b", "line break (U+2028 at position 1)"),
        ("a\ud800b", "lone surrogate (U+D800 at position 1)"),
        ("\udcff", "lone surrogate (U+DCFF at position 0)"),
    ],
)
def test_ids_that_are_refused(bad: str, rule: str) -> None:
    """Each broken rule is a ConfigurationError naming the rule, where it is broken, and
    the rule to follow."""
    with pytest.raises(ConfigurationError) as caught:
        check_object_id(bad)
    message = str(caught.value)
    assert message.startswith("object id ")
    assert rule in message
    assert "use 1-200 characters without whitespace, control or format characters" in message


@pytest.mark.parametrize("bad", [None, 5, b"bytes", ["a"]])
def test_an_id_must_be_a_string(bad: object) -> None:
    """Anything but a str is refused with its type named."""
    with pytest.raises(ConfigurationError, match=f"must be a string, not {type(bad).__name__}"):
        check_object_id(bad)


def test_what_names_the_id() -> None:
    """``what`` says which id is wrong."""
    with pytest.raises(ConfigurationError, match=r"^node id 'a b' holds whitespace"):
        check_object_id("a b", "node id")


@pytest.mark.parametrize("good", ["approval", "approval granted", "👩\u200d💻", "a\u202eb",
                                  "x" * NAME_MAX, "with spaces and : punctuation!"])
def test_names_allow_spaces_and_format_characters(good: str) -> None:
    """A name may hold spaces and format characters (an emoji's zero-width joiner)."""
    assert check_name(good, "event name") == good


@pytest.mark.parametrize(
    ("bad", "rule"),
    [
        ("", "event name is empty"),
        ("x" * (NAME_MAX + 1), "is too long"),
        ("a\nb", "control character (U+000A at position 1)"),
        ("\x00", "control character (U+0000 at position 0)"),
        ("\x1b[31m", "control character (U+001B at position 0)"),
        ("a\u2029", "line break (U+2029 at position 1)"),
        ("a\ud800", "lone surrogate (U+D800 at position 1)"),
    ],
)
def test_names_that_are_refused(bad: str, rule: str) -> None:
    """Names follow the same rules as ids, apart from spaces and format characters."""
    with pytest.raises(ConfigurationError) as caught:
        check_name(bad, "event name")
    assert rule in str(caught.value)
    assert "use 1-200 characters without control characters" in str(caught.value)


def test_max_length_is_the_callers() -> None:
    """A longer limit (a label value) is honoured and named in the message."""
    assert check_name("v" * LABEL_VALUE_MAX, "label value", max_length=LABEL_VALUE_MAX)
    with pytest.raises(ConfigurationError, match="use 1-1000 characters"):
        check_name("v" * (LABEL_VALUE_MAX + 1), "label value", max_length=LABEL_VALUE_MAX)


def test_labels() -> None:
    """Labels map names to names; None is no labels; anything else is refused."""
    assert check_labels(None) == {}
    assert check_labels({"team": "data science", "tier": "1"}) == {"team": "data science",
                                                                    "tier": "1"}
    with pytest.raises(ConfigurationError, match="labels must be a mapping"):
        check_labels([("team", "x")])
    with pytest.raises(ConfigurationError, match="label key must be a string, not int"):
        check_labels({1: "x"})
    with pytest.raises(ConfigurationError, match=r"label 'team' value '\\x00' holds a control"):
        check_labels({"team": "\x00"})
    with pytest.raises(ConfigurationError, match="label 'team' value must be a string"):
        check_labels({"team": 3})


def test_shown_escapes_and_shortens() -> None:
    """Values are shown as a repr (surrogates, controls and format characters escaped,
    nothing that could move a terminal's cursor) and cut short when long."""
    assert shown("a\ud800\x00\u202e") == r"'a\ud800\x00\u202e'"
    long = shown("y" * 5000)
    assert long.endswith("... (5000 characters)")
    assert len(long) < 100
    assert len(shown(list(range(1000)))) < 100


@PROFILE
@given(st.text(max_size=ID_MAX + 5))
def test_a_refused_message_is_printable_and_an_accepted_id_is_safe(text: str) -> None:
    """For any text: an accepted id is valid UTF-8 with no whitespace, control or format
    character; a refusal's message is one printable line."""
    try:
        check_object_id(text)
    except ConfigurationError as exc:
        message = str(exc)
        assert message.isprintable(), message
        message.encode("utf-8")
        return
    text.encode("utf-8")
    assert 1 <= len(text) <= ID_MAX
    for char in text:
        assert not char.isspace()
        assert unicodedata.category(char) not in ("Cc", "Cf", "Cs")
