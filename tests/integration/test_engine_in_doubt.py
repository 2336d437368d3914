"""In-doubt steps: a non-idempotent step cut short by a crash is never silently run twice."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import perdure
from tests.integration.engine_support import (
    blind_charge,
    careful_charge,
    charge_once,
    count_lines,
    kill_process,
    kinds,
    start_worker_process,
    wait_until,
)

AppFactory = Callable[..., perdure.App]


@pytest.mark.parametrize("resuming_node", ["same", "other"])
def test_step_killed_mid_way_is_in_doubt_on_resume(
    make_app: AppFactory, store_url: str, key_dir: Path, tmp_path: Path, resuming_node: str
) -> None:
    """SIGKILL during a non-idempotent step: on resume the agent gets ``StepInDoubtError``.

    ``step_started`` was recorded before the body ran; after the crash the resuming
    node records ``step_in_doubt`` and raises the error into the agent (which catches
    it and reports the idempotency key) without running the body again. The same node
    (same key) takes the dead process's lease back at once; another node waits for
    the lease to lapse.
    """
    marks = str(tmp_path / "charges")
    starter = make_app()
    starter.agent(name="charge_once")(charge_once)
    starter.options(object_id="pay-1").start("charge_once", marks, 30.0)
    log = tmp_path / "worker.log"
    proc = start_worker_process(store_url, key_dir, log)
    try:
        assert wait_until(lambda: count_lines(marks) == 1, timeout=15), log.read_text()
        assert kinds(starter, "pay-1") == ["instantiated", "step_started"]
        started = starter.history("pay-1")[-1].body
        assert started["key"] == "pay-1/0/charge" and started["attempt"] == 1
    finally:
        kill_process(proc)

    other_keys = tmp_path / "other-keys"
    if resuming_node != "same":  # another node of the same cluster: one root certifies both
        perdure.KeyFolder(key_dir).admit(perdure.KeyFolder(other_keys))
    resumer = make_app(key_dir=key_dir if resuming_node == "same" else other_keys)
    resumer.agent(name="charge_once")(charge_once)
    with resumer.background_worker():
        result = resumer.handle("pay-1").result(timeout=15)
    assert resumer.history("pay-1")[2].node_id == resumer.node_id
    assert (resumer.node_id == starter.node_id) is (resuming_node == "same")

    assert result == {"in_doubt": "pay-1/0/charge", "step": "charge"}
    assert count_lines(marks) == 1, "the step body did not run a second time"
    history = resumer.history("pay-1")
    assert [str(r.kind) for r in history] == [
        "instantiated", "step_started", "step_in_doubt", "terminated"]
    assert history[2].body["key"] == "pay-1/0/charge"
    assert resumer.verify("pay-1").ok


def test_in_doubt_is_raised_again_on_later_replays(
    make_app: AppFactory, store_url: str, key_dir: Path, tmp_path: Path
) -> None:
    """Once recorded, the doubt is raised again on every replay and the body never reruns.

    The agent catches the doubt and waits for a person's decision; when it is replayed
    to read that decision, the step is in doubt again with the same key.
    """
    marks, doubts = str(tmp_path / "charges"), tmp_path / "doubts"
    starter = make_app()
    starter.agent(name="careful_charge")(careful_charge)
    starter.options(object_id="careful-1").start("careful_charge", marks, str(doubts))
    log = tmp_path / "worker.log"
    proc = start_worker_process(store_url, key_dir, log)
    try:
        assert wait_until(lambda: count_lines(marks) == 1, timeout=15), log.read_text()
    finally:
        kill_process(proc)

    resumer = make_app()
    resumer.agent(name="careful_charge")(careful_charge)
    with resumer.background_worker():
        assert wait_until(lambda: resumer.get("careful-1").waiting_event == "decision")
        assert resumer.get("careful-1").status is perdure.Status.DORMANT
        resumer.send("careful-1", "decision", "refund")
        result = resumer.handle("careful-1").result(timeout=10)

    assert result == "person said refund"
    assert count_lines(marks) == 1
    assert doubts.read_text().splitlines() == ["careful-1/0/charge"] * 2
    assert kinds(resumer, "careful-1").count("step_in_doubt") == 1


def test_unhandled_doubt_fails_the_agent(
    make_app: AppFactory, store_url: str, key_dir: Path, tmp_path: Path
) -> None:
    """An agent that does not catch ``StepInDoubtError`` terminates ``failed`` with that error."""
    marks = str(tmp_path / "charges")
    starter = make_app()
    starter.agent(name="blind_charge")(blind_charge)
    starter.options(object_id="blind-1").start("blind_charge", marks)
    log = tmp_path / "worker.log"
    proc = start_worker_process(store_url, key_dir, log)
    try:
        assert wait_until(lambda: count_lines(marks) == 1, timeout=15), log.read_text()
    finally:
        kill_process(proc)

    resumer = make_app()
    resumer.agent(name="blind_charge")(blind_charge)
    with resumer.background_worker(), pytest.raises(perdure.AgentFailedError) as failed:
        resumer.handle("blind-1").result(timeout=15)
    assert failed.value.error_type == "perdure.errors:StepInDoubtError"
    assert "blind-1/0/charge" in failed.value.message
    assert count_lines(marks) == 1
