"""Pure rules of watching and steering: which questions are pending, how a question is
shown, which records are fork points, which step timeouts are accepted."""

from __future__ import annotations

import datetime as dt

import pytest

from perdure.core.bodies import (
    Delegated,
    Dormant,
    EventReceived,
    StepDone,
    StepStarted,
    Terminated,
    WaitTimedOut,
)
from perdure.core.intent import Context
from perdure.core.questions import asking_note, forked_from, pending_questions, question_text
from perdure.engine.commands.step_timeout import check_timeout
from perdure.errors import ConfigurationError
from perdure.fork import fork_problem
from tests.unit.builders import chain, instantiated


def test_a_question_is_pending_until_answered_timed_out_or_ended() -> None:
    asked = Dormant.wait(0, "ok", None, "Go?", ("y", "n")).draft()
    plain = Dormant.wait(1, "other", None).draft()
    records = chain([asked, plain])
    question, waits = pending_questions(records, "demo")
    # a wait without a prompt is a question too: the event it waits for answers it
    assert (waits.event, waits.prompt, waits.choices) == ("other", None, None)
    assert (question.event, question.prompt, question.choices, question.seq,
            question.pos) == ("ok", "Go?", ("y", "n"), 2, 0)
    assert question.to_json()["choices"] == ["y", "n"]
    answered = chain([asked, EventReceived(0, "ok", 7, "y").draft()])
    assert pending_questions(answered) == []
    timed_out = chain([asked, WaitTimedOut(0, "ok").draft()])
    assert pending_questions(timed_out) == []
    ended = chain([asked, Terminated.cancelled("stop").draft()])
    assert pending_questions(ended) == []
    # Only choices, or a prompt that is JSON null with choices: still a question.
    only = chain([Dormant.wait("3.0.0", "pick", 5.0, None, (1, 2)).draft()])
    assert pending_questions(only)[0].timeout_at == 5.0


def test_a_question_is_shown_on_one_escaped_line() -> None:
    assert question_text("Ship?", ["yes", "no"]) == "'Ship?' [yes / no]"
    assert question_text({"b": 1, "a": "x"}, None) == '{"a": "x", "b": 1}'
    assert question_text(None, [1, None]) == "a question [1 / null]"
    hostile = question_text("a\x1b[31mred\nline", ["\x07bell"])
    assert "\x1b" not in hostile and "\n" not in hostile and "\x07" not in hostile
    assert len(question_text("x" * 10_000, ["c" * 500] * 10)) < 600
    assert asking_note("ok", "Go?", None) == "asking 'Go?' (answer: event 'ok')"


def test_forked_from_reads_the_first_record() -> None:
    origin = {"object_id": "a", "seq": 3, "hash": "f" * 64}
    ctx = Context(object_id="b", trace_id="t", forked_from=origin)
    assert forked_from(chain([], first=instantiated(context=ctx))) == origin
    assert forked_from(chain([])) is None
    assert "forked_from" not in Context(object_id="b", trace_id="t").to_body()


def test_fork_points() -> None:
    started = StepStarted(1, "pay", 1, "k").draft()
    records = chain([StepDone(0, "a", 1, 0.1, 1).draft(), started,
                     StepDone(1, "pay", 1, 0.1, 2).draft(),
                     StepDone("2.0.0", "l", 1, 0.1, 3).draft(),
                     StepDone("2.1.0", "r", 1, 0.1, 4).draft(),
                     Delegated(3, "kid", "c1", "1").draft(),
                     Terminated("completed", result=5).draft()])
    assert fork_problem(records, 1) is None
    assert fork_problem(records, 2) is None
    assert "fork at #2 or #4" in (fork_problem(records, 3) or "")
    assert fork_problem(records, 4) is None
    assert "inside the gather at position 2 (#5..#6)" in (fork_problem(records, 5) or "")
    assert fork_problem(records, 6) is None
    assert "signals only its own parent: fork before #7" in (fork_problem(records, 7) or "")
    assert "terminal record" in (fork_problem(records, 8) or "")


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "1", True, [1]])
def test_step_timeouts_must_be_positive_seconds(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="above 0"):
        check_timeout(bad, "s")


def test_step_timeouts_accepted() -> None:
    assert check_timeout(None, "s") is None
    assert check_timeout(2, "s") == 2.0
    assert check_timeout(dt.timedelta(milliseconds=250), "s") == 0.25


def test_fork_points_of_a_retried_step_and_a_dormant_gather() -> None:
    """A non-idempotent step that failed once and then ran again: between its first
    failure and its second start is a fork point. A gather that went dormant: its
    dormancy between branch records is inside it."""
    from perdure.core.bodies import StepFailed

    failed = StepFailed(0, "pay", 1, {"type": "x", "message": "m"}, "transient", 0.1,
                        None, False, 1.0).draft()
    records = chain([StepStarted(0, "pay", 1, "k").draft(), failed,
                     StepStarted(0, "pay", 2, "k").draft(),
                     StepDone(0, "pay", 2, 0.1, 1).draft()])
    assert fork_problem(records, 2) is not None  # between start 1 and failure 1
    assert fork_problem(records, 3) is None  # after the failure: it is retried
    assert "#3 or #5" in (fork_problem(records, 4) or "")
    gathered = chain([StepDone("1.0.0", "l", 1, 0.1, 1).draft(),
                      Dormant.gather(1, None, "go", []).draft(),
                      StepDone("1.1.0", "r", 1, 0.1, 2).draft()])
    assert "inside the gather at position 1 (#2..#4)" in (fork_problem(gathered, 3) or "")
    assert fork_problem(gathered, 4) is None
    assert fork_problem(gathered, 1) is None
