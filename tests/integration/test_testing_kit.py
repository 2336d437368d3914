"""``perdure.testing``: agents run on a clock the test skips, questions answered and tool
calls decided by helpers, histories written to files and replayed against changed code.

Time is asserted on the environment's clock (what the engine stamped and compared),
never on how fast the wall clock went.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import perdure
from perdure.cli import cli
from perdure.llm import ChatCompletionsClient, Message
from perdure.llm.scripted import ScriptedReply, ScriptedServer, ScriptedToolCall
from perdure.testing import EnvHandle, Environment, History, Replayer, Summary, VirtualClock
from tests.golden import agents as golden_agents
from tests.histories import agents as kept

HISTORIES = Path(__file__).resolve().parents[1] / "histories"
GOLDEN = Path(__file__).resolve().parents[1] / "golden"
HOUR = 3600.0


def _fetch(topic: str) -> list[str]:
    return [f"{topic}-1", f"{topic}-2"]


def _sleepers() -> perdure.App:
    """An App (whose store is never opened) with the agents most tests run."""
    app = perdure.App(store="sqlite:///never-opened-by-the-environment.db")

    @app.agent(name="napper")
    async def napper(run: perdure.Run, seconds: float) -> dict[str, Any]:
        before = await run.now()
        pages = await run.step(_fetch, "tides")
        await run.sleep(seconds)
        after = await run.now()
        return {"pages": pages, "slept": after - before}

    @app.agent(name="asker")
    async def asker(run: perdure.Run, timeout: float | None) -> Any:
        answer = await run.wait_for("review", timeout=timeout, prompt="publish?",
                                    choices=["yes", "no"])
        return {"answer": answer, "at": await run.now()}

    @app.agent(name="sync_napper")
    def sync_napper(run: perdure.SyncRun, seconds: float) -> float:
        before = run.now()
        run.sleep(seconds)
        return run.now() - before

    @app.agent(name="flaky")
    async def flaky(run: perdure.Run) -> int:
        def attempt() -> int:
            if perdure.current_step().attempt < 3:
                raise ConnectionError("the service is down")
            return perdure.current_step().attempt

        return int(await run.step(attempt, name="attempt",
                                  retry=perdure.RetryPolicy(max_attempts=5, base=600.0)))

    @app.agent(name="parent")
    async def parent(run: perdure.Run) -> list[Any]:
        first = await run.delegate("napper", HOUR)
        second = await run.delegate("asker", None)
        return list(await run.join(first, second))

    return app


@pytest.fixture
def app() -> perdure.App:
    return _sleepers()


def _records_ts(env: Environment, object_id: str) -> list[float]:
    return [rec.ts for rec in env.app.history(object_id)]


# -- the clock --------------------------------------------------------------------------


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_an_hour_long_sleep_completes_on_the_skipped_clock(app: perdure.App,
                                                            store: str) -> None:
    """``run.sleep(3600)`` ends as soon as nothing else can move: the environment's clock
    jumped an hour, ``run.now()`` and every record's timestamp follow it, in order."""
    with Environment(app, store=store) as env:
        began = env.now()
        handle = env.start("napper", HOUR)
        assert isinstance(handle, EnvHandle)
        result = handle.result()
        assert result["pages"] == ["tides-1", "tides-2"]
        assert result["slept"] >= HOUR
        assert env.clock.elapsed >= HOUR
        assert env.now() - began >= HOUR
        stamps = _records_ts(env, handle.object_id)
        assert stamps == sorted(stamps)
        assert stamps[-1] - stamps[0] >= HOUR
        assert [rec.kind for rec in env.app.history(handle.object_id)] == [
            "instantiated", "value", "step_done", "dormant", "woke", "value", "terminated"]
        dormant = next(r for r in env.app.history(handle.object_id) if r.kind == "dormant")
        assert dormant.body["wake_at"] - dormant.ts >= HOUR - 1e-3


def test_records_are_stamped_with_the_environments_time(app: perdure.App) -> None:
    """A clock started in 2001 stamps the records, the row and ``run.now()`` in 2001: the
    App and its worker read the environment's clock, not the machine's."""
    start = 1_000_000_000.0
    with Environment(app, start_time=start) as env:
        handle = env.start("napper", 60.0)
        handle.result()
        assert all(start <= ts < start + 3600 for ts in _records_ts(env, handle.object_id))
        info = handle.info()
        assert start <= info.created_at < start + 3600
        assert start + 60 <= info.updated_at < start + 3600


def test_a_sync_agent_sleeps_on_the_skipped_clock_too(app: perdure.App) -> None:
    with Environment(app) as env:
        assert env.start("sync_napper", 2 * HOUR).result() >= 2 * HOUR


def test_step_retries_wait_out_their_pause_on_the_skipped_clock(app: perdure.App) -> None:
    """A step failing twice with ten-minute pauses between attempts ends at once."""
    with Environment(app) as env:
        handle = env.start("flaky")
        assert handle.result() == 3
        failed = [r for r in env.app.history(handle.object_id) if r.kind == "step_failed"]
        assert len(failed) == 2
        assert env.clock.elapsed >= 600


def test_a_deadline_passes_under_skipped_time(app: perdure.App) -> None:
    """An object whose deadline comes before its sleep ends fails at the deadline."""
    with Environment(app) as env:
        handle = env.options(deadline=60).start("napper", HOUR)
        with pytest.raises(perdure.AgentFailedError, match="deadline"):
            handle.result()
        assert 60 <= env.clock.elapsed < HOUR


def test_the_virtual_clock_only_goes_forward() -> None:
    clock = VirtualClock(start=100.0)
    first = clock()
    assert first >= 100.0
    assert clock.skip(50) >= first + 50
    assert clock.skip_to(10.0) >= first + 50  # never back
    with pytest.raises(perdure.ConfigurationError):
        clock.skip(-1)
    with pytest.raises(perdure.ConfigurationError):
        VirtualClock(start=float("nan"))


# -- waits, questions, children --------------------------------------------------------


def test_run_stops_at_a_question_and_the_helper_answers_it(app: perdure.App) -> None:
    with Environment(app) as env:
        handle = env.start("asker", 600.0)
        summary = handle.run()
        assert isinstance(summary, Summary)
        assert summary.waiting_for == "event" and summary.event == "review"
        assert summary.question is not None
        assert summary.question.prompt == "publish?"
        assert summary.question.choices == ("yes", "no")
        assert summary.wake_at is not None and summary.wake_at - summary.now > 590
        assert "waiting for event 'review'" in str(summary)
        asked = env.answer(handle, "yes")
        assert asked is not None and asked.event == "review"
        done = env.run(handle)
        assert done.done and done.waiting_for is None
        assert done.result["answer"] == "yes"
        assert env.clock.skipped == 0  # answered before its timeout: nothing skipped


def test_a_wait_with_a_timeout_fires_its_timeout(app: perdure.App) -> None:
    """Nobody answers: ``run_until_complete`` skips to the wait's timeout, which gives
    the agent ``None``."""
    with Environment(app) as env:
        began = env.now()
        handle = env.start("asker", 600.0)
        result = env.run_until_complete(handle)
        assert result["answer"] is None
        assert result["at"] - began >= 600
        kinds = [r.kind for r in env.app.history(handle.object_id)]
        assert "wait_timed_out" in kinds


def test_skip_fires_a_timeout_by_hand(app: perdure.App) -> None:
    with Environment(app) as env:
        handle = env.start("asker", 600.0)
        assert handle.run().waiting_for == "event"
        env.skip(590)
        assert handle.summary().waiting_for == "event"  # not yet
        env.skip(20)
        assert handle.summary().done
        assert handle.result()["answer"] is None


def test_a_wait_without_timeout_is_blocked_not_skipped(app: perdure.App) -> None:
    """No timer can move it: ``BlockedError`` says what it waits for; answered, it ends."""
    with Environment(app) as env:
        handle = env.start("asker", None)
        with pytest.raises(perdure.BlockedError, match="review") as raised:
            handle.result()
        waiting = raised.value.waiting
        assert isinstance(waiting, Summary) and waiting.waiting_for == "event"
        handle.send("review", "no")
        assert handle.result()["answer"] == "no"


def test_children_sleep_and_the_parent_waits_for_the_one_asking(app: perdure.App) -> None:
    """The parent's sleeping child is skipped through; its asking child stops the run,
    and the summary names it."""
    with Environment(app) as env:
        handle = env.start("parent")
        summary = env.run(handle)
        assert summary.waiting_for == "children"
        [asking] = summary.children
        assert env.app.get(asking).agent == "asker"
        assert env.summary(asking).question is not None
        env.answer(asking, "yes")
        napped, asked = handle.result()
        assert napped["slept"] >= HOUR
        assert asked["answer"] == "yes"


def test_pause_and_parking_stop_a_run(app: perdure.App) -> None:
    with Environment(app) as env:
        handle = env.start("asker", None)
        assert handle.run().waiting_for == "event"
        handle.pause()
        assert handle.run().waiting_for == "resume"
        with pytest.raises(perdure.BlockedError):
            handle.result()
        handle.resume()
        env.answer(handle, "yes")
        assert handle.result()["answer"] == "yes"


def test_async_tests_use_the_environment_the_same_way(app: perdure.App) -> None:
    async def main() -> tuple[dict[str, Any], Summary]:
        async with Environment(app) as env:
            slept = await env.start("napper", HOUR).aresult()
            asking = env.start("asker", None)
            summary = await asking.arun()
            env.answer(asking, "yes")
            assert (await env.arun_until_complete(asking))["answer"] == "yes"
            # The awaitable client (app.aio) waits the environment's way too.
            napping = await env.app.aio.start("napper", HOUR)
            assert (await napping.result(timeout=30))["slept"] >= HOUR
            return slept, summary

    slept, summary = asyncio.run(main())
    assert slept["slept"] >= HOUR
    assert summary.waiting_for == "event"


def test_bad_input_is_refused(app: perdure.App, tmp_path: Path) -> None:
    with pytest.raises(perdure.ConfigurationError, match="'memory' or 'sqlite'"):
        Environment(app, store="postgresql://postgres@127.0.0.1/postgres")
    with pytest.raises(perdure.ConfigurationError, match="not started"):
        _ = Environment(app).app
    with Environment(app) as env:
        with pytest.raises(perdure.ConfigurationError):
            env.skip(-5)
        handle = env.start("napper", HOUR)
        with pytest.raises(perdure.ConfigurationError, match="asks nothing"):
            env.answer(handle, "yes")
        with pytest.raises(perdure.ApprovalError, match="no tool call waiting"):
            env.approve(handle)
        with pytest.raises(perdure.ObjectNotFoundError):
            env.run("no-such-object")
    assert not Path("never-opened-by-the-environment.db").exists()


# -- tools, policies and the people who approve ----------------------------------------

SENT: list[str] = []


def _tool_app(ttl: float | None) -> perdure.App:
    app = perdure.App(store="sqlite:///never-opened-by-the-environment.db")

    @app.tool(risk="high")
    def send_message(to: str, body: str) -> str:
        """Send a message to someone (needs a person's approval)."""
        SENT.append(f"{to}:{body}")
        return f"sent to {to}"

    policy = perdure.Policy("strict", rules=(perdure.Allow({"send_message"}),),
                            approvers={"high": frozenset({"alice"})}, approval_ttl=ttl)

    @app.agent(name="messenger")
    async def messenger(run: perdure.Run, base_url: str) -> list[list[Any]]:
        client = ChatCompletionsClient(base_url=base_url, api_key=lambda: "test")
        try:
            result = await run.agent(client, model="gpt-4o",
                                     messages=[Message.user("tell bob hi")],
                                     tools=[send_message], policy=policy, max_turns=4)
        finally:
            await client.aclose()
        return [[call.tool, call.outcome] for call in result.calls]

    return app


@pytest.fixture
def server() -> Any:
    with ScriptedServer() as running:
        running.script(ScriptedReply(tool_calls=(ScriptedToolCall(
            "send_message", json.dumps({"to": "bob", "body": "hi"}), "c1"),)),
            ScriptedReply(text="Done."))
        yield running


def test_the_helper_approves_as_the_approver_the_policy_names(server: ScriptedServer) -> None:
    SENT.clear()
    with Environment(_tool_app(ttl=None)) as env:
        handle = env.start("messenger", server.openai_base_url)
        summary = handle.run()
        assert summary.waiting_for == "approval"
        assert summary.approval is not None
        assert summary.approval.tool == "send_message"
        assert summary.approval.approvers == ("alice",)
        assert SENT == []
        with pytest.raises(perdure.ApprovalError, match="may not decide"):
            env.approve(handle, by="mallory")
        decided = env.approve(handle)  # as alice, whom the policy names
        assert decided.proposal_id == summary.approval.proposal_id
        assert handle.result() == [["send_message", "done"]]
        [record] = [r.body for r in env.app.history(handle.object_id)
                    if r.kind == "tool_decided"]
        assert record["identity"] == "alice" and record["decision"] == "approve"
    assert SENT == ["bob:hi"]


def test_the_helper_rejects_and_the_tool_never_runs(server: ScriptedServer) -> None:
    SENT.clear()
    with Environment(_tool_app(ttl=None)) as env:
        handle = env.start("messenger", server.openai_base_url)
        assert handle.run().waiting_for == "approval"
        env.reject(handle, reason="not bob")
        assert handle.result() == [["send_message", "rejected"]]
    assert SENT == []


def test_an_approval_ttl_expiring_under_skipped_time_counts_as_rejected(
        server: ScriptedServer) -> None:
    """An hour-long approval deadline passes at once when nobody decides; a decision
    after it is refused."""
    SENT.clear()
    with Environment(_tool_app(ttl=HOUR)) as env:
        handle = env.start("messenger", server.openai_base_url)
        waiting = handle.run()
        assert waiting.approval is not None and waiting.approval.expires_at is not None
        assert waiting.wake_at == pytest.approx(waiting.approval.expires_at)
        assert handle.result() == [["send_message", "expired"]]
        assert env.clock.elapsed >= HOUR
        decided = [r.body["decision"] for r in env.app.history(handle.object_id)
                   if r.kind == "tool_decided"]
        assert decided == ["expire"]
    assert SENT == []


# -- histories and the replayer --------------------------------------------------------


def _renamed() -> perdure.App:
    """``napper`` with its step renamed at command #1 (no new version)."""
    app = _sleepers()
    changed = perdure.App(store="sqlite:///never-opened.db")
    for name, definition in app.agents.items():
        if name != "napper":
            changed.agent(name=name, version=definition.version)(definition.fn)

    @changed.agent(name="napper")
    async def napper(run: perdure.Run, seconds: float) -> dict[str, Any]:
        before = await run.now()
        pages = await run.step(_fetch, "tides", name="fetch_pages")
        await run.sleep(seconds)
        return {"pages": pages, "slept": await run.now() - before}

    return changed


def _reordered() -> perdure.App:
    """``napper`` sleeping before its step."""
    changed = perdure.App(store="sqlite:///never-opened.db")

    @changed.agent(name="napper")
    async def napper(run: perdure.Run, seconds: float) -> dict[str, Any]:
        before = await run.now()
        await run.sleep(seconds)
        pages = await run.step(_fetch, "tides")
        return {"pages": pages, "slept": await run.now() - before}

    return changed


def test_a_history_written_in_the_test_replays_and_catches_a_changed_agent(
        app: perdure.App, tmp_path: Path) -> None:
    with Environment(app) as env:
        handle = env.start("napper", HOUR)
        handle.result()
        path = env.export(handle, tmp_path / "napper.json")
        text = path.read_text()
        assert env.history(handle).to_json() == text  # the same text every time
    history = History.read(path)
    assert history.agent == "napper" and history.status == "completed"
    report = Replayer(app).replay(path)
    assert report.verdict == "compatible"

    with pytest.raises(perdure.ReplayFailedError) as renamed:
        Replayer(_renamed()).replay(path)
    assert renamed.value.verdict == "diverges"
    assert renamed.value.position == 1
    assert renamed.value.recorded == "step('_fetch')"
    assert renamed.value.found == "step('fetch_pages')"
    assert renamed.value.path == str(path)

    with pytest.raises(perdure.ReplayFailedError) as reordered:
        Replayer(_reordered()).replay(history)
    assert (reordered.value.position, reordered.value.recorded, reordered.value.found) == (
        1, "step('_fetch')", "sleep(None)")
    quiet = Replayer(_reordered()).replay(path, raise_on_failure=False)
    assert quiet.verdict == "diverges" and not quiet.ok


def test_the_histories_kept_in_the_repository_replay_against_todays_code() -> None:
    """``tests/histories/*.json`` pass against ``agents.py`` and fail against
    ``changed.py`` at the position it moved."""
    from tests.histories import changed

    reports = Replayer(kept.app).replay_all([HISTORIES])
    assert {r.object_id for r in reports} == {"digest-done", "digest-waiting"}
    assert all(r.verdict == "compatible" for r in reports)
    for path in sorted(HISTORIES.glob("*.json")):
        with pytest.raises(perdure.ReplayFailedError) as failed:
            Replayer(changed.app).replay(path)
        assert failed.value.position == 1
        assert (failed.value.recorded, failed.value.found) == (
            "sleep(None)", "step('summarize')")


def test_a_golden_memory_log_is_a_history_too() -> None:
    report = Replayer(golden_agents.app).replay(GOLDEN / "sleeper.json")
    assert report.verdict == "compatible"


def test_a_history_for_an_agent_this_code_lacks_fails_and_another_version_passes(
        tmp_path: Path) -> None:
    path = HISTORIES / "digest-done.json"
    with pytest.raises(perdure.ReplayFailedError, match="registers no agent 'digest'"):
        Replayer(_sleepers()).replay(path)
    bumped = perdure.App(store="sqlite:///never-opened.db")
    bumped.agent(name="digest", version="2")(kept.digest)
    assert Replayer(bumped).replay(path).verdict == "not-served"


@pytest.mark.parametrize("change", ["body", "hash", "signature", "drop", "header", "key"])
def test_a_tampered_history_is_refused_when_read(change: str, tmp_path: Path) -> None:
    doc = json.loads((HISTORIES / "digest-done.json").read_text())
    records = doc["records"]
    if change == "body":
        records[1]["body"]["result"] = ["forged"]
    elif change == "hash":  # the body changed and its hash made to match: the link breaks
        records[1]["hash"] = "0" * 64
    elif change == "signature":
        last = records[-1]
        last["signature"] = ("00" if not last["signature"].startswith("00") else "11") + \
            last["signature"][2:]
    elif change == "drop":
        del records[2]
    elif change == "header":
        doc["agent"] = "other"
    else:
        doc["public_keys"] = {node: "11" * 32 for node in doc["public_keys"]}
    path = tmp_path / "tampered.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(perdure.IntegrityError):
        History.read(path)
    with pytest.raises(perdure.IntegrityError):
        Replayer(kept.app).replay(path)


def test_a_file_that_is_no_history_is_a_configuration_error(tmp_path: Path) -> None:
    for text in ("not json", "[]", json.dumps({"format": 99}), json.dumps({"format": 1})):
        path = tmp_path / "bad.json"
        path.write_text(text)
        with pytest.raises(perdure.ConfigurationError):
            History.read(path)
    with pytest.raises(perdure.ConfigurationError, match="cannot read"):
        History.read(tmp_path / "missing.json")


def test_the_command_line_checks_history_files_and_exports_them(tmp_path: Path) -> None:
    runner = CliRunner()
    ok = runner.invoke(cli, ["--app", "tests.histories.agents:app", "replay-check",
                             "--history", str(HISTORIES)])
    assert ok.exit_code == 0, ok.output
    assert "2 checked, 0 failed" in ok.output
    bad = runner.invoke(cli, ["--app", "tests.histories.changed:app", "replay-check",
                              "--history", str(HISTORIES / "digest-done.json")])
    assert bad.exit_code == 1
    assert ("diverges" in bad.output
            and "at command #1: recorded sleep(None), code asks for step('summarize')"
            in bad.output)
    tampered = tmp_path / "tampered.json"
    tampered.write_text((HISTORIES / "digest-done.json").read_text().replace(
        "tides-page-1", "tides-page-X", 1))
    refused = runner.invoke(cli, ["--app", "tests.histories.agents:app", "replay-check",
                                  "--history", str(tampered)])
    assert refused.exit_code == 1 and "unreadable" in refused.output
    both = runner.invoke(cli, ["--app", "tests.histories.agents:app", "replay-check", "x",
                               "--history", str(tampered)])
    assert both.exit_code != 0

    with Environment(kept.app, store="sqlite") as env:
        handle = env.options(object_id="cli-1").start(kept.digest, "tides")
        env.run(handle)
        assert env.path is not None
        base = ["--store", f"sqlite:///{env.path / 'env.db'}",
                "--key-dir", str(env.path / "keys")]
        exported = runner.invoke(cli, [*base, "export-history", "cli-1", "--out",
                                       str(tmp_path / "out")])
        assert exported.exit_code == 0, exported.output
    written = tmp_path / "out" / "cli-1.json"
    assert Replayer(kept.app).replay(written).verdict == "compatible"
    copy = tmp_path / "kept"
    copy.mkdir()
    shutil.copy(written, copy / "cli-1.json")
    assert runner.invoke(cli, ["--app", "tests.histories.agents:app", "replay-check",
                               "--history", str(copy)]).exit_code == 0
