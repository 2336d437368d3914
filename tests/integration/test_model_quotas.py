"""Model quotas (``app.model_quota``): every call reserves its estimate in the store
before it is sent and settles it to the usage the provider reported; a call that does
not fit leaves its object dormant until the window has room; a 429 adapts the quota.
Real SDKs over real HTTP against the scripted server (enforcing the same quota), real
stores (SQLite files and PostgreSQL), and real worker processes for a SIGKILL and for
two workers sharing one quota."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("openai")

import perdure
from perdure.llm import Message, counter_for_model
from perdure.llm.scripted import ScriptedFailure, ScriptedReply, ScriptedServer
from perdure.stores.base import QuotaStats
from tests.integration.engine_support import kill_process, wait_until
from tests.integration.quota_support import CAP, MAX_TOKENS, MODEL, QUOTA, ask, start_quota_worker

TIMEOUT = 30.0
WINDOW = 2.0


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    """A scripted server enforcing the quota's tokens per minute over its window."""
    with ScriptedServer(tokens_per_minute=QUOTA.tokens_per_minute,
                        quota_window=QUOTA.window) as running:
        yield running


def stats(app: perdure.App) -> QuotaStats:
    [found] = [s for s in app.store.quota_stats(time.time()) if s.quota.model == MODEL]
    return found


def bodies(app: perdure.App, object_id: str, kind: str) -> list[dict[str, Any]]:
    return [dict(r.body) for r in app.history(object_id) if r.kind == kind]


def quota_app(make_app: Callable[..., perdure.App]) -> perdure.App:
    app = make_app()
    app.model_quota(QUOTA)
    app.agent(name="ask")(ask)
    return app


def test_a_call_reserves_its_estimate_and_settles_to_the_reported_usage(
        make_app: Callable[..., perdure.App], server: ScriptedServer) -> None:
    """While the call is at the provider the window holds its estimate (the prompt
    counted offline plus ``max_tokens``); once the reply is recorded it holds what the
    provider reported, and the rest of the estimate is free again."""
    app = quota_app(make_app)
    server.script(ScriptedReply(text="Fine.", input_tokens=30, output_tokens=7, delay=0.5))
    handle = app.options(object_id="q-1").start("ask", server.openai_base_url, "How?")
    estimate = counter_for_model(MODEL).count_prompt((Message.user("How?"),), ()) + MAX_TOKENS
    with app.background_worker():
        assert wait_until(lambda: len(server.requests) == 1, TIMEOUT)
        during = stats(app)
        assert (during.reserved, during.used, during.requests) == (estimate, 0, 1)
        assert handle.result(timeout=TIMEOUT) == "Fine."
    after = stats(app)
    assert (after.reserved, after.used) == (0, 37)
    assert server.quota["throttled"] == 0


def test_a_call_over_the_quota_is_dormant_until_the_window_has_room(
        make_app: Callable[..., perdure.App], server: ScriptedServer) -> None:
    """Two objects whose calls do not fit one window: the second is dormant (no lease
    held, a ``dormant`` record saying ``quota``) and is sent once the first call leaves
    the window; the provider never answered 429. Waking replays nothing twice."""
    app = quota_app(make_app)
    question = "Why? " * 200  # its reply reports what the prompt counts
    prompt = counter_for_model(MODEL).count_prompt((Message.user(question),), ())
    assert 300 < prompt + MAX_TOKENS <= CAP
    big = ScriptedReply(text="A long answer.", input_tokens=prompt, output_tokens=MAX_TOKENS)
    server.script(big, big)
    first = app.options(object_id="q-1").start("ask", server.openai_base_url, question)
    with app.background_worker():
        assert first.result(timeout=TIMEOUT) == "A long answer."
        second = app.options(object_id="q-2").start("ask", server.openai_base_url, question)
        assert wait_until(lambda: bool(bodies(app, "q-2", "dormant")), TIMEOUT)
        [dormant] = bodies(app, "q-2", "dormant")
        assert dormant["cmd"] == "model" and dormant["reason"] == "quota"
        row = app.store.get("q-2")
        assert row is not None and row.lease_owner is None and row.ready_at is not None
        assert second.result(timeout=TIMEOUT) == "A long answer."
    one, two = server.requests
    assert two.received - one.received >= WINDOW - 0.1
    assert server.quota["throttled"] == 0 and server.quota["peak_window"] <= CAP
    assert not bodies(app, "q-2", "model_failed")
    assert stats(app).requests <= 1  # only the second call is still in the window


def test_a_429_lowers_the_rate_and_holds_calls_until_its_retry_after(
        make_app: Callable[..., perdure.App], server: ScriptedServer) -> None:
    """The provider answers 429 (another client used the account): the quota's rate in
    force is halved, no call is granted before the retry-after, the failure is recorded,
    and the call goes through after it."""
    app = quota_app(make_app)
    server.script(ScriptedFailure(429, retry_after="1"), ScriptedReply(text="Now."))
    handle = app.options(object_id="q-1").start("ask", server.openai_base_url, "Now?")
    with app.background_worker():
        assert handle.result(timeout=TIMEOUT) == "Now."
    found = stats(app)
    assert found.state.throttles == 1 and found.state.factor == 0.5
    assert found.state.blocked_until is not None
    assert found.state.throttled_at is not None
    assert found.state.blocked_until == pytest.approx(found.state.throttled_at + 1, abs=0.01)
    assert found.factor < 1.0 or time.time() > found.state.throttled_at + 5 * WINDOW
    [failed] = bodies(app, "q-1", "model_failed")
    assert failed["failure"]["kind"] == "rate_limited"
    one, two = server.requests
    assert two.received - one.received >= 1.0


def test_bad_quotas_are_refused_and_nothing_is_stored(
        make_app: Callable[..., perdure.App]) -> None:
    """Zero, negative, non-integer limits or none: ``ConfigurationError``; the store holds
    no quota; a second declaration with other limits is refused too."""
    app = make_app()
    for bad in ({"tokens_per_minute": 0}, {"tokens_per_minute": -1},
                {"tokens_per_minute": 2.5}, {"requests_per_minute": "9"}, {}):
        with pytest.raises(perdure.ConfigurationError):
            app.model_quota("openai", MODEL, **bad)
    app.model_quota("openai", MODEL, tokens_per_minute=100)
    with pytest.raises(perdure.ConfigurationError):
        app.model_quota("openai", MODEL, tokens_per_minute=200)
    with app.background_worker():
        pass
    assert app.store.model_quotas() == [perdure.ModelQuota("openai", MODEL,
                                                           tokens_per_minute=100)]
    other = make_app()
    with pytest.raises(perdure.ConfigurationError):
        other.model_quota("openai", "", tokens_per_minute=5)
    assert len(other.store.model_quotas()) == 1


def test_a_killed_workers_reservation_leaves_the_window(
        make_app: Callable[..., perdure.App], server: ScriptedServer, store_url: str,
        key_dir: Path, tmp_path: Path) -> None:
    """SIGKILL a worker while its call is at the provider: its reservation is never
    settled, and leaves the window within the window's length; nothing is held after."""
    server.script(ScriptedReply(text="Slow.", delay=4.0))
    app = quota_app(make_app)
    app.options(object_id="q-1").start("ask", server.openai_base_url, "Slow?")
    log = tmp_path / "worker.log"
    proc = start_quota_worker(store_url, key_dir, log)
    try:
        assert wait_until(lambda: len(server.requests) == 1, TIMEOUT), log.read_text()
        assert stats(app).reserved > 0
    finally:
        kill_process(proc)
    killed = time.time()
    assert wait_until(lambda: stats(app).reserved == 0, 3 * WINDOW)
    assert time.time() - killed <= WINDOW + 1.0
    assert stats(app).requests == 0


def test_two_worker_processes_sharing_one_quota_never_exceed_it(
        make_app: Callable[..., perdure.App], server: ScriptedServer, store_url: str,
        key_dir: Path, tmp_path: Path) -> None:
    """Twelve calls of about 90 tokens through two worker processes under a quota of
    600 tokens per 2 s: every call is answered, none with a 429, and neither the
    provider's window nor the store's (sampled while they run) ever holds more than the
    quota."""
    questions = [f"Question {i}: " + "and more " * 20 for i in range(12)]
    counter = counter_for_model(MODEL)
    # Each reply reports the prompt's tokens as counted offline, and all it may write.
    server.script(*[ScriptedReply(text="ok", output_tokens=MAX_TOKENS, input_tokens=(
        counter.count_prompt((Message.user(q),), ()))) for q in questions])
    app = quota_app(make_app)
    with app.background_worker():  # declares the quota; the subprocesses do the work
        pass
    handles = [app.options(object_id=f"q-{i}").start("ask", server.openai_base_url, q)
               for i, q in enumerate(questions)]
    procs = [start_quota_worker(store_url, key_dir, tmp_path / f"worker-{i}.log")
             for i in range(2)]
    samples: list[int] = []
    try:
        def sampled_all_done() -> bool:
            found = stats(app)
            samples.append(found.used + found.reserved)
            return all(app.get(h.object_id).status == "completed" for h in handles)

        assert wait_until(sampled_all_done, 60, interval=0.05), [
            (tmp_path / f"worker-{i}.log").read_text()[-2000:] for i in range(2)]
    finally:
        for proc in procs:
            kill_process(proc)
    assert server.quota["served"] == 12 and server.quota["throttled"] == 0
    assert server.quota["peak_window"] <= CAP
    assert max(samples) <= CAP
    assert len(samples) > 3


def test_perdure_quotas_lists_the_window_and_the_adapted_rate(
        make_app: Callable[..., perdure.App], store_url: str, key_dir: Path) -> None:
    """``perdure quotas`` and ``--json`` through the real CLI: limits, window, rate."""
    import json
    import subprocess
    import sys

    from tests.integration.engine_support import REPO_ROOT

    app = make_app()
    app.model_quota(QUOTA)
    with app.background_worker():
        pass
    app.store.reserve_quota("openai", MODEL, 120, "nobody", "nobody/0", time.time())
    app.store.quota_throttled("openai", MODEL, 30.0, time.time())
    base = [sys.executable, "-m", "perdure", "--store", store_url, "--key-dir", str(key_dir)]
    listed = subprocess.run([*base, "quotas", "--json"], capture_output=True, text=True,
                            cwd=REPO_ROOT, timeout=60, check=False)
    assert listed.returncode == 0, listed.stderr
    [row] = json.loads(listed.stdout)
    assert (row["provider"], row["model"], row["tokens_per_minute"]) == (
        "openai", MODEL, QUOTA.tokens_per_minute)
    assert row["reserved"] == 120 and row["throttles"] == 1 and row["factor"] <= 0.6
    assert row["blocked_until"] is not None
    shown = subprocess.run([*base, "quotas"], capture_output=True, text=True,
                           cwd=REPO_ROOT, timeout=60, check=False)
    assert shown.returncode == 0 and MODEL in shown.stdout and "429s" in shown.stdout
