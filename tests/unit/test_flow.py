"""The pure queue rules (``perdure.core.flow``): declarations checked, and ``admit``."""

from __future__ import annotations

from typing import Any

import pytest

from perdure.core.flow import Candidate, Queue, QueueLoad, admit, check_priority, room
from perdure.errors import ConfigurationError


@pytest.mark.parametrize("limits", [
    {"concurrency": 0}, {"concurrency": -1}, {"concurrency": 1.5}, {"concurrency": True},
    {"concurrency": "5"}, {"per_key": 0}, {"worker_concurrency": -3},
    {"limiter": {"limit": 0, "period": 1}}, {"limiter": {"limit": 5, "period": 0}},
    {"limiter": {"limit": 5, "period": float("inf")}}, {"limiter": {"limit": 5}},
    {"limiter": {"limit": 5, "period": 1, "burst": 2}}, {"limiter": 5},
    {"rate_limit": 5}, {"priority": "yes"}, {"concurrency": 2**40},
])
def test_a_limit_that_makes_no_sense_is_refused(limits: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        Queue("q", **limits)


@pytest.mark.parametrize("name", ["", "a\nb", 5, "x" * 201])
def test_a_bad_queue_name_is_refused(name: Any) -> None:
    with pytest.raises(ConfigurationError):
        Queue(name)


def test_the_limiter_is_kept_as_rate_and_period() -> None:
    queue = Queue("q", limiter={"limit": 5, "period": 2})
    assert (queue.rate_limit, queue.rate_period) == (5, 2.0)
    assert queue == Queue("q", rate_limit=5, rate_period=2.0)
    assert queue.limits()["limiter"] == {"limit": 5, "period": 2.0}


def test_a_priority_needs_a_queue_that_takes_them() -> None:
    assert check_priority(Queue("q", priority=True), 3) == 3
    for bad in (-1, 2**31, 1.0, True, None):
        with pytest.raises(ConfigurationError):
            check_priority(Queue("q", priority=True), bad)
    with pytest.raises(ConfigurationError, match="priority=True"):
        check_priority(Queue("q"), 1)


def _ids(*names: str, key: str | None = None, fresh: bool = False) -> list[Candidate]:
    return [Candidate(name, key, fresh) for name in names]


def test_admit_fills_the_room_left_by_the_global_and_worker_caps() -> None:
    queue = Queue("q", concurrency=5, worker_concurrency=3)
    cands = _ids("a", "b", "c", "d")
    assert admit(queue, QueueLoad(held=3, mine=0), cands, 10) == ["a", "b"]
    assert admit(queue, QueueLoad(held=3, mine=2), cands, 10) == ["a"]
    assert admit(queue, QueueLoad(held=5, mine=0), cands, 10) == []
    assert admit(queue, QueueLoad(), cands, 2) == ["a", "b"]


def test_admit_caps_each_key_counting_what_is_held() -> None:
    queue = Queue("q", per_key=2)
    cands = [Candidate("a1", "a"), Candidate("a2", "a"), Candidate("b1", "b"),
             Candidate("b2", "b"), Candidate("b3", "b"), Candidate("n1"), Candidate("n2")]
    assert admit(queue, QueueLoad(held=1, by_key={"a": 1}), cands, 10) == [
        "a1", "b1", "b2", "n1", "n2"]
    assert room(queue, QueueLoad(held=2, by_key={"a": 2}), 10).full_keys == ("a",)


def test_admit_lets_the_limiter_hold_back_only_starts() -> None:
    queue = Queue("q", limiter={"limit": 3, "period": 60})
    cands = [Candidate("new1", fresh=True), Candidate("old1"), Candidate("new2", fresh=True),
             Candidate("old2")]
    assert admit(queue, QueueLoad(started=2), cands, 10) == ["new1", "old1", "old2"]
    assert admit(queue, QueueLoad(started=3), cands, 10) == ["old1", "old2"]
    assert not room(queue, QueueLoad(started=3), 10).fresh


def test_admit_takes_cancels_whatever_the_limits() -> None:
    queue = Queue("q", concurrency=1)
    cands = [Candidate("c", cancel=True), Candidate("a")]
    assert admit(queue, QueueLoad(held=1), cands, 10) == ["c"]
    assert admit(queue, QueueLoad(held=0), cands, 1) == ["c"]
