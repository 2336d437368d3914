"""Bad input and a hostile environment give typed errors that say what to do.

Each case is checked through the API (the exception type and its message) and,
where a person would meet it, through the ``perdure`` CLI: exit code 1, one
``error: ...`` line on stderr, and no traceback.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

import perdure
from perdure.errors import (
    ConfigurationError,
    ObjectNotFoundError,
    ObjectTerminatedError,
    SerializationError,
    StoreCorruptError,
    StoreError,
    UnknownAgentError,
)
from perdure.stores import Store, open_store
from perdure.stores.sqlite import SQLiteStore
from tests.pg import needs_server, url_for

MakeApp = Callable[..., perdure.App]



AGENTS_MODULE = textwrap.dedent(
    """
    import perdure

    app = perdure.App(store="sqlite:///never-used.db")


    @app.agent(name="hello")
    def hello(run: perdure.SyncRun, who: str) -> str:
        return f"hello {who}"
    """
)


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "perdure", *args],
        capture_output=True, text=True, timeout=60, check=False, cwd=cwd,
    )


def _one_error_line(done: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Assert the CLI failed with exit 1 and exactly one ``error:`` line holding ``needles``."""
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def cli_dir(tmp_path: Path) -> Path:
    """A working folder holding ``agents.py`` (an App with the agent ``hello``)."""
    (tmp_path / "agents.py").write_text(AGENTS_MODULE)
    return tmp_path


def _greet(who: str) -> str:
    return f"hi {who}"


@pytest.fixture
def app(make_app: MakeApp) -> perdure.App:
    """An App with one agent, ``greet``, that finishes at once."""
    built = make_app()

    @built.agent(name="greet")
    async def greet(run: perdure.Run, who: str) -> str:
        return await run.step(_greet, who)

    return built


# -- agents, arguments and events --------------------------------------------------------


def test_start_unknown_agent(app: perdure.App) -> None:
    """Starting an agent name nobody registered says which agents exist; nothing is stored."""
    with pytest.raises(UnknownAgentError, match=r"'nope' is not registered.*greet"):
        app.options(object_id="o-1").start("nope")

    def stray(run: perdure.Run) -> None: ...

    with pytest.raises(UnknownAgentError, match=r"@app\.agent"):
        app.start(stray)
    assert app.store.get("o-1") is None


def test_cli_start_unknown_agent(cli_dir: Path) -> None:
    """``perdure start`` of an unknown agent fails in one line naming the registered ones."""
    url = f"sqlite:///{cli_dir / 'cli.db'}"
    done = _cli(cli_dir, "--store", url, "--key-dir", str(cli_dir / "keys"), "--app",
                "agents:app", "start", "nope")
    _one_error_line(done, "'nope'", "hello")


@pytest.mark.parametrize("bad", [object(), {1, 2}, float("nan"), b"bytes", {"k": (1, object())}])
def test_start_with_non_json_args(app: perdure.App, bad: object) -> None:
    """Arguments that are not JSON values raise SerializationError and create nothing."""
    with pytest.raises(SerializationError, match="JSON"):
        app.options(object_id="o-1").start("greet", bad)
    assert app.store.get("o-1") is None


def test_send_non_json_payload(app: perdure.App) -> None:
    """An event payload that is not JSON raises SerializationError and queues nothing."""
    app.options(object_id="o-1").start("greet", "ana")
    with pytest.raises(SerializationError, match="payload of event 'go'"):
        app.send("o-1", "go", {"when": time})
    assert app.store.pending_events("o-1") == []


def test_send_to_unknown_and_terminated(app: perdure.App) -> None:
    """Events to an unknown or finished object raise and are not queued."""
    with pytest.raises(ObjectNotFoundError, match="'ghost'"):
        app.send("ghost", "go", 1)
    handle = app.options(object_id="o-1").start("greet", "ana")
    with app.background_worker():
        assert handle.result(timeout=10) == "hi ana"
    with pytest.raises(ObjectTerminatedError, match="'o-1' has completed"):
        app.send("o-1", "go", 1)
    with pytest.raises(ObjectTerminatedError):
        app.cancel("o-1")
    assert app.store.pending_events("o-1") == []


def test_cli_bad_json_and_unknown_object(cli_dir: Path) -> None:
    """The CLI refuses non-JSON ``--args`` and a send to an unknown id in one line each."""
    url = f"sqlite:///{cli_dir / 'cli.db'}"
    common = ("--store", url, "--key-dir", str(cli_dir / "keys"))
    done = _cli(cli_dir, *common, "--app", "agents:app", "start", "hello", "--args", "[1,")
    _one_error_line(done, "--args is not valid JSON")
    done = _cli(cli_dir, *common, "send", "ghost", "go", "{bad")
    _one_error_line(done, "PAYLOAD is not valid JSON")
    # a send needs a key folder with a trusted root (reading commands never make one)
    assert _cli(cli_dir, *common, "keys", "init").returncode == 0
    done = _cli(cli_dir, *common, "send", "ghost", "go", "1")
    _one_error_line(done, "no object 'ghost'")


# -- store URLs and folders -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "hint"),
    [
        ("mysql://db/agents", "use sqlite:///FILE"),
        ("agents.db", "has no scheme; for a SQLite file write sqlite:///agents.db"),
        ("sqlite://host/agents.db", "use sqlite:///relative.db"),
        ("sqlite:///", "use sqlite:///agents.db"),
        ("sqlite:///agents.db?journal=off", "known: synchronous, busy_timeout"),
        ("sqlite:///agents.db?busy_timeout=soon", "busy_timeout must be seconds"),
        ("postgresql://localhost/perdure?pool_size=many", "pool_size must be a whole number"),
        ("postgresql://localhost/perdure?pool_size=0", "at least 1"),
        ("postgresql://localhost/perdure?connect_timeout_s=-1", "connect_timeout_s must be"),
    ],
)
def test_bad_store_urls(url: str, hint: str, tmp_path: Path,
                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad store URL is a ConfigurationError that names the URL and the fix."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigurationError) as caught:
        open_store(url)
    assert hint in str(caught.value)
    assert url in str(caught.value)
    assert list(tmp_path.iterdir()) == []


def _pg_url(database: str, **options: str) -> str:
    """The test server's URL pointed at ``database``, with query ``options``."""
    query = "&".join(f"{key}={value}" for key, value in options.items())
    return url_for(database) + (f"?{query}" if query else "")


def _free_port() -> int:
    """A local TCP port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _refused_url() -> str:
    """The test server's URL moved to a local port where nothing listens."""
    parts = urlsplit(url_for("postgres"))
    user = f"{parts.username}@" if parts.username else ""
    return urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{_free_port()}",
                                     query="connect_timeout_s=2"))


@needs_server
@pytest.mark.parametrize(
    ("which", "needles"),
    [
        ("unknown-database", ("the database 'perdure_no_such_db' does not exist",
                              "createdb perdure_no_such_db")),
        ("refused-port", ("Connection refused", "check the server and the URL")),
    ],
)
def test_unreachable_postgres_urls(which: str, needles: tuple[str, ...]) -> None:
    """A PostgreSQL URL naming a missing database or a port nobody listens on fails at
    once with a StoreError giving the server's reason and where it looked."""
    url = _pg_url("perdure_no_such_db") if which == "unknown-database" else _refused_url()
    began = time.monotonic()
    with pytest.raises(StoreError) as caught:
        open_store(url)
    assert time.monotonic() - began < 3.0
    assert not isinstance(caught.value, StoreCorruptError)
    message = str(caught.value)
    assert message.startswith("PostgreSQL at ")
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message


@needs_server
def test_cli_unreachable_postgres(tmp_path: Path) -> None:
    """The CLI against an unreachable PostgreSQL prints one ``error:`` line (no traceback,
    no connection-pool warnings) and exits 1; so does one naming a missing database."""
    done = _cli(tmp_path, "--store", _refused_url(), "--key-dir", str(tmp_path / "keys"), "ls")
    _one_error_line(done, "error: PostgreSQL at 127.0.0.1:", "Connection refused")
    assert done.stdout == ""
    done = _cli(tmp_path, "--store", _pg_url("perdure_no_such_db"), "--key-dir",
                str(tmp_path / "keys"), "verify", "--all")
    _one_error_line(done, "perdure_no_such_db", "does not exist")


INSTALL_HINT_CHILD = textwrap.dedent(
    """
    import sys
    sys.modules["psycopg"] = None  # as if perdure[postgres] were not installed
    sys.modules["psycopg_pool"] = None
    from perdure.errors import ConfigurationError
    from perdure.stores import open_store
    try:
        open_store("postgresql://postgres@127.0.0.1:5432/perdure")
    except ConfigurationError as exc:
        print(exc)
    else:
        print("opened")
    """
)


def test_missing_psycopg_gives_the_install_hint(tmp_path: Path) -> None:
    """Without psycopg installed, a PostgreSQL URL is a ConfigurationError saying how to
    install it; the SQLite store still works in that environment."""
    done = subprocess.run([sys.executable, "-c", INSTALL_HINT_CHILD], capture_output=True,
                          text=True, timeout=60, check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "pip install 'perdure[postgres]'" in done.stdout, done.stdout
    assert "psycopg" in done.stdout
    lite = textwrap.dedent(
        """
        import sys
        sys.modules["psycopg"] = None
        from perdure.stores import open_store
        open_store("sqlite:///lite.db").close()
        print("sqlite ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", lite], capture_output=True, text=True,
                          timeout=60, check=False, cwd=tmp_path)
    assert done.stdout.strip() == "sqlite ok", done.stderr


def test_cli_bad_store_url(tmp_path: Path) -> None:
    """The CLI reports a bad store URL in one line with the fix."""
    done = _cli(tmp_path, "--store", "mysql://db/agents", "ls")
    _one_error_line(done, "unknown scheme", "use sqlite:///FILE")


def test_store_folder_missing(tmp_path: Path) -> None:
    """A store file in a folder that does not exist fails, names the folder, creates nothing."""
    missing = tmp_path / "nope" / "deeper"
    with pytest.raises(StoreError, match="does not exist; create it first") as caught:
        open_store(f"sqlite:///{missing / 'a.db'}")
    assert str(missing) in str(caught.value)
    assert not (tmp_path / "nope").exists()
    done = _cli(tmp_path, "--store", f"sqlite:///{missing / 'a.db'}", "ls")
    _one_error_line(done, "does not exist")


# -- disk full (SQLite only: the cap is SQLite's max_page_count) -------------------------


@pytest.fixture
def sqlite_app(make_sqlite_app: MakeApp) -> perdure.App:
    """The ``greet`` App on a SQLite store file."""
    built = make_sqlite_app()

    @built.agent(name="greet")
    async def greet(run: perdure.Run, who: str) -> str:
        return await run.step(_greet, who)

    return built


def _limit_pages(store: Store, extra: int | None) -> None:
    """Cap the SQLite store's file at its current size plus ``extra`` pages (None: lift it).

    ``PRAGMA max_page_count`` is per connection, so it is set on the store's two
    write connections (the write thread's and the event loop's), under the store's
    write lock. Writes that need a page past the cap fail with SQLITE_FULL, as on a
    full disk.
    """
    assert isinstance(store, SQLiteStore)
    with store._wlock:
        for conn in (store._w, store._w_now):
            if extra is None:
                conn.execute("PRAGMA max_page_count=4294967294")
            else:
                pages = conn.execute("PRAGMA page_count").fetchone()[0]
                conn.execute(f"PRAGMA max_page_count={pages + extra}")


def test_disk_full_is_a_typed_store_error(sqlite_app: perdure.App) -> None:
    """A full disk gives a StoreError saying so; nothing half-written, older objects verify."""
    app = sqlite_app
    done = [app.options(object_id=f"done-{k}").start("greet", f"p{k}") for k in range(3)]
    with app.background_worker():
        for handle in done:
            handle.result(timeout=10)
    _limit_pages(app.store, 0)
    error: StoreError | None = None
    started = 0
    for k in range(2000):
        try:
            app.options(object_id=f"new-{k}").start("greet", "x" * 500)
            started += 1
        except StoreError as exc:
            error = exc
            failed = f"new-{k}"
            break
    assert error is not None, "the capped store never filled up"
    assert not isinstance(error, StoreCorruptError)
    assert "the disk is full" in str(error) and "nothing was written" in str(error)
    assert app.store.get(failed) is None
    assert app.store.records(failed) == []
    for object_id in [h.object_id for h in done] + [f"new-{k}" for k in range(started)]:
        assert app.verify(object_id).ok, object_id

    _limit_pages(app.store, None)
    app.options(object_id=failed).start("greet", "x" * 500)
    assert app.verify(failed).ok


def _pad(i: int) -> str:
    return f"{i:04d}-" + "x" * 300


STEPS = 25


@pytest.fixture
def capture(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Log records of perdure at INFO and above."""
    with caplog.at_level(logging.INFO, logger="perdure"):
        yield caplog


def test_worker_on_a_full_disk_loses_nothing(make_sqlite_app: MakeApp,
                                             capture: pytest.LogCaptureFixture) -> None:
    """A worker whose commits hit a full disk logs it in one line (no traceback).

    Records stored before the disk filled stay, and every object finishes with a
    verifying chain once space is back.
    """
    app = make_sqlite_app(lease_seconds=2.0)

    @app.agent(name="filler")
    async def filler(run: perdure.Run, n: int) -> list[str]:
        return [await run.step(_pad, i) for i in range(n)]

    ids = [f"fill-{k}" for k in range(4)]
    for object_id in ids:
        app.options(object_id=object_id).start(filler, STEPS)
    _limit_pages(app.store, 1)
    with app.background_worker():
        deadline = time.monotonic() + 10
        while not [r for r in capture.records if getattr(r, "action", "") == "store_down"]:
            assert time.monotonic() < deadline, "the worker never hit the full disk"
            time.sleep(0.01)
        time.sleep(0.3)  # well inside one lease: no object has been retried yet
        stored = {object_id: app.store.records(object_id) for object_id in ids}
        down = [r for r in capture.records if r.levelno >= logging.ERROR]
        # One line per failed group commit at most, never a traceback or one per step.
        assert 1 <= len(down) <= len(ids), [r.getMessage() for r in down]
        for record in down:
            assert getattr(record, "action", "") == "store_down"
            assert record.exc_info is None
            assert "disk is full" in record.getMessage()
            assert "\n" not in record.getMessage()
        assert sum(len(records) for records in stored.values()) < len(ids) * (STEPS + 2)

        _limit_pages(app.store, None)
        results = [app.handle(object_id).result(timeout=20) for object_id in ids]
    assert results == [[_pad(i) for i in range(STEPS)]] * len(ids)
    for object_id in ids:
        records = app.store.records(object_id)
        assert records[: len(stored[object_id])] == stored[object_id]
        assert len(records) == STEPS + 2
        assert app.verify(object_id).ok
