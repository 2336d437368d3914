"""Readers open what they may: values the public API reads back (a follower's emitted
data, a query's step results, emitted values and received events, a fork's copied
values) come back as ``Secret`` for a caller holding the App's data keys; what it
cannot open stays sealed; the CLI keeps printing ``<sealed>``.
Both stores, a real worker."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import perdure
from perdure import DataKeys, Secret
from perdure.cli import cli
from perdure.core.sealing import SEALED
from perdure.errors import SealBrokenError
from tests.integration.test_secrets import RawSQL, raw

__all__ = ["raw"]

MakeApp = Callable[..., perdure.App]
CANARY = "sk-reader-93ab71c0e5d2"


def mint(key: Secret[str]) -> Secret[str]:
    return Secret(f"{key.reveal()}-minted")


def register(app: perdure.App) -> perdure.App:
    @app.agent(name="holder")
    async def holder(run: perdure.Run, key: Secret[str]) -> str:
        minted = await run.step(mint, key)
        await run.emit("token", {"minted": minted, "plain": "visible"})
        answer = await run.wait_for("reply")
        again = await run.step(mint, answer["key"], name="again")
        return "same" if again == Secret(f"{CANARY}-minted") else "differs"

    @app.agent(name="whole", encrypt=True)
    async def whole(run: perdure.Run, text: str) -> str:
        await run.emit("said", f"said {text}")
        return await run.step(lambda t: t.upper(), text, name="upper")

    @app.define_query(agent="holder")
    def minted(view: perdure.MemoryView) -> dict[str, Any]:
        return {"step": view.step("mint"), "emitted": view.last_emitted("token"),
                "received": view.received("reply"), "intent": view.intent.args}

    @app.define_query(agent="whole")
    def said(view: perdure.MemoryView) -> list[Any]:
        return [*view.emitted("said"), view.step("upper")]

    return app


def _emitted(handle: perdure.Handle, **options: Any) -> list[Any]:
    return [e.data for e in handle.stream(**options) if e.kind == "emitted"]


def test_followers_and_queries_get_secrets_back(make_app: MakeApp, store_url: str,
                                                key_dir: Path) -> None:
    app = register(make_app())
    handle = app.options(object_id="reader-1").start("holder", Secret(CANARY))
    whole = app.options(object_id="reader-2").start("whole", "quiet words")
    with app.background_worker():
        perdure_wait(app, "reader-1")
        app.send("reader-1", "reply", {"key": Secret(CANARY)})
        assert handle.result(timeout=15) == "same"
        assert whole.result(timeout=15) == "QUIET WORDS"

    # A follower holding the App's data keys gets the Secret (and the plain field).
    [data] = _emitted(handle)
    assert data == {"minted": Secret(f"{CANARY}-minted"), "plain": "visible"}
    assert isinstance(data["minted"], Secret)
    [raw_data] = _emitted(handle, opened=False)  # as the store holds it
    assert set(raw_data["minted"]) == {SEALED} and raw_data["plain"] == "visible"
    assert _emitted(whole) == ["said quiet words"]  # an encrypt-all agent's whole value

    async def collect() -> list[Any]:
        return [e.data async for e in handle.astream() if e.kind == "emitted"]

    assert asyncio.run(collect()) == [data]

    # Queries see opened values.
    answer = app.query("reader-1", "minted")
    assert answer == {"step": Secret(f"{CANARY}-minted"),
                      "emitted": {"minted": Secret(f"{CANARY}-minted"), "plain": "visible"},
                      "received": [{"key": Secret(CANARY)}], "intent": (Secret(CANARY),)}
    assert app.query("reader-2", "said") == ["said quiet words", "QUIET WORDS"]

    # An App without this key-encryption key reads everything else, the rest sealed.
    stranger = register(make_app(data_keys=DataKeys([b"\x07" * 32])))
    [kept] = _emitted(stranger.handle("reader-1"))
    assert set(kept["minted"]) == {SEALED} and kept["plain"] == "visible"
    assert set(stranger.query("reader-1", "minted")["step"]) == {SEALED}

    # The CLI does not open: no canary, <sealed> where a value is.
    runner = CliRunner()
    base = ["--store", store_url, "--key-dir", str(key_dir)]
    for args in (["tail", "reader-1"], ["tail", "reader-1", "--json"],
                 ["tail", "reader-2", "--json"], ["show", "reader-1", "--json"],
                 ["--app", "tests.integration.test_opened_readers:cli_app", "query",
                  "reader-1", "minted"]):
        done = runner.invoke(cli, [*base, *args])
        assert done.exit_code == 0, (args, done.output)
        assert CANARY not in done.output, args
        assert "quiet words" not in done.output, args
    shown = runner.invoke(cli, [*base, "--app", "tests.integration.test_opened_readers:cli_app",
                                "query", "reader-1", "minted"]).output
    assert json.loads(shown)["step"] == "<sealed>"  # the CLI never opens


def perdure_wait(app: perdure.App, object_id: str) -> None:
    import time

    deadline = time.monotonic() + 15
    while str(app.get(object_id).status) != "dormant":
        assert time.monotonic() < deadline, app.get(object_id)
        time.sleep(0.02)


def test_a_fork_opens_the_originals_sealed_values(make_app: MakeApp) -> None:
    """The fork's copied records keep the original's ciphertext (sealed under the
    original's data key, ``of`` naming it): the fork's worker, its queries and its
    followers open them with the original's key, and what the fork seals afterwards is
    under its own."""
    app = register(make_app())
    handle = app.options(object_id="orig-s").start("holder", Secret(CANARY))
    with app.background_worker():
        perdure_wait(app, "orig-s")
    at = next(r.seq for r in app.history("orig-s") if r.kind == "emitted")
    fork = app.fork("orig-s", at=at, new_id="fork-s")
    copied = [r for r in app.history("fork-s") if r.kind == "step_done"]
    assert copied and copied[0].body["result"][SEALED]["of"] == "orig-s"
    with app.background_worker():
        perdure_wait(app, "fork-s")
        app.send("fork-s", "reply", {"key": Secret(CANARY)})
        app.send("orig-s", "reply", {"key": Secret("other")})
        assert fork.result(timeout=15) == "same"
        assert handle.result(timeout=15) == "differs"
    assert app.query("fork-s", "minted")["step"] == Secret(f"{CANARY}-minted")
    assert _emitted(fork)[0]["minted"] == Secret(f"{CANARY}-minted")
    later = [r for r in app.history("fork-s") if r.kind == "step_done"][-1]
    assert later.body["result"][SEALED]["of"] == "fork-s"
    assert app.verify("fork-s").ok


def test_a_changed_byte_is_an_integrity_failure_for_readers(make_app: MakeApp,
                                                            raw: RawSQL) -> None:
    app = register(make_app())
    handle = app.options(object_id="broken-1").start("holder", Secret(CANARY))
    with app.background_worker():
        perdure_wait(app, "broken-1")
    rec = next(r for r in app.history("broken-1") if r.kind == "emitted")
    sealed = rec.body["data"]["minted"][SEALED]["data"]
    changed = ("B" if sealed[5] != "B" else "C").join((sealed[:5], sealed[6:]))
    raw.execute("UPDATE records SET body = ? WHERE object_id = ? AND seq = ?",
                (rec.body_bytes.replace(sealed.encode(), changed.encode()), "broken-1",
                 rec.seq))
    with pytest.raises(SealBrokenError):
        _emitted(handle)


cli_app = register(perdure.App(store="sqlite:///never-opened.db", lease_seconds=2.0,
                               poll_interval=0.01))
