"""Start options never collide with an agent's own arguments.

``app.start`` and ``run.delegate`` pass every argument to the agent, whatever its name;
options go through ``app.options(...)`` and ``run.options(...)``. An agent with
parameters named like every option receives them; the options still do what they say;
a misspelt option is a ``TypeError`` and a bad value a ``ConfigurationError``, before
anything is stored. Both stores, a real worker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import perdure
from perdure.errors import ConfigurationError

TIMEOUT = 20.0


def _register(app: perdure.App) -> None:
    @app.agent(name="clash")
    async def clash(run: perdure.Run, goal: str, *, object_id: str, deadline: str,
                    labels: list[str], budget: int, max_failures: int, agent: str
                    ) -> dict[str, Any]:
        return {"goal": goal, "object_id": object_id, "deadline": deadline,
                "labels": labels, "budget": budget, "max_failures": max_failures,
                "agent": agent, "me": run.object_id}

    @app.agent(name="sync_clash")
    def sync_clash(run: perdure.SyncRun, object_id: str) -> dict[str, Any]:
        kid = run.options(object_id=f"{run.object_id}-kid").delegate(
            "clash", "child", object_id="kid's own", deadline="today", labels=[],
            budget=1, max_failures=0, agent="x")
        plain = run.delegate("clash", "plain", object_id="also", deadline="d",
                             labels=["l"], budget=2, max_failures=3, agent="y")
        return {"mine": object_id, "kid": kid.result(), "plain": plain.result()}

    @app.agent(name="parent")
    async def parent(run: perdure.Run) -> list[Any]:
        named = await run.options(object_id=f"{run.object_id}-named").delegate(
            "clash", "named", object_id="arg", deadline="d", labels=[], budget=0,
            max_failures=1, agent="z")
        positional = await run.delegate("clash", "pos", object_id="arg2", deadline="d2",
                                        labels=["a"], budget=5, max_failures=2, agent="w")
        return [await named, await positional]


AGENT_KWARGS = {"object_id": "the agent's", "deadline": "friday", "labels": ["a", "b"],
                "budget": 7, "max_failures": 9, "agent": "named agent"}


def test_an_agents_arguments_named_like_options_reach_it(
        make_app: Callable[..., perdure.App]) -> None:
    """``start`` passes every keyword to the agent; ``options`` sets the object's own
    id, deadline, failure budget, labels and budget."""
    app = make_app()
    _register(app)
    plain = app.start("clash", "ship", **AGENT_KWARGS)
    starter = app.options(object_id="c-1", deadline=3600, max_failures=4,
                          labels={"team": "a"}, budget={"tokens": 10})
    named = starter.start("clash", "ship", **AGENT_KWARGS)
    assert named.object_id == "c-1" and plain.object_id != "c-1"
    with app.background_worker():
        assert plain.result(timeout=TIMEOUT) == {**AGENT_KWARGS, "goal": "ship",
                                                 "me": plain.object_id}
        assert named.result(timeout=TIMEOUT) == {**AGENT_KWARGS, "goal": "ship",
                                                 "me": "c-1"}
    first = app.history("c-1")[0].body
    intent, context = first["intent"], first["context"]
    assert intent["kwargs"] == AGENT_KWARGS
    assert intent["max_failures"] == 4 and intent["deadline"] is not None
    assert intent["budget"] == {"tokens": 10, "cost": None}
    assert context["labels"] == {"team": "a"}
    plain_intent = app.history(plain.object_id)[0].body["intent"]
    assert plain_intent["deadline"] is None and "budget" not in plain_intent
    # the same starter again: idempotent on its id
    again = starter.start("clash", "ship", **AGENT_KWARGS)
    assert not again.created and again.differs is None


def test_delegated_children_get_their_arguments_and_their_ids(
        make_app: Callable[..., perdure.App]) -> None:
    """``run.delegate`` passes every keyword to the child; ``run.options(object_id=...)``
    names it; the same for plain ``def`` agents."""
    app = make_app()
    _register(app)
    handle = app.options(object_id="p-1").start("parent")
    sync = app.options(object_id="s-1").start("sync_clash", object_id="kwarg")
    with app.background_worker():
        named, positional = handle.result(timeout=TIMEOUT)
        done = sync.result(timeout=TIMEOUT)
    assert named["me"] == "p-1-named" and named["object_id"] == "arg"
    assert positional["me"].startswith("p-1.") and positional["object_id"] == "arg2"
    assert (positional["deadline"], positional["agent"]) == ("d2", "w")
    assert done["mine"] == "kwarg"
    assert done["kid"]["me"] == "s-1-kid" and done["kid"]["object_id"] == "kid's own"
    assert done["plain"]["me"].startswith("s-1.") and done["plain"]["object_id"] == "also"


def test_a_wrong_option_is_refused_before_anything_is_stored(
        make_app: Callable[..., perdure.App]) -> None:
    """A misspelt option is a ``TypeError`` naming it; a bad value a
    ``ConfigurationError``; the store holds nothing."""
    app = make_app()
    _register(app)
    with pytest.raises(TypeError, match="objectid"):
        app.options(objectid="x")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="positional"):
        app.options("x")  # type: ignore[misc]
    for bad, says in (({"object_id": ""}, "object id"),
                      ({"deadline": "friday"}, "deadline is a number of seconds"),
                      ({"max_failures": 1.5}, "max_failures is a whole number"),
                      ({"labels": ["a"]}, "labels must be a mapping"),
                      ({"budget": {"tokens": -1}}, "tokens must be a whole number")):
        with pytest.raises(ConfigurationError, match=says):
            app.options(**bad)
    with pytest.raises(ConfigurationError, match="agent 'clash' takes"):
        app.start("clash", "ship", deadline="friday")  # the others are missing
    assert app.list() == []
    with pytest.raises(TypeError, match="deadline"):
        perdure.Run.options(None, deadline=3)  # type: ignore[arg-type,call-arg]
