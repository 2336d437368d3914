"""Whatever goes wrong on the command line ends in one line and an exit code, never a
traceback: through the real ``perdure`` console script and ``python -m perdure``.

A Ctrl-C while perdure, click or rich are still being imported; a demo folder that
cannot be made; a missing extra; a port already in use (``ui`` and ``worker --ui``,
bound before anything is announced); and the wording of bad settings: a store URL
without a scheme, an ``--app`` attribute that does not exist, a PostgreSQL database
that does not exist.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pg import BACKENDS, url_for

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).parent / "perdure"
ENTRIES = {"script": [str(SCRIPT)], "module": [sys.executable, "-m", "perdure"]}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERDURE_")}
    env.update(PYTHONPATH=str(ROOT), COLUMNS="100", **extra)
    return env


def perdure(tmp_path: Path, *args: str, entry: str = "script",
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real command in ``tmp_path`` with its own key folder."""
    return subprocess.run([*ENTRIES[entry], "--key-dir", str(tmp_path / "keys"), *args],
                          cwd=tmp_path, env=env or _env(), capture_output=True, text=True,
                          timeout=120, check=False)


def error_line(done: subprocess.CompletedProcess[str], code: int = 1) -> str:
    """The single line on stderr of a command that failed with ``code``."""
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == code, done
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


# -- Ctrl-C during the first second -----------------------------------------------


@pytest.mark.parametrize("entry", sorted(ENTRIES))
@pytest.mark.parametrize("after", ["perdure._interrupt", "click", "rich"])
def test_ctrl_c_while_importing_is_one_line(tmp_path: Path, entry: str, after: str) -> None:
    """SIGINT sent as soon as ``after`` has been imported (perdure's first module, or
    the command line's libraries) ends the command without a traceback: ``interrupted``
    while importing, or exit 130 if the imports were done; killed by SIGINT either way."""
    proc = subprocess.Popen([*ENTRIES[entry], "--help"], cwd=tmp_path,
                            env=_env(PYTHONPROFILEIMPORTTIME="1"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    lines: list[str] = []
    for line in proc.stderr:  # -X importtime: one line per module, when it is imported
        lines.append(line)
        if line.rstrip().endswith(f"| {after}") or f"|   {after}" in line or (
                line.split("|")[-1].strip() == after):
            proc.send_signal(signal.SIGINT)
            break
    else:
        pytest.fail(f"{after} was never imported:\n{''.join(lines)}")
    rest, _ = proc.communicate(timeout=60)[1], None
    said = [line for line in rest.splitlines() if not line.startswith("import time:")]
    assert "Traceback" not in rest and "KeyboardInterrupt" not in rest, rest
    assert proc.returncode in (-signal.SIGINT, 130), (proc.returncode, said)
    assert said in ([], ["interrupted"]), said


# -- one line, for a folder, an extra, a port ---------------------------------------


def test_demo_in_a_folder_that_cannot_be_made(tmp_path: Path) -> None:
    """``perdure demo --dir /proc/x`` says what failed on which path."""
    line = error_line(perdure(tmp_path, "demo", "--dir", "/proc/perdure-demo/x"))
    assert "/proc/perdure-demo" in line


HIDE_OPENAI = """
import runpy, sys
class Hidden:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "openai":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Hidden())
sys.argv = ["perdure", *sys.argv[1:]]
runpy.run_module("perdure", run_name="__main__", alter_sys=True)
"""


def test_agent_demo_without_the_llm_extra(tmp_path: Path) -> None:
    """Without the ``openai`` package, ``perdure demo --agent`` names the install."""
    done = subprocess.run([sys.executable, "-c", HIDE_OPENAI, "demo", "--agent", "--dir",
                           str(tmp_path / "d")], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=120, check=False)
    assert "pip install 'perdure[llm]'" in error_line(done)


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another program listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_ui_on_a_port_in_use(tmp_path: Path, taken_port: int) -> None:
    """``perdure ui`` fails at once in one line, announcing no dashboard and issuing no
    token it would never show."""
    # ``ui`` only reads: its key folder needs a trusted root first (it never makes one).
    assert perdure(tmp_path, "keys", "init").returncode == 0
    done = perdure(tmp_path, "--store", f"sqlite:///{tmp_path / 's.db'}", "ui",
                   "--port", str(taken_port))
    assert "port is in use" in error_line(done, code=2)
    assert "dashboard on http" not in done.stderr + done.stdout
    assert not (tmp_path / "keys" / "ui-auth.json").exists()


def test_worker_ui_on_a_port_in_use(tmp_path: Path, taken_port: int) -> None:
    """``perdure worker --ui`` does not go on running without its dashboard."""
    done = perdure(tmp_path, "--store", f"sqlite:///{tmp_path / 's.db'}", "--app",
                   "perdure.demo:app", "worker", "--ui", "--ui-port", str(taken_port))
    assert done.returncode == 2, done
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1].startswith("error: cannot serve the dashboard")
    assert "dashboard on http" not in done.stderr


# -- the wording of bad settings -----------------------------------------------------


def test_a_store_path_without_scheme_gets_the_url_to_write(tmp_path: Path) -> None:
    """``--store agents.db`` suggests ``sqlite:///agents.db``."""
    line = error_line(perdure(tmp_path, "--store", "agents.db", "ls"))
    assert "sqlite:///agents.db" in line


def test_an_app_attribute_that_does_not_exist(tmp_path: Path) -> None:
    """``--app perdure.demo:nosuch`` says there is no such attribute, and names the Apps
    the module has."""
    line = error_line(perdure(tmp_path, "--app", "perdure.demo:nosuch", "ls"))
    assert "no attribute 'nosuch'" in line and "perdure.demo:app" in line
    assert "NoneType" not in line


@pytest.mark.skipif("postgresql" not in BACKENDS, reason="PostgreSQL not under test")
def test_a_missing_postgres_database_is_to_be_created(tmp_path: Path) -> None:
    """A database that does not exist is not something workers wait out: say create it."""
    line = error_line(perdure(tmp_path, "--store", url_for("perdure_no_such_db"), "ls"))
    assert "'perdure_no_such_db' does not exist; create it" in line
    assert "retry" not in line
