"""Credentials in resources are secrets: sealed in the descriptor at rest, revealed only
to the live thing a restore brings back, never printed; on both stores."""

from __future__ import annotations

import asyncio
import http.server
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from click.testing import CliRunner

import perdure
from perdure import Secret
from perdure.cli import cli
from perdure.describe import timeline
from perdure.errors import ConfigurationError
from perdure.resources import Environment, HttpSession, PostgresSession, Subprocess
from tests.integration.test_secrets import RawSQL, raw, stored_bytes

__all__ = ["raw"]

MakeApp = Callable[..., perdure.App]
TOKEN = "tok-canary-7f3e91c2d4"
PASSWORD = "pw-canary-0a9b8c7d6e"
PG = "postgresql://postgres@127.0.0.1:5432/postgres"


class _Seen(http.server.BaseHTTPRequestHandler):
    auth: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        _Seen.auth.append(str(self.headers.get("authorization")))
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: Any) -> None:
        return


@pytest.fixture
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Seen)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    _Seen.auth.clear()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_resource_credentials_are_sealed_and_restored(make_app: MakeApp, raw: RawSQL,
                                                      server: str) -> None:
    """An environment secret, an HTTP auth header and a PostgreSQL password (in the URL)
    are nowhere in the store's bytes, nor in ``show``'s lines; after a dormancy the
    restored environment, client and session have them again."""
    app = make_app()

    @app.agent(name="creds")
    async def creds(run: perdure.Run) -> dict[str, Any]:
        env = await run.resource("env", Environment(
            {"API_KEY": Secret(TOKEN), "OTHER": PASSWORD, "MODE": "plain-mode"},
            secret=["OTHER"]))
        api = await run.resource("api", HttpSession(
            server, headers={"authorization": Secret(f"Bearer {TOKEN}"), "x-plain": "1"}))
        db = await run.resource("db", PostgresSession(
            PG.replace("postgres@", f"postgres:{PASSWORD}@"),
            settings={"application_name": "sealed-session"}))
        await run.sleep(0.05)  # dormant: the next reentry restores all three
        reply = await api.get("/")
        cur = await db.execute("SELECT current_setting('application_name')")
        row = await cur.fetchone()
        return {"env": env["API_KEY"] == Secret(TOKEN) and env["OTHER"] == Secret(PASSWORD),
                "status": reply.status_code, "session": row[0]}

    handle = app.options(object_id="creds-1").start("creds")
    with app.background_worker():
        result = handle.result(timeout=20)
    assert result == {"env": True, "status": 200, "session": "sealed-session"}
    assert _Seen.auth == [f"Bearer {TOKEN}"]  # the restored client sent the header
    [report] = [r.body for r in app.history("creds-1") if r.kind == "restore_report"]
    assert report["outcome"] == "restored"
    data = stored_bytes(raw)
    assert TOKEN.encode() not in data and PASSWORD.encode() not in data
    assert b"plain-mode" in data  # the search reads the descriptors
    held = [r.body for r in app.history("creds-1") if r.kind == "resource"]
    assert held[0]["descriptor"]["vars"]["API_KEY"] == {"perdure:sealed": held[0][
        "descriptor"]["vars"]["API_KEY"]["perdure:sealed"]}
    assert "@" in held[2]["descriptor"]["url"] and PASSWORD not in held[2]["descriptor"]["url"]
    shown = "\n".join(row.what for row in timeline(app.history("creds-1")))
    assert TOKEN not in shown and PASSWORD not in shown


def _serving(out: str, port: int) -> list[str]:
    """A dev server that writes the TOKEN it got to ``out`` and serves ``port``."""
    script = ("import os, sys, http.server as h\n"
              "with open(sys.argv[1], 'a') as f: f.write(os.environ['TOKEN'] + ';')\n"
              "h.ThreadingHTTPServer(('127.0.0.1', int(sys.argv[2])),"
              " h.SimpleHTTPRequestHandler).serve_forever()")
    return [sys.executable, "-c", script, out, str(port)]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_secret_from_an_environment_stays_sealed_where_it_travels(
        make_app: MakeApp, raw: RawSQL, store_url: str, key_dir: Path,
        tmp_path: Path) -> None:
    """The how-to's pattern: an ``Environment`` with a ``Secret`` handed to a
    ``Subprocess`` (its descriptor), then its value returned by a step, emitted and put
    in a progress note. The live environment keeps the value a ``Secret``, so it is
    sealed everywhere it went; the dev server gets it revealed, on open and on restore;
    neither the store nor ``perdure show`` holds it."""
    app = make_app()
    out, port = tmp_path / "seen", _free_port()

    @app.agent(name="devserver")
    async def devserver(run: perdure.Run) -> dict[str, Any]:
        env = await run.resource("env", Environment({"TOKEN": Secret(TOKEN),
                                                     "MODE": "plain-mode"}))
        await run.resource("server", Subprocess(
            _serving(str(out), port), env=env, ready={"http": f"http://127.0.0.1:{port}/"}))
        carried = await run.step(lambda: {"token": env["TOKEN"]}, name="carry")
        await run.emit("token", env["TOKEN"])
        await run.progress(token=env["TOKEN"])
        await run.sleep(0.05)  # dormant: the next reentry restores both
        return {"same": carried["token"] == Secret(TOKEN), "mode": env["MODE"],
                "kept": isinstance(env["TOKEN"], Secret)}

    handle = app.options(object_id="dev-1").start("devserver")
    with app.background_worker():
        result = handle.result(timeout=30)
    assert result == {"same": True, "mode": "plain-mode", "kept": True}
    assert out.read_text() == f"{TOKEN};{TOKEN};"  # opened, then restored
    [report] = [r.body for r in app.history("dev-1") if r.kind == "restore_report"]
    assert report["outcome"] == "restored"
    data = stored_bytes(raw)
    assert TOKEN.encode() not in data
    assert b"plain-mode" in data  # the search reads the descriptors
    [_, server] = [r.body for r in app.history("dev-1") if r.kind == "resource"][:2]
    assert set(server["descriptor"]["env"]["TOKEN"]) == {"perdure:sealed"}
    runner = CliRunner()
    for args in (["show", "dev-1", "--json"], ["show", "dev-1"], ["tail", "dev-1", "--json"],
                 ["result", "dev-1"]):
        done = runner.invoke(cli, ["--store", store_url, "--key-dir", str(key_dir), *args])
        assert done.exit_code == 0, (args, done.output)
        assert TOKEN not in done.output, args


def test_secret_url_and_password_arguments() -> None:
    """A URL given as a Secret stays one; ``password=`` wins over one in the URL; bad
    values are refused with a clear error."""
    whole = PostgresSession(Secret(PG))
    assert isinstance(whole.url, Secret) and whole.password is None
    split = PostgresSession("postgresql://ada:p%40ss@db.example:5433/app", password=None)
    assert split.url == "postgresql://ada@db.example:5433/app"
    assert split.password == Secret("p@ss")
    query = PostgresSession("postgresql://ada@db/app?sslmode=disable&password=q%26w")
    assert query.url == "postgresql://ada@db/app?sslmode=disable"
    assert query.password == Secret("q&w")
    given = PostgresSession("postgresql://ada:old@db/app", password=Secret("new"))
    assert given.password == Secret("new") and given.url == "postgresql://ada@db/app"
    with pytest.raises(ConfigurationError, match="postgresql://"):
        PostgresSession(Secret("mysql://x"))
    with pytest.raises(ConfigurationError, match="password"):
        PostgresSession(PG, password=Secret(3))  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="Secret strings"):
        Environment({"K": Secret(3)})  # type: ignore[dict-item]
    with pytest.raises(ConfigurationError, match="env values"):
        Subprocess(["true"], env={"K": Secret(3)})  # type: ignore[dict-item]
    env = Environment({"K": Secret("zq-hidden"), "P": "p"}, secret=["Q"])
    assert env.secret == ["K", "Q"] and env.variables == {"K": Secret("zq-hidden"), "P": "p"}
    described = env.describe(dict(env.variables))
    assert described["vars"] == {"K": Secret("zq-hidden"), "P": "p"}
    assert "zq-hidden" not in repr(described)


def test_a_subprocess_gets_its_secret_environment(tmp_path: Path) -> None:
    """A ``Subprocess`` env value given as a Secret stays one in the descriptor and
    reaches the process revealed, on open and on restore."""
    asyncio.run(_subprocess_secret(tmp_path))


async def _subprocess_secret(tmp_path: Path) -> None:
    out = tmp_path / "seen"
    argv = [sys.executable, "-c",
            f"import os, time\nwith open({str(out)!r}, 'a') as f: f.write(os.environ['K'] + ';')"
            "\ntime.sleep(30)"]
    recipe = Subprocess(argv, env={"K": Secret("zq-env-value")})
    live = await recipe.open()
    try:
        await _until_written(out, 1)
        descriptor = recipe.describe(live)
        assert descriptor["env"] == {"K": Secret("zq-env-value")}
        assert "zq-env-value" not in repr(descriptor)
    finally:
        await Subprocess.close(live)
    again = await Subprocess.restore(descriptor)
    try:
        await _until_written(out, 2)
        assert out.read_text() == "zq-env-value;zq-env-value;"
    finally:
        await Subprocess.close(again)


async def _until_written(out: Path, count: int) -> None:
    """Wait until the child processes wrote ``count`` values (the file exists as soon as one
    opens it, before its write lands), up to a minute on a loaded machine."""
    deadline = time.monotonic() + 60
    while not (out.exists() and out.read_text().count(";") >= count):
        assert time.monotonic() < deadline, f"the subprocess wrote {count} value(s) in a minute"
        await asyncio.sleep(0.02)


def test_connection_errors_never_quote_the_credentials() -> None:
    """A session that cannot open says why without its password or secret URL."""
    bad = PostgresSession(Secret(f"postgresql://u:{PASSWORD}@127.0.0.1:5432/x?bogus=1"))
    with pytest.raises(ConfigurationError) as refused:
        asyncio.run(bad.open())
    assert PASSWORD not in str(refused.value) and "bogus" in str(refused.value)
    down = PostgresSession("postgresql://u@127.0.0.1:1/x", password=Secret(PASSWORD))
    with pytest.raises(ConnectionError) as failed:
        asyncio.run(down.open())
    assert PASSWORD not in str(failed.value)
