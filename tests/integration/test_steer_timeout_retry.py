"""Step timeouts (real time, short timeouts): an attempt that runs too long ends as
``StepTimeoutError``, recorded as a failure of class ``timeout`` and retried by the
backoff rules; async steps are cancelled, sync ones left to their thread. And
``App.retry`` / ``perdure retry`` for a parked object. Both stores."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

import perdure
from perdure.cli import cli
from tests.integration.engine_support import wait_until
from tests.integration.steer_support import register


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_a_step_past_its_timeout_is_retried(make_app: Callable[..., perdure.App],
                                            tmp_path: Path, kind: str) -> None:
    """The first attempt sleeps 3 s under a 0.3 s timeout: it fails as a timeout and the
    second attempt's result is recorded; an async attempt is cancelled (it never gets to
    the end of its sleep), a sync one is not waited for (the retry began first)."""
    app = register(make_app())
    marks = Path(tmp_path / "marks")
    seconds = 3.0
    with app.background_worker():
        handle = app.options(object_id=f"t-{kind}").start("timed", str(marks), kind, seconds, 0.3)
        assert handle.result(timeout=30) == "ok"
        # Look after the first attempt could have finished its sleep, not before.
        ended = wait_until(lambda: {"cancelled", "late"} & set(_lines(marks)),
                           timeout=seconds + 20)
        assert ended, _lines(marks)
    failed = [r.body for r in app.history(handle.object_id) if r.kind == "step_failed"]
    assert len(failed) == 1
    assert failed[0]["error_class"] == "timeout"
    assert failed[0]["error"]["type"].endswith("StepTimeoutError")
    assert "ran longer than its timeout of 0.3s" in failed[0]["error"]["message"]
    assert 0.25 <= failed[0]["latency"] < seconds  # cut by the timeout, not the body's end
    assert not failed[0]["final"]
    [done] = [r.body for r in app.history(handle.object_id) if r.kind == "step_done"]
    assert done["attempt"] == 2 and done["result"] == "ok"
    lines = _lines(marks)
    if kind == "async":
        assert "cancelled" in lines and "late" not in lines, lines
    else:  # the thread ran on; the retry did not wait for it
        assert lines.index("late") > 1 and lines[:2] == ["attempt", "attempt"], lines
    assert app.verify(handle.object_id).ok


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_a_step_that_always_times_out_fails_for_good(make_app: Callable[..., perdure.App]
                                                     ) -> None:
    app = register(make_app())
    with app.background_worker():
        handle = app.options(object_id="never").start("hopeless", 0.2)
        with pytest.raises(perdure.AgentFailedError, match="StepTimeoutError") as failed:
            handle.result(timeout=20)
    assert "timeout of 0.2s" in failed.value.message
    attempts = [r.body for r in app.history("never") if r.kind == "step_failed"]
    assert [a["attempt"] for a in attempts] == [1, 2]
    assert attempts[-1]["final"] and {a["error_class"] for a in attempts} == {"timeout"}


def test_timeouts_are_checked(make_app: Callable[..., perdure.App]) -> None:
    app = make_app()

    def quick() -> int:
        return 1

    @perdure.step(timeout=0.5)
    def decorated() -> str:
        return "ok"

    @app.agent(name="checker")
    async def checker(run: perdure.Run) -> list[str]:
        said = []
        for bad in (0, -1, float("nan"), float("inf"), "1", True):
            try:
                await run.step(quick, timeout=bad)
            except perdure.ConfigurationError as exc:
                said.append(str(exc)[:40])
        said.append(await run.step(decorated))
        return said

    with app.background_worker():
        said = app.options(object_id="chk").start(checker).result(timeout=10)
    assert said[-1] == "ok" and len(said) == 7
    assert all("must be a number of seconds above 0" in s or "timeout of step" in s
               for s in said[:-1])


def test_retry_a_parked_object(make_app: Callable[..., perdure.App], store_url: str,
                               key_dir: Path) -> None:
    app = make_app()

    @app.agent(name="drifter")
    async def drifter(run: perdure.Run) -> str:
        await run.step(lambda: "one", name="one")
        await run.wait_for("go")
        return "v1"

    with app.background_worker():
        handle = app.options(object_id="drift").start(drifter)
        assert wait_until(lambda: handle.status() is perdure.Status.DORMANT, timeout=10)
    with pytest.raises(perdure.NotParkedError, match="not parked"):
        app.retry("drift")
    # New code that no longer matches memory: the object parks.
    changed = make_app()

    @changed.agent(name="drifter")
    async def drifter_v2(run: perdure.Run) -> str:
        await run.step(lambda: "two", name="two")
        await run.wait_for("go")
        return "v2"

    changed.send("drift", "go")
    with changed.background_worker():
        assert wait_until(lambda: handle.status() is perdure.Status.PARKED, timeout=10)
    # The code is fixed (back to what memory holds): retry from the command line.
    runner = CliRunner()
    base = ["--store", store_url, "--key-dir", str(key_dir)]
    done = runner.invoke(cli, [*base, "retry", "drift"])
    assert done.exit_code == 0, done.output
    assert "retry requested" in done.output
    assert app.get("drift").status is not perdure.Status.PARKED
    with app.background_worker():
        assert handle.result(timeout=10) == "v1"
    with pytest.raises(perdure.NotParkedError):
        handle.retry()
    with pytest.raises(perdure.ObjectNotFoundError):
        app.retry("nobody")
