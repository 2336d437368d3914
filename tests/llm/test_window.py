"""The prompt view and compaction: pure, never an orphaned tool message, never the system
message dropped, nothing deleted from the conversation."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from perdure.llm import (
    Message,
    PromptView,
    Summary,
    ToolCall,
    plan_compaction,
    prompt_view,
)
from perdure.llm._window import units
from tests.llm.test_storage import CharCounter

COUNTER = CharCounter()


def _conversation(rng: random.Random, turns: int) -> list[Message]:
    """Leading system message(s), then turns: a user message, and assistant steps that
    are text or 1-3 parallel tool calls answered (in any order) by tool messages; now and
    then a stray tool message that answers nothing."""
    ids = iter(range(1_000_000))
    out = [Message.system("rules " * rng.randint(1, 30))]
    if rng.random() < 0.3:
        out.append(Message.system("more rules " * rng.randint(1, 10)))
    for _ in range(turns):
        out.append(Message.user("question " * rng.randint(1, 40)))
        for _ in range(rng.randint(0, 3)):
            calls = [ToolCall(f"c{next(ids)}", "tool", '{"q": 1}')
                     for _ in range(rng.randint(1, 3))]
            out.append(Message.assistant("thinking " * rng.randint(0, 5), calls))
            answered = calls if rng.random() < 0.9 else calls[:-1]
            for call in rng.sample(answered, len(answered)):
                out.append(Message.tool(call.id, "result " * rng.randint(1, 60)))
            if rng.random() < 0.05:
                out.append(Message.tool("stray", "answers nothing"))
        out.append(Message.assistant("answer " * rng.randint(1, 80)))
    return out


def _head(messages: Sequence[Message]) -> list[Message]:
    head = []
    for message in messages:
        if message.role != "system":
            break
        head.append(message)
    return head


def check_view(view: PromptView, conversation: Sequence[Message], *, window: int,
               reserve: int = 0, summary: Summary | None = None) -> None:
    """What every prompt view must be."""
    sent = list(view.messages)
    head = _head(conversation)
    assert sent[:len(head)] == head, "a leading system message was dropped"
    body = sent[len(head) + (1 if summary is not None else 0):]
    assert all(m.role != "system" or m in conversation[len(head):] for m in body)
    for i, message in enumerate(sent):  # every tool message follows its own call
        if message.role != "tool":
            continue
        j = i - 1
        while j >= 0 and sent[j].role == "tool":
            j -= 1
        assert j >= 0 and message.tool_call_id in {c.id for c in sent[j].tool_calls}, \
            f"orphaned tool message at {i}"
    answered_in_view = {m.tool_call_id for m in sent if m.role == "tool"}
    for k, message in enumerate(conversation):  # no call loses a result it has
        if message.tool_calls and message in sent:
            j = k + 1
            while j < len(conversation) and conversation[j].role == "tool":
                if conversation[j].tool_call_id in {c.id for c in message.tool_calls}:
                    assert conversation[j].tool_call_id in answered_in_view, "split pair"
                j += 1
    assert view.tokens == COUNTER.count_prompt(sent)
    if view.fits:
        assert view.tokens <= window - reserve
    last = units(conversation, max(len(head), summary.through if summary else 0))
    if last:
        a, b = last[-1]
        assert sent[-(b - a):] == list(conversation[a:b]), "the latest unit is missing"


def test_ten_thousand_random_cuts_never_orphan_a_tool_message() -> None:
    """Conversations cut at 10,000 random points, with random windows, reserves and
    summaries (some ending mid-unit), never give a prompt with an orphaned tool message,
    a split call/result pair, a dropped system message or a missing latest unit."""
    rng = random.Random(20260301)
    conversations = [_conversation(rng, rng.randint(5, 40)) for _ in range(40)]
    seen = {"dropped": 0, "mid_turn": 0, "too_large": 0, "summarised": 0}
    for _ in range(10_000):
        conversation = rng.choice(conversations)
        cut = conversation[:rng.randint(1, len(conversation))]
        window = rng.choice([50, 200, 800, 3000, 100_000])
        reserve = rng.choice([0, 0, 30])
        summary = None
        if rng.random() < 0.3 and len(cut) > 2:
            summary = Summary("earlier " * rng.randint(1, 20), rng.randint(0, len(cut)))
        view = prompt_view(cut, window=window, counter=COUNTER, reserve=reserve,
                           summary=summary)
        check_view(view, cut, window=window, reserve=reserve, summary=summary)
        begin = max(len(_head(cut)), summary.through if summary else 0)
        seen["dropped"] += view.start > begin
        seen["mid_turn"] += view.start < len(cut) and cut[view.start].role != "user"
        seen["too_large"] += not view.fits
        seen["summarised"] += view.summarised
    assert min(seen.values()) > 100, seen  # every kind of cut was exercised


def test_the_checker_catches_what_it_looks_for() -> None:
    """``check_view`` fails on a view with an orphaned tool message or a split pair."""
    call = ToolCall("c1", "t")
    conversation = [Message.system("s"), Message.user("u"), Message.assistant("", [call]),
                    Message.tool("c1", "r"), Message.assistant("done")]
    for kept, problem in (((0, 3, 4), "orphaned"), ((0, 2, 4), "split pair")):
        sent = tuple(conversation[i] for i in kept)
        view = PromptView(sent, kept[1], COUNTER.count_prompt(sent), True, False)
        with pytest.raises(AssertionError, match=problem):
            check_view(view, conversation, window=10_000)


def test_cuts_prefer_turn_boundaries() -> None:
    """When a whole turn fits, the kept part starts at a user message."""
    rng = random.Random(3)
    conversation = _conversation(rng, 30)
    view = prompt_view(conversation, window=2500, counter=COUNTER)
    assert view.fits
    assert conversation[view.start].role == "user"
    assert view.messages[len(_head(conversation))] == conversation[view.start]


def test_a_latest_unit_too_large_is_kept_and_flagged() -> None:
    """If even the latest unit does not fit, the view holds just it and says it does not
    fit (compaction cannot help; the engine decides)."""
    conversation = [Message.system("s"), Message.user("hi " * 5000)]
    view = prompt_view(conversation, window=100, counter=COUNTER)
    assert not view.fits and view.messages == tuple(conversation)


def test_an_empty_conversation_is_its_system_message() -> None:
    """Only system messages: the view is them, and fits if they do."""
    view = prompt_view([Message.system("s")], window=100, counter=COUNTER)
    assert view.fits and view.messages == (Message.system("s"),) and view.start == 1


def test_compaction_plan_and_summary() -> None:
    """A plan names unit-aligned messages to replace, its request is a transcript without
    tool pairs, and the summary it becomes puts a summary message in the view in place of
    those messages."""
    rng = random.Random(11)
    conversation = _conversation(rng, 40)
    window = 3000
    assert plan_compaction(conversation[:4], window=window, counter=COUNTER) is None
    plan = plan_compaction(conversation, window=window, counter=COUNTER)
    assert plan is not None and plan.previous is None
    starts = {a for a, _ in units(conversation)}
    assert plan.start in starts and plan.stop in starts and plan.start < plan.stop
    request = plan.request(conversation, "summariser")
    assert [m.role for m in request.messages] == ["system", "user"]
    assert "calls tool" in request.messages[1].text
    summary = plan.apply("They discussed invoices.")
    view = prompt_view(conversation, window=window, counter=COUNTER, summary=summary)
    check_view(view, conversation, window=window, summary=summary)
    assert view.summarised and view.start >= plan.stop
    assert view.messages[1] == summary.message()
    again = plan_compaction(conversation + _conversation(rng, 40)[1:], window=window,
                            counter=COUNTER, summary=summary)
    assert again is not None and again.previous == summary and again.start >= summary.through
    assert "They discussed invoices." in again.request(conversation, "m").messages[1].text


def test_a_failed_summary_changes_nothing() -> None:
    """The engine applies a plan only with the text a summary call returned. When the
    call fails, memory still holds every message, the summary in force stays, and the
    view keeps fitting by leaving older turns out."""
    rng = random.Random(5)
    conversation = _conversation(rng, 60)
    before = list(conversation)
    previous = Summary("what came first", units(conversation)[4][0])
    plan = plan_compaction(conversation, window=2000, counter=COUNTER, summary=previous)
    assert plan is not None
    # ... the summary call fails: no plan.apply(...); nothing else to undo
    view = prompt_view(conversation, window=2000, counter=COUNTER, summary=previous)
    assert conversation == before
    assert view.fits and view.messages[len(_head(conversation))] == previous.message()
    check_view(view, conversation, window=2000, summary=previous)


@pytest.mark.parametrize("seed", range(5))
def test_compacting_as_the_conversation_grows(seed: int) -> None:
    """Growing a conversation and compacting whenever a plan says so keeps every view
    within the window and well formed."""
    rng = random.Random(seed)
    full = _conversation(rng, 80)
    summary: Summary | None = None
    window = 2500
    for end in range(2, len(full), 7):
        conversation = full[:end]
        plan = plan_compaction(conversation, window=window, counter=COUNTER, reserve=100,
                               summary=summary)
        if plan is not None and rng.random() < 0.8:  # a fifth of summary calls fail
            summary = plan.apply(f"summary through {plan.stop}")
        view = prompt_view(conversation, window=window, counter=COUNTER, reserve=100,
                           summary=summary)
        check_view(view, conversation, window=window, reserve=100, summary=summary)
