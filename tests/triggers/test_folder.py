"""Folder triggers on real files: each file version starts one object, once, across
watcher restarts; a file still being written is not taken."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import perdure
from perdure import ConfigurationError
from perdure.triggers import Triggers
from perdure.triggers.folder import FolderWatch
from tests.triggers import trigger_app
from tests.triggers.support import job_ids, running, said, wait_until


@pytest.fixture
def app(tmp_path: Path) -> Iterator[perdure.App]:
    """The trigger tests' App (agent ``take``: a file's path) on this test's SQLite
    store."""
    made = trigger_app.app.with_settings(store=f"sqlite:///{tmp_path / 'store.db'}",
                                         key_dir=tmp_path / "keys")
    yield made
    made.close()


def paths(app: perdure.App) -> list[str]:
    """The file each object of ``take`` was started with, sorted."""
    return sorted(app.history(oid)[0].body["intent"]["args"][0]
                  for oid in job_ids(app, "take"))


def test_each_file_starts_one_object_once_across_restarts(
        tmp_path: Path, app: perdure.App, caplog: pytest.LogCaptureFixture) -> None:
    """Three files, three objects; the watcher started again starts none of them again;
    a file written again is a new version and starts one more; hidden files and names
    the pattern leaves out are left alone."""
    caplog.set_level(logging.INFO, logger="perdure.triggers")
    inbox = tmp_path / "inbox"
    (inbox / "sub").mkdir(parents=True)
    for name in ("a.txt", "b.txt", "sub/c.txt"):
        (inbox / name).write_text(name)
    (inbox / ".d.txt.part").write_text("hidden")
    (inbox / "e.tmp").write_text("not matched")
    triggers = Triggers()
    triggers.folder(inbox, agent="take", pattern="*.txt", recursive=True, interval=0.02)
    with running(triggers, app):
        wait_until("three objects", lambda: len(job_ids(app, "take")) == 3)
    assert paths(app) == sorted(str(inbox.resolve() / n) for n in ("a.txt", "b.txt",
                                                                    "sub/c.txt"))
    first = job_ids(app, "take")
    assert all(oid.startswith("folder-inbox-") for oid in first)
    labels = app.history(first[0])[0].body["context"]["labels"]
    assert labels["trigger"] == "folder-inbox" and labels["file"].endswith(".txt")
    caplog.clear()
    with running(triggers, app):
        wait_until("the restarted watcher to find the three",
                   lambda: said(caplog).count("was started before") == 3)
    assert job_ids(app, "take") == first
    a = inbox / "a.txt"
    a.write_text("a, written again")
    os.utime(a, ns=(a.stat().st_atime_ns, a.stat().st_mtime_ns + 1_000_000))
    with running(triggers, app):
        wait_until("a fourth object", lambda: len(job_ids(app, "take")) == 4)
    assert set(first) < set(job_ids(app, "take"))


def test_a_file_still_being_written_is_not_taken(tmp_path: Path, app: perdure.App) -> None:
    """Looks one after another: a file that grew since the look before is not taken;
    once it looks the same twice it is, once."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    triggers = Triggers()
    trigger = triggers.folder(inbox, agent="take", interval=0.05)
    watch = FolderWatch(trigger, app)
    growing = inbox / "big.csv"

    async def steps() -> None:
        with growing.open("w") as out:
            out.write("a,b\n")
            out.flush()
            assert await watch.look(1.0) == []  # first seen
            out.write("1,2\n" * 1000)
            out.flush()
            assert await watch.look(2.0) == []  # grew since the look before
            assert job_ids(app, "take") == []
        started = await watch.look(3.0)  # the same size and time as at 2.0: taken
        assert len(started) == 1
        assert await watch.look(4.0) == []  # taken once

    asyncio.run(steps())
    assert paths(app) == [str(growing.resolve())]
    assert growing.stat().st_size == 4 + 4 * 1000


def test_settle_waits_for_a_quiet_file(tmp_path: Path, app: perdure.App) -> None:
    """With ``settle``, a file must also stay unchanged that many seconds."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "x.txt").write_text("x")
    triggers = Triggers()
    watch = FolderWatch(triggers.folder(inbox, agent="take", settle=5.0), app)

    async def steps() -> None:
        assert await watch.look(100.0) == []
        assert await watch.look(101.0) == []  # unchanged, but for 1 s only
        assert len(await watch.look(105.0)) == 1

    asyncio.run(steps())


def test_a_missing_folder_is_one_clear_error(tmp_path: Path, app: perdure.App) -> None:
    """Running a folder trigger on a folder that is not there fails with its name."""
    triggers = Triggers()
    triggers.folder(tmp_path / "nowhere", agent="take")
    with pytest.raises(ConfigurationError, match="nowhere is not a folder"), \
            running(triggers, app):
        pass
