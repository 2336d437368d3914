"""Resources: declared, recorded as descriptors, restored on reentry all or nothing."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest

import perdure
from perdure.describe import timeline
from perdure.resources import (
    Environment,
    FileHash,
    Fresh,
    Invalidate,
    OpenFile,
    Resource,
    Stale,
    Validity,
    WorkingDirectory,
)

AppFactory = Callable[..., perdure.App]


def _bodies(app: perdure.App, object_id: str, kind: perdure.Kind) -> list[dict[str, Any]]:
    return [r.body for r in app.history(object_id) if r.kind == kind]


def test_resources_come_back_after_dormancy_with_a_report(make_app: AppFactory,
                                                        tmp_path: Path) -> None:
    """A directory, environment and half-written file held across a sleep are restored
    before the agent continues: the file continues at its checkpointed position (bytes
    written after the checkpoint are cut), and a restore report says what came back."""
    app = make_app()
    work = tmp_path / "work"

    @app.agent(name="holder")
    async def holder(run: perdure.Run) -> dict[str, Any]:
        where = await run.resource("wd", WorkingDirectory(work))
        env = await run.resource("env", Environment({"MODE": "test", "TOKEN": "s3cret"},
                                                    secret=["TOKEN"]))
        out = await run.resource("out", OpenFile(where / "out.txt", "w"))
        if not run.replaying:
            out.write("first half;")
            await run.checkpoint_resources()
            out.write("LOST")  # after the checkpoint: dropped on restore
            out.flush()
        await run.sleep(0.05)
        out.write("second half")
        out.flush()
        return {"dir": str(where), "env": env["MODE"], "pos": out.tell()}

    handle = app.options(object_id="holder-1").start("holder")
    with app.background_worker():
        result = handle.result(timeout=15)
    assert result["env"] == "test" and result["dir"] == str(work)
    assert (work / "out.txt").read_text() == "first half;second half"
    [report] = _bodies(app, "holder-1", perdure.Kind.RESTORE_REPORT)
    assert report["outcome"] == "restored"
    assert [(e["name"], e["status"]) for e in report["resources"]] == [
        ("wd", "restored"), ("env", "restored"), ("out", "restored")]
    assert all(e["seconds"] >= 0 for e in report["resources"])
    shown = "\n".join(row.what for row in timeline(app.history("holder-1")))
    assert "restore restored" in shown and "out restored" in shown
    assert "s3cret" not in shown


class Flaky(Resource[str]):
    """A user recipe whose restore fails while a marker file exists."""

    versions: ClassVar[tuple[int, ...]] = (1,)
    closed: ClassVar[list[str]] = []

    def __init__(self, tag: str, marker: str) -> None:
        super().__init__()
        self.tag, self.marker = tag, marker

    async def open(self) -> str:
        return self.tag

    def describe(self, live: str) -> dict[str, Any]:
        return {"tag": self.tag, "marker": self.marker}

    @classmethod
    async def restore(cls, descriptor: dict[str, Any]) -> str:
        if os.path.exists(descriptor["marker"]):
            raise ConnectionError(f"{descriptor['tag']} unreachable")
        return str(descriptor["tag"])

    @classmethod
    async def close(cls, live: str) -> None:
        cls.closed.append(live)


def test_a_failed_restore_rolls_back_and_retries_with_backoff(make_app: AppFactory,
                                                            tmp_path: Path) -> None:
    """The third of four resources fails: the first two are closed again, the report
    says so, and the object retries later; once restorable, it goes on."""
    app = make_app()
    marker = tmp_path / "down"
    Flaky.closed.clear()

    @app.agent(name="four")
    async def four(run: perdure.Run) -> list[str]:
        got = [await run.resource(f"r{i}", Flaky(f"r{i}", str(marker if i == 3 else
                                                                tmp_path / "never")))
               for i in range(1, 5)]
        await run.sleep(0.05)
        return got

    handle = app.options(object_id="four-1").start("four")
    with app.background_worker():
        import time

        deadline = time.monotonic() + 10
        while not _bodies(app, "four-1", perdure.Kind.DORMANT):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        marker.touch()
        while not _bodies(app, "four-1", perdure.Kind.RESTORE_REPORT):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        first = _bodies(app, "four-1", perdure.Kind.RESTORE_REPORT)[0]
        marker.unlink()
        assert handle.result(timeout=15) == ["r1", "r2", "r3", "r4"]
    assert first["outcome"] == "rolled_back" and first["retry_at"] > 0
    statuses = [(e["name"], e["status"], e.get("rolled_back", False))
                for e in first["resources"]]
    assert statuses == [("r1", "restored", True), ("r2", "restored", True),
                        ("r3", "failed", False), ("r4", "not restored", False)]
    assert "ConnectionError: r3 unreachable" in first["resources"][2]["reason"]
    # Closed as the object went dormant (all four), then the rollback (the two restored).
    assert Flaky.closed[:6] == ["r4", "r3", "r2", "r1", "r2", "r1"]


class Versioned(Resource[str]):
    """Knows descriptor version 1 only, and a memory says 2."""

    async def open(self) -> str:
        return "v"

    def describe(self, live: str) -> dict[str, Any]:
        return {}

    @classmethod
    async def restore(cls, descriptor: dict[str, Any]) -> str:
        return "v"


def test_an_unknown_descriptor_version_parks(make_app: AppFactory) -> None:
    """Code meeting a descriptor version it does not know parks the object, saying so."""
    app = make_app()
    Versioned.versions = (2,)

    @app.agent(name="versioned")
    async def versioned(run: perdure.Run) -> str:
        got = await run.resource("v", Versioned())
        Versioned.versions = (1,)  # the next node runs older code
        await run.sleep(0.01)
        return got

    handle = app.options(object_id="ver-1").start("versioned")
    with app.background_worker(), pytest.raises(perdure.AgentParkedError):
        handle.result(timeout=10)
    [parked] = _bodies(app, "ver-1", perdure.Kind.PARKED)
    assert "descriptor version 2" in parked["reason"] and "knows version(s) 1" in parked["reason"]
    [report] = _bodies(app, "ver-1", perdure.Kind.RESTORE_REPORT)
    assert report["outcome"] == "parked"


def test_stale_file_invalidates_recorded_steps(make_app: AppFactory, tmp_path: Path) -> None:
    """A FileHash check sees an input file changed while the object slept: its policy
    invalidates the recorded steps from ``analyse`` on, which run again; memory keeps the
    first results and an ``invalidated`` record."""
    app = make_app()
    source = tmp_path / "input.txt"
    source.write_text("one")
    runs: list[str] = []

    def analyse() -> str:
        runs.append(source.read_text())
        return source.read_text().upper()

    @app.agent(name="analyst")
    async def analyst(run: perdure.Run) -> str:
        await run.resource("input", WorkingDirectory(
            tmp_path, checks=[FileHash(source)], on_stale=Invalidate("analyse")))
        result = await run.step(analyse, name="analyse")
        await run.sleep(0.2)
        return result

    handle = app.options(object_id="an-1").start("analyst")
    with app.background_worker():
        import time

        deadline = time.monotonic() + 10
        while not _bodies(app, "an-1", perdure.Kind.DORMANT):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        source.write_text("two")
        assert handle.result(timeout=15) == "TWO"
    assert runs == ["one", "two"]
    [inv] = _bodies(app, "an-1", perdure.Kind.INVALIDATED)
    assert inv["step"] == "analyse" and "input.txt changed" in inv["reason"]
    assert len(_bodies(app, "an-1", perdure.Kind.STEP_DONE)) == 2
    app.verify("an-1")


class Checked(Resource[str]):
    """Always stale after a restore, with policy from the declaration."""

    async def open(self) -> str:
        return "x"

    def describe(self, live: str) -> dict[str, Any]:
        return {}

    @classmethod
    async def restore(cls, descriptor: dict[str, Any]) -> str:
        return "x"

    @classmethod
    async def validate(cls, descriptor: dict[str, Any], live: str) -> Validity:
        return Stale("the world moved") if descriptor.get("stale", True) else Fresh()


@pytest.mark.parametrize("policy", ["park", "fail"])
def test_stale_policy_park_or_fail(make_app: AppFactory, policy: str) -> None:
    """A stale resource whose policy is ``park`` parks the object; ``fail`` fails it."""
    app = make_app()

    @app.agent(name="checked")
    async def checked(run: perdure.Run) -> str:
        await run.resource("c", Checked(on_stale=policy))
        await run.sleep(0.01)
        return "done"

    handle = app.options(object_id=f"ck-{policy}").start("checked")
    expected = perdure.AgentParkedError if policy == "park" else perdure.AgentFailedError
    with app.background_worker(), pytest.raises(expected) as caught:
        handle.result(timeout=10)
    assert "the world moved" in str(caught.value) or policy == "park"
    [report] = _bodies(app, f"ck-{policy}", perdure.Kind.RESTORE_REPORT)
    assert report["outcome"] == ("parked" if policy == "park" else "failed")
    assert report["resources"][0]["reason"] == "the world moved"


def test_bad_declarations_are_refused(make_app: AppFactory, tmp_path: Path) -> None:
    """Bad input to ``run.resource`` gets a typed error and memory stays intact."""
    with pytest.raises(perdure.ConfigurationError):
        Environment({"A=B": "x"})
    with pytest.raises(perdure.ConfigurationError):
        OpenFile(tmp_path / "f", "q")
    with pytest.raises(perdure.ConfigurationError):
        WorkingDirectory(tmp_path, on_stale="explode")
    app = make_app()

    @app.agent(name="bad")
    async def bad(run: perdure.Run) -> str:
        try:
            await run.resource("x", "not a recipe")  # type: ignore[arg-type]
        except perdure.ConfigurationError as exc:
            return str(exc)
        return "accepted"

    with app.background_worker():
        said = app.start("bad").result(timeout=10)
    assert "is not a perdure.resources.Resource" in said


def test_cli_show_prints_the_report_and_masks_secrets(make_app: AppFactory, store_url: str,
                                                      key_dir: Path, tmp_path: Path) -> None:
    """``perdure show`` prints the restore report; neither it nor ``--json`` shows a
    secret environment value, a secret header or a URL's password."""
    import subprocess
    import sys

    from perdure.resources import HttpSession

    app = make_app()

    @app.agent(name="secretive")
    async def secretive(run: perdure.Run) -> str:
        await run.resource("env", Environment({"PUBLIC": "p", "API_KEY": "canary-ab12"},
                                              secret=["API_KEY"]))
        await run.resource("api", HttpSession("http://user:canary-pw99@127.0.0.1:9/",
                                              headers={"Authorization": "Bearer canary-tk77"}))
        await run.sleep(0.01)
        return "ok"

    handle = app.options(object_id="sec-1").start("secretive")
    with app.background_worker():
        assert handle.result(timeout=10) == "ok"
    base = [sys.executable, "-m", "perdure", "--store", store_url, "--key-dir", str(key_dir)]
    import os

    wide = {**os.environ, "COLUMNS": "400"}
    text = subprocess.run([*base, "show", "sec-1"], capture_output=True, text=True,
                          check=True, timeout=60, env=wide).stdout
    data = subprocess.run([*base, "show", "sec-1", "--json"], capture_output=True, text=True,
                          check=True, timeout=60).stdout
    assert "restore restored" in text and "api restored" in text
    assert '"PUBLIC": "p"' in data and "***" in data
    for canary in ("canary-ab12", "canary-pw99", "canary-tk77"):
        assert canary not in text and canary not in data


def test_sync_agent_holding_and_release(make_app: AppFactory, tmp_path: Path) -> None:
    """A plain ``def`` agent holds resources too; a released resource is not restored at
    the next reentry, and ``async with run.holding(...)`` releases at the block's end."""
    app = make_app()

    @app.agent(name="sync_holder")
    def sync_holder(run: perdure.SyncRun) -> list[str]:
        where = run.resource("wd", WorkingDirectory(tmp_path / "sync"))
        run.resource("tmp", WorkingDirectory(tmp_path / "tmp"))
        run.release("tmp")
        run.sleep(0.02)
        return [str(where), str(run.resource("wd2", WorkingDirectory(tmp_path / "x")))]

    @app.agent(name="block_holder")
    async def block_holder(run: perdure.Run) -> str:
        async with run.holding("wd", WorkingDirectory(tmp_path / "block")) as where:
            await run.sleep(0.02)
            name = where.name
        await run.sleep(0.02)
        return name

    first = app.options(object_id="sync-1").start("sync_holder")
    second = app.options(object_id="block-1").start("block_holder")
    with app.background_worker():
        assert first.result(timeout=10) == [str(tmp_path / "sync"), str(tmp_path / "x")]
        assert second.result(timeout=10) == "block"
    [report] = _bodies(app, "sync-1", perdure.Kind.RESTORE_REPORT)
    assert [e["name"] for e in report["resources"]] == ["wd"]
    reports = _bodies(app, "block-1", perdure.Kind.RESTORE_REPORT)
    assert [[e["name"] for e in r["resources"]] for r in reports] == [["wd"]]


def test_a_program_missing_here_moves_the_object(make_app: AppFactory) -> None:
    """A subprocess whose program this node lacks: a negative capability in memory and
    the object is left to another node (it waits, ready, for one)."""
    from perdure.resources import Subprocess

    app = make_app()

    @app.agent(name="needs_tool")
    async def needs_tool(run: perdure.Run) -> str:
        await run.resource("tool", Subprocess(["no-such-program-perdure-test", "--serve"]))
        return "ran"

    app.options(object_id="tool-1").start("needs_tool")
    with app.background_worker():
        import time

        deadline = time.monotonic() + 10
        while not _bodies(app, "tool-1", perdure.Kind.CAPABILITY_MISSING):
            assert time.monotonic() < deadline
            time.sleep(0.01)
    [missing] = _bodies(app, "tool-1", perdure.Kind.CAPABILITY_MISSING)
    assert missing["cannot_do"] == "resource tool"
    assert "not installed on this node" in missing["reason"]
    assert app.get("tool-1").status == "ready"


class Broken(WorkingDirectory):
    """A buggy recipe: its descriptor lacks the path its restore needs."""

    def describe(self, live: Path) -> dict[str, Any]:
        return {"create": True}


def test_a_malformed_descriptor_parks_with_a_reason(make_app: AppFactory,
                                                    tmp_path: Path) -> None:
    """A descriptor that lacks what its recipe needs (here, written by a buggy recipe)
    parks the object after the restore fails for good, never guessing."""
    app = make_app()

    @app.agent(name="broken")
    async def broken(run: perdure.Run) -> str:
        await run.resource("wd", Broken(tmp_path / "b"))
        await run.sleep(0.01)
        return "unreachable"

    handle = app.options(object_id="broken-1").start("broken")
    with app.background_worker(), pytest.raises(perdure.AgentParkedError):
        handle.result(timeout=10)
    report = _bodies(app, "broken-1", perdure.Kind.RESTORE_REPORT)[-1]
    assert report["outcome"] == "parked"
    assert "KeyError" in report["resources"][0]["reason"]


def test_every_execution_state_body_decodes_to_its_bytes(make_app: AppFactory,
                                                         tmp_path: Path) -> None:
    """The resource, restore report, step checkpoint and invalidation records a worker
    writes decode to their typed bodies, which encode back to the very bytes stored."""
    from perdure.core.bodies import decode
    from perdure.core.codec import encode

    app = make_app()
    source = tmp_path / "in.txt"
    source.write_text("a")

    def long_step() -> int:
        perdure.current_step().checkpoint({"at": 1}, durable=True)
        return 1

    @app.agent(name="all_kinds")
    async def all_kinds(run: perdure.Run) -> int:
        await run.resource("wd", WorkingDirectory(tmp_path, checks=[FileHash(source)],
                                                  on_stale=Invalidate("long")))
        await run.step(long_step, name="long")
        if not run.replaying:
            source.write_text("b")
        await run.sleep(0.01)
        return 1

    handle = app.options(object_id="kinds-1").start("all_kinds")
    with app.background_worker():
        assert handle.result(timeout=10) == 1
    written = set()
    for rec in app.history("kinds-1"):
        typed = decode(rec)
        assert encode(typed.encode()) == rec.body_bytes
        written.add(str(rec.kind))
    # (progress markers live in checkpoint slots, outside the chain: engine.slots)
    assert {"resource", "restore_report", "invalidated"} <= written
