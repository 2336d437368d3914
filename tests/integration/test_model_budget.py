"""Budgets of model calls: reserved before a call, settled from memory, an exhausted one
making the object dormant (with the reason) until its intent is refined.

Real SDKs over real HTTP against the scripted server, on both stores.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path

import pytest

pytest.importorskip("openai")
pytest.importorskip("anthropic")

import perdure
from perdure.core.lifecycle import Status
from perdure.core.records import Kind
from perdure.errors import ConfigurationError, ObjectNotFoundError
from perdure.llm import Budget, Message, ModelParams, Price, PriceTable
from perdure.llm.scripted import ScriptedFailure, ScriptedReply, ScriptedServer
from tests.integration.test_model_ledger import _cli
from tests.llm.support import make_client

TIMEOUT = 20.0
PRICES = PriceTable({"gpt-4o": Price("2.50", "10.00"), "gpt-4o-mini": Price("0.15", "0.60")})


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    """A scripted model server on 127.0.0.1, stopped after the test."""
    with ScriptedServer() as running:
        yield running


def _thrice(app: perdure.App, server: ScriptedServer) -> None:
    """An agent making three calls, each writing at most 10 tokens."""

    @app.agent(name="thrice")
    async def thrice(run: perdure.Run) -> list[str]:
        client = make_client("chat", server)
        texts = []
        try:
            for n in range(3):
                reply = await run.model(client, model="gpt-4o", name=f"ask{n}",
                                        messages=[Message.user(f"turn {n}")],
                                        params=ModelParams(max_tokens=10))
                texts.append(reply.text)
        finally:
            await client.aclose()
        return texts


def _until(app: perdure.App, oid: str, status: Status) -> perdure.ObjectInfo:
    deadline = time.monotonic() + TIMEOUT
    while True:
        try:
            info = app.get(oid)
        except ObjectNotFoundError:  # not spawned yet
            time.sleep(0.02)
            continue
        if info.status is status or time.monotonic() > deadline:
            return info
        time.sleep(0.02)


def test_an_exhausted_budget_makes_the_object_dormant_until_refined(
        make_app: Callable[..., perdure.App], server: ScriptedServer, store_url: str,
        key_dir: Path) -> None:
    """Two calls fit a 235-token budget, the third's reservation does not: the object
    goes dormant, saying why (``App.get``, ``perdure show``), with a ``dormant`` record;
    a rate-limited attempt charges nothing and the replay after the refinement counts
    no call twice (the provider is not asked again)."""
    app = make_app(prices=PRICES)
    server.script(ScriptedFailure(429, retry_after_ms="50"),
                  *[ScriptedReply(text=t, input_tokens=100, output_tokens=10)
                    for t in "abc"])
    _thrice(app, server)
    handle = app.options(object_id="budget-1", budget=Budget(tokens=235)).start("thrice")
    with app.background_worker():
        info = _until(app, "budget-1", Status.DORMANT)
        for _ in range(100):  # the 429 makes it dormant for a moment first
            if info.note and "budget exhausted" in info.note:
                break
            time.sleep(0.05)
            info = app.get("budget-1")
        assert info.status is Status.DORMANT
        assert info.note is not None and info.note.startswith("budget exhausted")
        assert "ask2" in info.note
        assert len(server.requests) == 3  # the 429, then two calls
        assert app.usage("budget-1").total_tokens == 220
        dormant = [r for r in app.history("budget-1") if r.kind == Kind.DORMANT]
        assert dormant[-1].body["reason"] == "budget"
        assert dormant[-1].body["name"] == "ask2"
        shown = _cli(store_url, key_dir, "show", "budget-1")
        assert "budget exhausted" in shown
        app.refine("budget-1", budget={"tokens": 1000})
        assert handle.result(timeout=TIMEOUT) == ["a", "b", "c"]
    assert len(server.requests) == 4
    totals = app.usage("budget-1")
    assert (totals.calls, totals.total_tokens) == (3, 330)
    assert app.get("budget-1").note is None or "budget" not in (app.get("budget-1").note or "")


def test_a_client_over_budget_is_skipped_for_a_cheaper_one(
        make_app: Callable[..., perdure.App], server: ScriptedServer) -> None:
    """Under a cost budget the fallback list passes over the model whose reservation
    would go over it; the reply's record says which was skipped and why."""
    app = make_app(prices=PRICES)
    server.script(ScriptedReply(text="cheap", input_tokens=100, output_tokens=10))

    @app.agent(name="frugal")
    async def frugal(run: perdure.Run) -> str:
        client = make_client("chat", server)
        try:
            reply = await run.model([client, (client, "gpt-4o-mini")], model="gpt-4o",
                                    messages=[Message.user("hi")],
                                    params=ModelParams(max_tokens=1000))
        finally:
            await client.aclose()
        return reply.text

    # gpt-4o may cost about $0.01 (1000 output tokens at $10/M); gpt-4o-mini $0.0006
    handle = app.options(object_id="frugal-1", budget={"cost": "0.005"}).start("frugal")
    with app.background_worker():
        assert handle.result(timeout=TIMEOUT) == "cheap"
    [call] = [r for r in app.history("frugal-1") if r.kind == Kind.MODEL_CALL]
    assert call.body["client"] == 1
    [skip] = call.body["skipped"]
    assert skip["client"] == 0 and "budget exhausted" in skip["reason"]
    assert server.requests[0].body["model"] == "gpt-4o-mini"
    assert app.usage("frugal-1").cost <= Decimal("0.005")


def test_a_budget_is_checked_before_anything_is_stored(
        make_app: Callable[..., perdure.App]) -> None:
    """A negative or malformed budget is refused at start and at refine."""
    app = make_app()

    @app.agent(name="idle")
    async def idle(run: perdure.Run) -> None:
        return None

    with pytest.raises(ConfigurationError):
        app.options(object_id="idle-1", budget={"tokens": -1}).start("idle")
    with pytest.raises(ConfigurationError):
        app.options(object_id="idle-1", budget={"dollars": 3}).start("idle")
    app.options(object_id="idle-2").start("idle")
    with pytest.raises(ConfigurationError):
        app.refine("idle-2", budget={"cost": "lots"})


def test_a_lineage_budget_stops_a_child(
        make_app: Callable[..., perdure.App], server: ScriptedServer) -> None:
    """A root's lineage budget counts its descendants' recorded calls: the child's call
    that would pass it leaves the child dormant, naming the budget's owner; refining the
    root's budget wakes the child by itself (an empty refinement in its memory), and it
    goes on under the new budget."""
    app = make_app(prices=PRICES)
    server.script(*[ScriptedReply(text=t, input_tokens=100, output_tokens=10)
                    for t in "abc"])

    async def ask(run: perdure.Run, text: str) -> str:
        client = make_client("chat", server)
        try:
            reply = await run.model(client, model="gpt-4o", name=text,
                                    messages=[Message.user(text)],
                                    params=ModelParams(max_tokens=10))
        finally:
            await client.aclose()
        return reply.text

    @app.agent(name="kid")
    async def kid(run: perdure.Run) -> list[str]:
        return [await ask(run, "kid one"), await ask(run, "kid two")]

    @app.agent(name="root")
    async def root(run: perdure.Run) -> list[str]:
        first = await ask(run, "root")
        child = await run.options(object_id="root-1.kid").delegate("kid")
        [rest] = await run.join(child)
        return [first, *rest]

    handle = app.options(object_id="root-1", budget={"tokens": 235, "lineage": True}).start("root")
    with app.background_worker():
        info = _until(app, "root-1.kid", Status.DORMANT)
        for _ in range(100):
            if info.note and "budget exhausted" in info.note:
                break
            time.sleep(0.05)
            info = app.get("root-1.kid")
        assert info.note is not None and info.note.startswith("budget exhausted")
        assert "lineage budget of root-1" in info.note
        assert len(server.requests) == 2
        assert app.usage("root-1", lineage=True).total_tokens == 220
        app.refine("root-1", budget={"tokens": 1000, "lineage": True})
        assert handle.result(timeout=TIMEOUT) == ["a", "b", "c"]
    assert app.usage("root-1", lineage=True).total_tokens == 330
    woke = [r.body for r in app.history("root-1.kid") if r.kind == Kind.INTENT_REFINED]
    assert [w["changes"] for w in woke] == [{}]
    assert app.verify("root-1.kid").ok


def _note(app: perdure.App, oid: str) -> str:
    try:
        return app.get(oid).note or ""
    except ObjectNotFoundError:
        return ""


def test_refining_the_owner_wakes_only_the_descendants_its_budget_stopped(
        make_app: Callable[..., perdure.App], server: ScriptedServer) -> None:
    """A grandchild stopped by the root's lineage budget is woken by the root's
    refinement and finishes; a sibling stopped by its own budget is not woken (no
    refinement in its memory, still dormant) until its own budget is refined."""
    app = make_app(prices=PRICES)
    server.script(*[ScriptedReply(text=t, input_tokens=100, output_tokens=10)
                    for t in "abcdef"])

    async def ask(run: perdure.Run, text: str) -> str:
        client = make_client("chat", server)
        try:
            reply = await run.model(client, model="gpt-4o", name=text,
                                    messages=[Message.user(text)],
                                    params=ModelParams(max_tokens=10))
        finally:
            await client.aclose()
        return reply.text

    @app.agent(name="leaf")
    async def leaf(run: perdure.Run) -> str:
        return await ask(run, "leaf")

    @app.agent(name="middle")
    async def middle(run: perdure.Run) -> str:
        [got] = await run.join(await run.options(object_id="deep.mid.leaf").delegate("leaf"))
        return str(got)

    @app.agent(name="frugal")
    async def frugal(run: perdure.Run) -> str:
        await run.refine(budget={"tokens": 5})  # a budget of its own, not a lineage one
        return await ask(run, "frugal")

    @app.agent(name="top")
    async def top(run: perdure.Run) -> list[str]:
        first = await ask(run, "top")
        own = await run.options(object_id="deep.frugal").delegate("frugal")
        mid = await run.options(object_id="deep.mid").delegate("middle")
        return [first, *(await run.join(mid, own))]

    handle = app.options(object_id="deep", budget={"tokens": 115, "lineage": True}).start("top")
    with app.background_worker():
        for oid, mark in (("deep.mid.leaf", "lineage budget of deep"),
                          ("deep.frugal", "budget exhausted")):
            deadline = time.monotonic() + TIMEOUT
            while mark not in _note(app, oid):
                assert time.monotonic() < deadline, (oid, _note(app, oid))
                time.sleep(0.05)
        app.refine("deep", budget={"tokens": 10_000, "lineage": True})
        assert _until(app, "deep.mid.leaf", Status.COMPLETED)
        frugal_info = app.get("deep.frugal")
        assert frugal_info.status == Status.DORMANT
        assert not [r for r in app.history("deep.frugal")
                    if r.kind == Kind.INTENT_REFINED and "pos" not in r.body]
        app.refine("deep.frugal", budget={"tokens": 10_000})
        assert handle.result(timeout=TIMEOUT)[0] == "a"
    woke = [r.body for r in app.history("deep.mid.leaf") if r.kind == Kind.INTENT_REFINED]
    assert [w["changes"] for w in woke] == [{}]
    assert not [r for r in app.history("deep.mid") if r.kind == Kind.INTENT_REFINED]


@pytest.mark.parametrize("lineage", [False, True])
def test_calls_made_at_once_see_each_others_reservations(
        make_app: Callable[..., perdure.App], server: ScriptedServer, lineage: bool) -> None:
    """Two calls in ``run.gather`` branches under a budget that fits one reservation:
    one is sent, the other waits dormant on the budget (it is never overspent) until the
    budget is refined; the same under a lineage budget."""
    app = make_app(prices=PRICES)
    server.script(*[ScriptedReply(text=t, input_tokens=5, output_tokens=10, delay=0.3)
                    for t in "ab"])

    async def ask(run: perdure.Run, text: str) -> str:
        client = make_client("chat", server)
        try:
            reply = await run.model(client, model="gpt-4o", name=text,
                                    messages=[Message.user(text)],
                                    params=ModelParams(max_tokens=100))
        finally:
            await client.aclose()
        return reply.text

    @app.agent(name="pair")
    async def pair(run: perdure.Run) -> list[str]:
        return list(await run.gather(ask(run, "left"), ask(run, "right")))

    handle = app.options(object_id="pair-1", budget={"tokens": 150, "lineage": lineage}).start(
        "pair")
    with app.background_worker():
        info = _until(app, "pair-1", Status.DORMANT)
        for _ in range(100):
            if info.note and "budget exhausted" in info.note:
                break
            time.sleep(0.05)
            info = app.get("pair-1")
        assert info.note is not None and info.note.startswith("budget exhausted")
        assert len(server.requests) == 1
        app.refine("pair-1", budget={"tokens": 1000})
        # The server answers in the order requests arrive; which branch reserved first
        # (and so got "a") is the loop's to decide, not the budget's.
        assert sorted(handle.result(timeout=TIMEOUT)) == ["a", "b"]
    assert len(server.requests) == 2
