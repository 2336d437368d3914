"""Staleness checks and the built-in recipes' own validation, against real things: a git
repository, files, a PostgreSQL database, an HTTP server, a clock."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from perdure.resources import (
    ExpiresAt,
    FileHash,
    Fresh,
    GitHead,
    HttpSession,
    OpenFile,
    PostgresSession,
    SchemaVersion,
    Stale,
    Subprocess,
    WorkingDirectory,
)
from tests.pg import fresh_database, needs_server

GIT = shutil.which("git") or "git"


def _git(repo: Path, *args: str) -> None:
    subprocess.run([GIT, "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
                   cwd=repo, check=True, capture_output=True)


def test_git_head_and_file_hash_see_the_world_move(tmp_path: Path) -> None:
    """A new commit makes GitHead stale; a changed or deleted file makes FileHash stale;
    a refresh (recapture) makes both fresh again."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "a.txt").write_text("one")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "first")
    recipe = WorkingDirectory(repo, create=False, checks=[GitHead(repo), FileHash(repo / "a.txt")])

    async def scenario() -> None:
        live = await recipe.open()
        from perdure.resources.checks import see_all

        descriptor = {**recipe.describe(live), "checks": await see_all(recipe.checks, live)}
        assert await WorkingDirectory.validate(descriptor, live) == Fresh()
        (repo / "a.txt").write_text("two")
        _git(repo, "commit", "-qam", "second")
        stale = await WorkingDirectory.validate(descriptor, live)
        assert isinstance(stale, Stale)
        assert "git HEAD of" in stale.reason and "a.txt changed" in stale.reason
        fresh = await WorkingDirectory.recapture(descriptor, live)
        assert await WorkingDirectory.validate(fresh, live) == Fresh()
        (repo / "a.txt").unlink()
        gone = await WorkingDirectory.validate(fresh, live)
        assert isinstance(gone, Stale) and "a.txt is gone" in gone.reason

    asyncio.run(scenario())


def test_expired_credential_is_stale() -> None:
    """ExpiresAt is fresh before its time and stale after, naming when it expired."""
    async def scenario() -> None:
        from perdure.resources.checks import run_checks, see_all

        soon = ExpiresAt(time.time() + 0.05)
        descriptor = {"checks": await see_all([soon], None)}
        assert await run_checks(descriptor, None) == Fresh()
        await asyncio.sleep(0.06)
        expired = await run_checks(descriptor, None)
        assert isinstance(expired, Stale) and "credential expired at" in expired.reason

    asyncio.run(scenario())


@needs_server
def test_postgres_session_settings_and_schema_version() -> None:
    """A PostgresSession restores its settings; SchemaVersion sees a migration land; a
    session whose settings were changed under it is stale."""
    with fresh_database(migrated=False) as url:
        recipe = PostgresSession(url, settings={"search_path": "app, public",
                                                "statement_timeout": "5s"},
                                 checks=[SchemaVersion("SELECT count(*) FROM pg_tables "
                                                       "WHERE schemaname = 'public'")])

        async def scenario() -> None:
            from perdure.resources.checks import see_all

            live = await recipe.open()
            descriptor = {**recipe.describe(live), "checks": await see_all(recipe.checks, live)}
            await live.close()
            again = await PostgresSession.restore(descriptor)
            try:
                cur = await again.execute("SELECT current_setting('statement_timeout')")
                assert (await cur.fetchone()) == ("5s",)
                assert await PostgresSession.validate(descriptor, again) == Fresh()
                await again.execute("CREATE TABLE public.migrated (id int)")
                stale = await PostgresSession.validate(descriptor, again)
                assert isinstance(stale, Stale) and "schema version changed" in stale.reason
                await again.execute("SET statement_timeout = '9s'")
                moved = await PostgresSession.validate(descriptor, again)
                assert isinstance(moved, Stale) and "statement_timeout" in moved.reason
            finally:
                await PostgresSession.close(again)

        asyncio.run(scenario())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_subprocess_and_http_session(tmp_path: Path) -> None:
    """A Subprocess is probed until it answers; a dead one is stale; an HttpSession's
    check path answering 404 is stale, 200 fresh; closing leaves no process behind."""
    port = _free_port()
    (tmp_path / "ok.txt").write_text("ok")
    server = Subprocess([sys.executable, "-m", "http.server", str(port), "--bind",
                         "127.0.0.1"], cwd=tmp_path,
                        ready={"http": f"http://127.0.0.1:{port}/"}, ready_timeout=20)

    async def scenario() -> None:
        live = await server.open()
        try:
            assert await Subprocess.validate(server.describe(live), live) == Fresh()
            good = HttpSession(f"http://127.0.0.1:{port}", check="/ok.txt")
            client = await good.open()
            assert await HttpSession.validate(good.describe(client), client) == Fresh()
            bad = {**good.describe(client), "check": "/missing"}
            stale = await HttpSession.validate(bad, client)
            assert isinstance(stale, Stale) and "404" in stale.reason
            await HttpSession.close(client)
        finally:
            await Subprocess.close(live)
        assert live.popen.poll() is not None
        dead = await Subprocess.validate(server.describe(live), live)
        assert isinstance(dead, Stale) and "exited" in dead.reason

    asyncio.run(scenario())


def test_a_server_that_never_gets_ready_times_out_and_is_stopped(tmp_path: Path) -> None:
    """A readiness probe that never succeeds fails the open with a TimeoutError (retried
    with backoff on reentry) and the started process is stopped."""
    recipe = Subprocess([sys.executable, "-c", "import time; time.sleep(60)"],
                        ready={"tcp": ["127.0.0.1", _free_port()]}, ready_timeout=0.3)

    async def scenario() -> None:
        with pytest.raises(TimeoutError):
            await recipe.open()

    asyncio.run(scenario())


def test_open_file_is_stale_when_its_prefix_changed(tmp_path: Path) -> None:
    """The bytes before the recorded position are checked: rewriting them is stale; a
    file shorter than the position is stale too."""
    path = tmp_path / "f.txt"
    recipe = OpenFile(path, "w")

    async def scenario() -> None:
        live = await recipe.open()
        live.write("hello world")
        descriptor = recipe.describe(live)
        await OpenFile.close(live)
        again = await OpenFile.restore(descriptor)
        assert await OpenFile.validate(descriptor, again) == Fresh()
        await OpenFile.close(again)
        path.write_text("HELLO world")
        again = await OpenFile.restore(descriptor)
        changed = await OpenFile.validate(descriptor, again)
        assert isinstance(changed, Stale) and "changed" in changed.reason
        await OpenFile.close(again)
        path.write_text("hi")
        again = await OpenFile.restore(descriptor)
        short = await OpenFile.validate(descriptor, again)
        assert isinstance(short, Stale) and "shorter" in short.reason
        await OpenFile.close(again)

    asyncio.run(scenario())
