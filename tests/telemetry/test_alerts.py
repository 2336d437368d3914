"""Alerts evaluated by the nodes: two real ``perdure worker`` processes on one store,
each with the rules, fire an alert once and resolve it once, delivered to a real HTTP
receiver checking the signature; a stuck object's no-progress alert; a question
notified once and reminded once; deliveries retried, and bad rules refused."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import perdure
from perdure.errors import ConfigurationError
from perdure.telemetry import (
    Alert,
    Alerts,
    FailureRate,
    FewWorkers,
    NewQuestion,
    NoProgress,
    Parked,
)
from tests.integration.engine_support import REPO_ROOT, kill_process, wait_until
from tests.telemetry import alerts_support
from tests.telemetry.alerts_support import SECRET, Receiver


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A webhook receiver checking signatures."""
    found = Receiver()
    yield found
    found.close()


def _worker(store_url: str, key_dir: Path, log: Path, receiver: Receiver
            ) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "ALERT_TEST_URL": receiver.url,
           "ALERT_TEST_SECRET": SECRET}
    with open(log, "ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "perdure", "--store", store_url, "--key-dir", str(key_dir),
             "--app", "tests.telemetry.alerts_support:app", "worker", "--lease", "1",
             "--poll", "0.05", "--concurrency", "2", "--drain", "1"],
            cwd=REPO_ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT)


def test_two_worker_processes_fire_once_and_resolve_once(
        store_url: str, key_dir: Path, tmp_path: Path, receiver: Receiver) -> None:
    """Both workers evaluate ``FewWorkers(2)`` twenty times a second: the two of them
    are one node (one key folder), so it fires, once; two more nodes' heartbeats resolve
    it, once. Each change reaches the receiver once, signed, and is in the store."""
    app = alerts_support.app.with_settings(store=store_url, key_dir=key_dir)
    app.start(alerts_support.idle)  # makes the key folder before the workers share it
    logs = [tmp_path / f"worker-{i}.log" for i in range(2)]
    procs = [_worker(store_url, key_dir, log, receiver) for log in logs]
    try:
        def texts() -> list[str]:
            return [log.read_text(errors="replace")[-3000:] for log in logs]

        assert wait_until(lambda: all("with alerts few_workers" in t for t in texts()), 30)
        assert wait_until(lambda: len(receiver.bodies) >= 1, 30), texts()
        (firing,) = receiver.bodies
        assert (firing["type"], firing["rule"], firing["subject"]) == (
            "alert.firing", "few_workers", "nodes")
        now = app.clock()
        for other in ("node-b", "node-c"):  # enough without the workers' own, which stops
            app.store.heartbeat(other, b"", (), (), now, now + 3600)
        assert wait_until(lambda: len(receiver.bodies) >= 2, 30), texts()
        resolved = receiver.bodies[1]
        assert (resolved["type"], resolved["subject"], resolved["fired_at"]) == (
            "alert.resolved", "nodes", firing["fired_at"])
        assert resolved["resolved_at"] >= firing["fired_at"]
        (row,) = app.store.alerts()
        assert (row.rule, row.state) == ("few_workers", "resolved")
        assert receiver.refused == 0 and len(set(receiver.ids)) == 2
        said = "".join(texts())
        assert said.count("alert firing few_workers") == 1
        assert said.count("alert resolved few_workers") == 1
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                kill_process(proc)
        app.close()
    assert len(receiver.bodies) == 2


def _passes(alerts: Alerts, until: int, timeout: float = 20.0) -> list[Alert]:
    """Evaluate (as a node's pass does) until ``until`` alerts were won."""
    won: list[Alert] = []

    def enough() -> bool:
        won.extend(alerts.evaluate())
        return len(won) >= until

    assert wait_until(enough, timeout, interval=0.05), won
    return won


def test_no_progress_fires_on_a_stuck_step_and_resolves_when_it_moves(
        store_url: str, key_dir: Path, tmp_path: Path, receiver: Receiver) -> None:
    """An object in a step that writes nothing for 0.3 s fires ``no_progress`` once;
    once the step ends and the object completes, the alert resolves once; both
    delivered to the signed webhook with a link to the dashboard."""
    app = perdure.App(store=store_url, key_dir=key_dir, lease_seconds=1.0,
                      poll_interval=0.01)
    app.agent(name="holds")(alerts_support.holds)
    alerts = Alerts(app, [NoProgress(0.3)], webhook=receiver.url,
                    secret=perdure.Secret(SECRET), base_url="http://dash.example/")
    gate = tmp_path / "go"
    try:
        with app.background_worker():
            handle = app.start("holds", str(gate))
            won = _passes(alerts, 1)
            gate.write_text("go")
            assert handle.result(timeout=30) == "released"
            won += _passes(alerts, 1)
        assert [(a.kind, a.rule, a.subject) for a in won] == [
            ("firing", "no_progress", handle.object_id),
            ("resolved", "no_progress", handle.object_id)]
        assert "no new record for" in won[0].summary
        assert alerts.evaluate() == []
        asyncio.run(alerts.deliver(won))
        assert [(b["type"], b["link"]) for b in receiver.bodies] == [
            ("alert.firing", "http://dash.example/alerts"),
            ("alert.resolved", "http://dash.example/alerts")]
    finally:
        app.close()


def test_a_question_is_notified_once_then_reminded_once(
        store_url: str, key_dir: Path, receiver: Receiver) -> None:
    """A question notifies once, with a link to the inbox; still unanswered after 0.5 s
    it is reminded once; answered, nothing more is sent and the store shows both
    notifications resolved."""
    app = perdure.App(store=store_url, key_dir=key_dir, lease_seconds=1.0,
                      poll_interval=0.01)
    app.agent(name="asks")(alerts_support.asks)
    alerts = Alerts(app, [NewQuestion(remind_after=0.5)], webhook=receiver.url,
                    secret=perdure.Secret(SECRET), base_url="http://dash.example")
    try:
        with app.background_worker():
            handle = app.start("asks")
            won = _passes(alerts, 1)
            won += _passes(alerts, 1)
            assert alerts.evaluate() == []
            app.send(handle.object_id, "answer", "yes")
            assert handle.result(timeout=30) == "yes"
        assert alerts.evaluate() == []
        subject = f"{handle.object_id}/"
        assert [(a.kind, a.rule) for a in won] == [
            ("notification", "notify.question"), ("notification", "notify.question.reminder")]
        assert all(a.subject.startswith(subject) for a in won)
        assert "Ship it?" in won[0].summary and "yes" in won[0].summary
        asyncio.run(alerts.deliver(won))
        assert [b["type"] for b in receiver.bodies] == ["notification"] * 2
        assert receiver.bodies[0]["link"] == f"http://dash.example/inbox#{handle.object_id}"
        assert {r.state for r in app.store.alerts(rule_prefix="notify.")} == {"resolved"}
    finally:
        app.close()


def test_a_failing_receiver_is_retried_and_a_dead_one_only_logged(
        receiver: Receiver, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A receiver answering 500 twice gets the delivery on the third attempt, with the
    same id; a receiver that is not there is logged after the last attempt, and
    ``deliver`` returns normally."""
    app = perdure.App(store=f"sqlite:///{tmp_path / 's.db'}", key_dir=tmp_path / "keys")
    try:
        alert = Alert("firing", "parked", "o-1", "parked: test", 1.0, "n")
        receiver.failing = 2
        flaky = Alerts(app, [Parked()], webhook=receiver.url, secret=perdure.Secret(SECRET),
                       backoff=0.01)
        asyncio.run(flaky.deliver([alert]))
        assert [b["subject"] for b in receiver.bodies] == ["o-1"]
        gone = Alerts(app, [Parked()], webhook="http://127.0.0.1:9/nothing",
                      secret=perdure.Secret(SECRET), backoff=0.01, attempts=2)
        with caplog.at_level("WARNING", logger="perdure.alerts"):
            asyncio.run(gone.deliver([alert]))
        assert any(getattr(r, "action", "") == "alert_undelivered" for r in caplog.records)
    finally:
        app.close()


@pytest.mark.parametrize(("rules", "options", "says"), [
    (["parked"], {}, "not 'parked'"),
    ([NoProgress(1), NoProgress(2)], {}, "distinct names"),
    ([Parked()], {"webhook": "ftp://x"}, r"http\(s\) URL"),
    ([Parked()], {"webhook": "http://x"}, "needs secret"),
    ([Parked()], {"webhook": "http://x", "secret": perdure.Secret("short")}, "16 char"),
    ([Parked()], {"every": 0}, "every must be"),
])
def test_bad_declarations_are_refused(rules: list[object], options: dict[str, object],
                                      says: str, tmp_path: Path) -> None:
    """Bad rules and settings fail at declaration with a ConfigurationError."""
    app = perdure.App(store=f"sqlite:///{tmp_path / 's.db'}")
    with pytest.raises(ConfigurationError, match=says):
        Alerts(app, rules, **options)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="positive"):
        FewWorkers(0)


def test_parked_and_failure_rate_judged_by_two_nodes_once(
        store_url: str, key_dir: Path, tmp_path: Path) -> None:
    """Two nodes (Apps of their own on one store) evaluate ``Parked`` and
    ``FailureRate`` in turns: a parked object fires once and resolves once it is
    retried; three failures out of four ended objects fire the rate once."""
    apps = [perdure.App(store=store_url, key_dir=tmp_path / f"keys-{i}", node_id=f"node-{i}",
                        lease_seconds=1.0, poll_interval=0.01) for i in range(2)]
    for one in apps:
        one.agent(name="drifts")(alerts_support.drifts)
        one.agent(name="fails")(alerts_support.fails)
        one.agent(name="idle")(alerts_support.idle)
    rules = [Parked(), FailureRate(0.75, window=600, minimum=4)]
    nodes = [Alerts(one, rules) for one in apps]
    app = apps[0]
    flag = tmp_path / "drift"
    won: list[Alert] = []

    def passes(until: int) -> bool:
        for node in nodes:
            won.extend(node.evaluate())
        return len(won) >= until

    try:
        with app.background_worker():
            drifter = app.start("drifts", str(flag))
            assert wait_until(lambda: app.get(drifter.object_id).status == "dormant", 30)
            flag.write_text("the code changed")
            drifter.send("go")
            assert wait_until(lambda: passes(1), 30, interval=0.05), won
            flag.unlink()
            app.retry(drifter.object_id)
            assert drifter.result(timeout=30) == "done"
            assert wait_until(lambda: passes(2), 30, interval=0.05), won
            failing = [app.start("fails") for _ in range(3)]
            for handle in failing:
                with pytest.raises(perdure.AgentFailedError):
                    handle.result(timeout=30)
            # 3 failed of the 4 ended is 75%: at the threshold.
            assert wait_until(lambda: passes(3), 30, interval=0.05), won
        assert [(a.kind, a.rule, a.subject, a.node_id) for a in won][:2] == [
            ("firing", "parked", drifter.object_id, won[0].node_id),
            ("resolved", "parked", drifter.object_id, won[1].node_id)]
        assert (won[2].kind, won[2].rule, won[2].subject) == ("firing", "failure_rate",
                                                              "objects")
        assert "3 of 4" in won[2].summary and len(won) == 3
        passes(3)
        assert len(won) == 3  # nothing changed: nothing more
    finally:
        for one in apps:
            one.close()
