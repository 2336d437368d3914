"""Tools: the JSON schema from a signature and docstring (or a pydantic model), options
checked when the tool is made."""

from __future__ import annotations

from typing import Literal

import pytest

import perdure
from perdure.errors import ConfigurationError


def test_schema_from_signature_and_docstring() -> None:
    def search(query: str, limit: int = 5, mode: Literal["fast", "deep"] = "fast",
               tags: list[str] | None = None, idempotency_key: str = "") -> list[str]:
        """Search the index.

        Args:
            query: what to look for
            limit: how many hits at most
        """
        return []

    tool = perdure.tool(search, risk="medium")
    assert tool.description == "Search the index."
    assert tool.schema == {
        "type": "object", "additionalProperties": False, "required": ["query"],
        "properties": {
            "query": {"type": "string", "description": "what to look for"},
            "limit": {"type": "integer", "description": "how many hits at most"},
            "mode": {"enum": ["fast", "deep"]},
            "tags": {"type": "array", "items": {"type": "string"}},
        }}
    assert tool.arguments({"query": "x"}, "k1") == {"query": "x", "idempotency_key": "k1"}
    assert tool.info.risk == "medium" and tool("q") == []


pydantic = pytest.importorskip("pydantic")


class Mail(pydantic.BaseModel):  # type: ignore[misc]
    """A mail (a tool's one argument, as a pydantic model)."""

    to: str
    body: str = ""


def send(mail: Mail) -> str:
    """Send mail."""
    return mail.to


def test_schema_from_a_pydantic_model() -> None:
    tool = perdure.tool(send)
    assert tool.schema["properties"]["to"]["type"] == "string"
    kwargs = tool.arguments({"to": "bob"}, "k")
    assert isinstance(kwargs["mail"], Mail) and send(**kwargs) == "bob"


@pytest.mark.parametrize("options, problem", [
    ({"risk": "extreme"}, "risk must be one of"),
    ({"name": "has space"}, "tool name"),
    ({"constraints": [perdure.PathPrefix("nope", ("/",))]}, "does not take"),
    ({"constraints": ["x"]}, "is not a constraint"),
])
def test_bad_options_are_refused(options: dict[str, object], problem: str) -> None:
    def fn(path: str) -> None:
        """Do."""

    with pytest.raises(ConfigurationError, match=problem):
        perdure.tool(fn, **options)


def test_unsupported_parameters_are_refused() -> None:
    def star(*args: str) -> None: ...

    with pytest.raises(ConfigurationError, match="plain or keyword"):
        perdure.tool(star)

    def odd(x: complex) -> None: ...

    with pytest.raises(ConfigurationError, match="no JSON schema"):
        perdure.tool(odd)


def test_app_tool_registers() -> None:
    app = perdure.App(store="sqlite:///never-opened.db")

    @app.tool(risk="high", idempotent=False)
    def wipe(path: str) -> None:
        """Wipe."""

    assert app.tools["wipe"] is wipe and wipe.info.idempotent is False
    assert wipe.to_json()["parameters"]["required"] == ["path"]


def test_a_tool_name_is_registered_once() -> None:
    app = perdure.App(store="sqlite:///never-opened.db")

    @app.tool
    def probe(x: int) -> int:
        """One."""
        return x

    app.tool(probe)  # the same tool again: fine

    def other(x: int) -> int:
        """Two."""
        return x

    with pytest.raises(ConfigurationError, match="is taken"):
        app.tool(name="probe")(other)
