"""The ledger of model calls: usage and cost per call in memory, totals per object and
over a lineage (``App.usage``), and both in ``perdure show``.

Real SDKs over real HTTP against the scripted server, on both stores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path

import pytest

pytest.importorskip("openai")
pytest.importorskip("anthropic")

import perdure
from perdure.llm import Message, Price, PriceTable
from perdure.llm.scripted import ScriptedFailure, ScriptedReply, ScriptedServer
from tests.integration.engine_support import REPO_ROOT
from tests.llm.support import make_client

TIMEOUT = 20.0
PRICES = PriceTable({"gpt-4o": Price("2.50", "10.00", cached_input="1.25")})


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    """A scripted model server on 127.0.0.1, stopped after the test."""
    with ScriptedServer() as running:
        yield running


def family(app: perdure.App, server: ScriptedServer) -> None:
    """A parent making two calls (one rate limited once, one of an unpriced model) and a
    child making one, priced by the App's table (``make_app(prices=PRICES)``)."""

    async def ask(run: perdure.Run, model: str, text: str,
                  prices: PriceTable | None = PRICES) -> str:
        client = make_client("chat", server)
        try:
            reply = await run.model(client, model=model, messages=[Message.user(text)],
                                    prices=prices)
        finally:
            await client.aclose()
        return reply.text

    @app.agent(name="kid")
    async def kid(run: perdure.Run) -> str:
        return await ask(run, "gpt-4o", "kid", prices=None)  # the App's prices

    @app.agent(name="parent")
    async def parent(run: perdure.Run) -> list[str]:
        first = await ask(run, "gpt-4o", "one")
        second = await ask(run, "local-llama", "two")
        child = await run.options(object_id="parent-1.kid").delegate("kid")
        [third] = await run.join(child)
        return [first, second, third]


def test_usage_and_cost_per_object_and_over_the_lineage(
        make_app: Callable[..., perdure.App], server: ScriptedServer) -> None:
    """``App.usage`` totals what memory says each call used and cost; an unpriced call is
    counted apart, never guessed; ``lineage=True`` adds the descendants. A call without
    a price table of its own is priced by the App's."""
    app = make_app(prices=PRICES)
    server.script(ScriptedFailure(429, retry_after_ms="100"),
                  ScriptedReply(text="a", input_tokens=1000, output_tokens=100,
                                cached_tokens=800),
                  ScriptedReply(text="b", input_tokens=50, output_tokens=5),
                  ScriptedReply(text="c", input_tokens=200, output_tokens=20))
    family(app, server)
    handle = app.options(object_id="parent-1").start("parent")
    with app.background_worker():
        assert handle.result(timeout=TIMEOUT) == ["a", "b", "c"]
    own = app.usage("parent-1")
    assert (own.calls, own.failed_attempts, own.unpriced) == (2, 1, 1)
    assert (own.input_tokens, own.output_tokens, own.cached_input_tokens) == (1050, 105, 800)
    # 200 plain input at 2.50, 800 cached at 1.25, 100 output at 10.00, per million
    assert own.cost == Decimal("0.0025")
    kid = app.usage("parent-1.kid")
    assert (kid.calls, kid.cost) == (1, Decimal("0.0007"))
    whole = app.usage("parent-1", lineage=True)
    assert (whole.calls, whole.objects, whole.cost) == (3, 2, Decimal("0.0032"))
    assert whole.total_tokens == 1050 + 105 + 220


def test_perdure_show_prints_each_call_and_the_totals(
        make_app: Callable[..., perdure.App], server: ScriptedServer, store_url: str,
        key_dir: Path) -> None:
    """``perdure show`` has a line per model record and the object's totals;
    ``--json`` has the totals too."""
    app = make_app(prices=PRICES)
    server.script(ScriptedFailure(429, retry_after_ms="100"),
                  ScriptedReply(text="a", input_tokens=1000, output_tokens=100,
                                cached_tokens=800))
    family(app, server)
    handle = app.options(object_id="parent-1").start("parent")
    with app.background_worker():
        handle.result(timeout=TIMEOUT)
    shown = _cli(store_url, key_dir, "show", "parent-1")
    assert "model_call" in shown and "model_failed" in shown
    assert "HTTP 429 rate limited [rate_limited]" in shown
    assert "via openai.chat attempt 2" in shown
    assert "model calls: 2, 1 failed attempt(s)" in shown
    assert "cost $0.0025 (+ 1 call(s) not priced)" in shown
    document = json.loads(_cli(store_url, key_dir, "show", "parent-1", "--json"))
    assert document["usage"]["calls"] == 2
    assert Decimal(document["usage"]["cost"]) == Decimal("0.0025")


def _cli(url: str, key_dir: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERDURE_")}
    env.update(PYTHONPATH=str(REPO_ROOT), COLUMNS="200")
    done = subprocess.run([sys.executable, "-m", "perdure", "--store", url, "--key-dir",
                           str(key_dir), *args],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done
    return done.stdout
