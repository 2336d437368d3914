"""Prompts: the question a waiting agent asks is recorded and visible to callers
(``ObjectInfo.asking``, ``App.questions``, ``perdure show``/``ls``); answering is
``App.send``. Real stores (SQLite and PostgreSQL), a real worker thread."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

import perdure
from perdure.cli import cli
from tests.integration.engine_support import wait_until
from tests.integration.steer_support import register


def _asking(app: perdure.App, object_id: str) -> tuple[perdure.Question, ...]:
    return app.get(object_id).asking


def test_a_waiting_agent_asks_and_is_answered(make_app: Callable[..., perdure.App]) -> None:
    app = register(make_app())
    handle = app.options(object_id="ask-1").start("asker", "Ship v2?")
    with app.background_worker():
        assert wait_until(lambda: bool(_asking(app, "ask-1")), timeout=10)
        [question] = app.get("ask-1").asking
        assert question.event == "approval"
        assert question.prompt == {"text": "Ship v2?", "risk": "low"}
        assert question.choices == ("yes", "no")
        assert question.agent == "asker" and question.object_id == "ask-1"
        assert question.timeout_at is None
        assert app.get("ask-1").prompt == {"text": "Ship v2?", "risk": "low"}
        assert app.get("ask-1").status is perdure.Status.DORMANT
        [listed] = [i for i in app.list() if i.object_id == "ask-1"]
        assert listed.asking == (question,)
        assert app.questions() == [question]
        assert app.questions(agent="other") == []
        handle.send("approval", "yes")
        assert wait_until(lambda: [q.event for q in _asking(app, "ask-1")] == ["comment"],
                          timeout=10)
        [second] = app.questions()
        assert second.prompt == "Anything to add?" and second.choices is None
        assert second.seq > question.seq
        app.send("ask-1", "comment", {"note": "fine"})
        assert handle.result(timeout=10) == ["yes", {"note": "fine"}]
    assert app.get("ask-1").asking == ()
    assert app.questions() == []
    assert app.verify("ask-1").ok


def test_questions_of_sync_agents_and_gather_branches(
        make_app: Callable[..., perdure.App]) -> None:
    app = register(make_app())
    app.options(object_id="sync-1").start("sync_asker")
    app.options(object_id="both-1").start("gather_asker")
    with app.background_worker():
        assert wait_until(lambda: len(app.questions()) == 3, timeout=10)
        by_object = {(q.object_id, q.event): q for q in app.questions()}
        assert by_object["sync-1", "go"].choices == (True, False)
        assert by_object["both-1", "left"].prompt == "value for left?"
        assert by_object["both-1", "right"].pos != by_object["both-1", "left"].pos
        app.send("both-1", "left", 1)
        assert wait_until(
            lambda: [q.event for q in _asking(app, "both-1")] == ["right"], timeout=10)
        app.send("both-1", "right", 2)
        app.send("sync-1", "go", True)
        assert app.handle("both-1").result(timeout=10) == [1, 2]
        assert app.handle("sync-1").result(timeout=10) is True
    assert app.questions() == []


def _second_question_is_asked(app: perdure.App, object_id: str) -> None:
    """``twice_asker`` answered once: the second question, on the same event, is what the
    object asks, claimed once for the answer and not again; a control event (a refinement)
    that wakes it does not make the question disappear either."""
    app.options(object_id=object_id).start("twice_asker")
    with app.background_worker():
        assert wait_until(lambda: [q.prompt for q in _asking(app, object_id)] == ["first?"],
                          timeout=10)
        epoch = app.store.get(object_id).epoch  # type: ignore[union-attr]
        app.send(object_id, "answer", "A")
        assert wait_until(lambda: [q.prompt for q in _asking(app, object_id)]
                          == ["second?"], timeout=10)
        row = app.store.get(object_id)
        assert row is not None and row.lease_owner is None
        # Dormant for the second answer: not runnable at once (the answer it took is no
        # longer pending), so nothing claims it again.
        assert (row.status, row.ready_at, row.epoch) == ("dormant", None, epoch + 1)
        assert [q.prompt for q in app.questions()] == ["second?"]
        app.refine(object_id, goal={"more": 1})
        assert wait_until(lambda: any(r.kind == "intent_refined"
                                      for r in app.history(object_id))
                          and app.store.get(object_id).lease_owner is None,  # type: ignore[union-attr]
                          timeout=10)
        assert [q.prompt for q in app.questions()] == ["second?"]
        assert [q.prompt for q in _asking(app, object_id)] == ["second?"]
        app.send(object_id, "answer", "B")
        assert app.handle(object_id).result(timeout=10) == ["A", "B"]
    assert app.questions() == []
    assert app.verify(object_id).ok


def test_a_second_question_on_the_same_event_is_asked(
        make_app: Callable[..., perdure.App]) -> None:
    _second_question_is_asked(register(make_app()), "twice-1")


def test_a_second_question_on_the_same_event_is_asked_in_memory(key_dir: Path) -> None:
    app = perdure.App(store="memory:", key_dir=key_dir, lease_seconds=2.0,
                      poll_interval=0.01)
    try:
        _second_question_is_asked(register(app), "twice-mem")
    finally:
        app.close()


def test_show_and_ls_say_what_the_agent_asks(make_app: Callable[..., perdure.App],
                                             store_url: str, key_dir: object) -> None:
    app = register(make_app())
    app.options(object_id="ask-cli").start("asker", "Deploy\x1b[31m now?")
    with app.background_worker():
        assert wait_until(lambda: bool(_asking(app, "ask-cli")), timeout=10)
    runner = CliRunner()
    base = ["--store", store_url, "--key-dir", str(key_dir)]
    shown = runner.invoke(cli, [*base, "show", "ask-cli"])
    assert shown.exit_code == 0, shown.output
    assert "asking" in shown.output and "answer: event 'approval'" in shown.output
    assert "yes / no" in shown.output
    assert "\x1b[31m" not in shown.output  # a prompt cannot drive the terminal
    listed = runner.invoke(cli, [*base, "ls"], env={"COLUMNS": "250"})
    assert "asking" in listed.output, listed.output
    as_json = runner.invoke(cli, [*base, "ls", "--json"])
    assert '"event": "approval"' in as_json.output
    inbox = runner.invoke(cli, [*base, "questions"])
    assert inbox.exit_code == 0 and "ask-cli" in inbox.output
    assert "perdure send ask-cli approval JSON" in inbox.output
    inbox_json = runner.invoke(cli, [*base, "questions", "--json"])
    assert '"choices": [' in inbox_json.output


@pytest.mark.parametrize(("prompt", "choices", "error"), [
    (object(), None, perdure.SerializationError),
    ("ok", "yes", perdure.ConfigurationError),
    ("ok", {"a": 1}, perdure.ConfigurationError),
    ("ok", [float("nan")], perdure.SerializationError),
])
def test_a_prompt_memory_cannot_hold_is_refused(make_app: Callable[..., perdure.App],
                                                prompt: object, choices: object,
                                                error: type[Exception]) -> None:
    app = make_app()

    @app.agent(name="bad_asker")
    async def bad_asker(run: perdure.Run) -> object:
        try:
            await run.wait_for("x", prompt=prompt, choices=choices)  # type: ignore[arg-type]
        except error as exc:
            return type(exc).__name__
        return "accepted"

    with app.background_worker():
        assert app.options(object_id="bad").start(bad_asker).result(timeout=10) == error.__name__
    assert app.verify("bad").ok


def test_a_question_asked_long_before_the_head_is_found(
        make_app: Callable[..., perdure.App]) -> None:
    """A gather branch asked, then another branch recorded more than the tail that is
    read first: the question is still found (from the whole memory)."""
    app = make_app()

    def inc(x: int) -> int:
        return x + 1

    @app.agent(name="busy_asker")
    async def busy_asker(run: perdure.Run) -> object:
        async def ask() -> object:
            return await run.wait_for("left", prompt="left?")

        async def work() -> object:
            await run.sleep(0.1)
            total = 0
            for _ in range(80):
                total = await run.step(inc, total)
            return total

        return await run.gather(ask(), work())

    handle = app.options(object_id="long-ask").start(busy_asker)
    with app.background_worker():
        assert wait_until(lambda: sum(r.kind == "step_done"
                                      for r in app.history("long-ask")) == 80, timeout=20)
        assert wait_until(lambda: handle.status() is perdure.Status.DORMANT, timeout=10)
        head = app.get("long-ask").records
        asked = next(r.seq for r in app.history("long-ask")
                     if r.kind == "dormant" and r.body.get("event") == "left")
        assert head - asked > 64
        [question] = app.get("long-ask").asking
        assert question.prompt == "left?" and question.seq == asked
        assert [q.object_id for q in app.questions()] == ["long-ask"]
        app.send("long-ask", "left", "L")
        assert handle.result(timeout=10) == ["L", 80]


def test_a_forged_question_is_not_shown(make_app: Callable[..., perdure.App],
                                        store_url: str) -> None:
    """Someone with write access to the store rewrites what an agent asks: the question
    no longer vouched for by a trusted signature is left out (``verify`` names it)."""
    app = register(make_app())
    app.options(object_id="forged-ask").start("asker", "Ship v3?")
    with app.background_worker():
        assert wait_until(lambda: bool(_asking(app, "forged-ask")), timeout=10)
    seq = app.get("forged-ask").asking[0].seq
    if store_url.startswith("sqlite"):
        import sqlite3
        conn = sqlite3.connect(store_url.removeprefix("sqlite:///"))
        conn.execute("UPDATE records SET body = CAST(replace(CAST(body AS TEXT), 'Ship v3?', "
                     "'Wire $9k?') AS BLOB) "
                     "WHERE object_id = 'forged-ask' AND seq = ?", (seq,))
        conn.commit()
        conn.close()
    else:
        import psycopg
        with psycopg.connect(store_url) as pg:
            pg.execute("UPDATE records SET body = convert_to(replace(convert_from(body, "
                       "'UTF8'), 'Ship v3?', 'Wire $9k?'), 'UTF8') "
                       "WHERE object_id = 'forged-ask' AND seq = %s", (seq,))
    assert "Wire" in str(app.history("forged-ask")[seq - 1].body)
    assert app.get("forged-ask").asking == ()
    assert app.questions() == []
    assert not app.verify("forged-ask").ok
