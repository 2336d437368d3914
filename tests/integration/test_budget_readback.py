"""An object started and refined with a budget reads back everywhere: ``perdure show``
(text and JSON), ``perdure fork --at``, queries from the API and the CLI, the fork run to
its end. Both stores; the CLI in real processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import perdure
from tests.integration.engine_support import REPO_ROOT, wait_until

TIMEOUT = 20.0

app = perdure.App(store="sqlite:///never-opened.db")


@app.agent(name="budgeted")
async def budgeted(run: perdure.Run) -> dict[str, Any]:
    """Waits for ``go``, refines its own budget, then reads it back."""
    await run.wait_for("go")
    await run.refine(budget={"tokens": 300, "cost": "0.25"})
    seen = await run.step(lambda: run.intent.budget, name="seen")
    return {"budget": seen}


@app.define_query(agent="budgeted")
def budget(view: perdure.MemoryView) -> Any:
    """The budget the object's intent holds now."""
    return view.intent.budget


def _cli(store_url: str, key_dir: Path, *args: str) -> str:
    """``perdure ARGS`` in a fresh process with this test's store and keys; its output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERDURE_")}
    env.update(PYTHONPATH=str(REPO_ROOT), COLUMNS="200")
    done = subprocess.run(
        [sys.executable, "-m", "perdure", "--store", store_url, "--key-dir", str(key_dir),
         "--app", f"{__name__}:app", *args],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done
    assert "cannot be decoded" not in done.stdout + done.stderr, done
    return done.stdout


def test_an_object_with_a_budget_is_shown_forked_and_queried(
        make_app: Callable[..., perdure.App], store_url: str, key_dir: Path) -> None:
    """Started with a lineage budget, refined from outside and by the agent: every
    reader reads each intent, and a fork at #2 runs to the same end."""
    client = make_app()
    client.agent(name="budgeted")(budgeted)
    client.define_query(agent="budgeted", name="budget")(budget)
    handle = client.options(object_id="b-1", budget={"tokens": 100, "lineage": True}).start(
        "budgeted")
    with client.background_worker():
        assert wait_until(lambda: client.get("b-1").status == "dormant", TIMEOUT)
        assert client.query("b-1", "budget") == {"tokens": 100, "cost": None,
                                                 "lineage": True}
        client.refine("b-1", budget={"cost": "1.5"})
        client.send("b-1", "go")
        assert handle.result(timeout=TIMEOUT) == {"budget": {"tokens": 300, "cost": "0.25"}}
    assert client.query("b-1", "budget") == {"tokens": 300, "cost": "0.25"}
    kinds = [r.kind for r in client.history("b-1")]
    assert kinds.count("intent_refined") == 2

    shown = _cli(store_url, key_dir, "show", "b-1")
    assert "intent v3" in shown and "instantiated" in shown
    as_json = json.loads(_cli(store_url, key_dir, "show", "b-1", "--json"))
    assert as_json["object"]["object_id"] == "b-1"
    assert as_json["records"][0]["body"]["intent"]["budget"] == {
        "tokens": 100, "cost": None, "lineage": True}
    assert json.loads(_cli(store_url, key_dir, "query", "b-1", "budget")) == {
        "tokens": 300, "cost": "0.25"}
    assert client.history("b-1")[1].kind == "dormant"  # the fork takes v1 and the wait
    forked = _cli(store_url, key_dir, "fork", "b-1", "--at", "2", "--id", "b-1-fork")
    assert "b-1-fork" in forked
    assert client.query("b-1-fork", "budget") == {"tokens": 100, "cost": None,
                                                  "lineage": True}
    with client.background_worker():
        client.refine("b-1-fork", budget={"tokens": 50})
        client.send("b-1-fork", "go")
        assert client.handle("b-1-fork").result(timeout=TIMEOUT) == {
            "budget": {"tokens": 300, "cost": "0.25"}}
    assert client.verify("b-1-fork").ok and client.verify("b-1").ok
