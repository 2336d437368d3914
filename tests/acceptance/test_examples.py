"""Every example, the README's walk-through and docs/quickstart.md, run as a user would.

Each runs in child processes, in an empty temporary folder with an empty ``$HOME`` and
``perdure`` on the ``PATH`` (this interpreter's environment, as ``. .venv/bin/activate``
gives a clone). The shell blocks are read from the documents themselves, so a changed
command is run as it now reads; between blocks the test only waits for what the prose
says to wait for.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pg import ADMIN_URL, BACKENDS, NO_SERVER

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p.name for p in (REPO_ROOT / "examples").glob("*.py")
                  if not p.name.startswith("_"))

# Examples with a test of their own (which runs the script and checks more than this can).
DEDICATED = {
    "approvals.py": "tests/integration/test_demo_agent.py",
    "coding_agent.py": "tests/acceptance/test_coding_agent_example.py",
    "model_call.py": "tests/integration/test_demo_llm.py",
}
# What each other example prints when it did what its docstring says.
PRINTS = {
    "composition.py": ["'intent_version': 2", "'total': 9", "digest-1.0 summarise@1 completed"],
    "http_api.py": ["event progress {'of': 2, 'round': 2}",
                    "asks Publish 4 words? ['yes', 'no']",
                    "'result': {'verdict': 'yes', 'words': 4}"],
    "in_doubt.py": ["result: order-7/0/charge", "charges in the ledger: 1"],
    "migration.py": ["61"],
    "quickstart.py": ["fetching pages about tides",
                      "{'approved': {'by': 'me'}, 'pages': ['tides-page-0', 'tides-page-1', "
                      "'tides-page-2']}"],
    "routing.py": ["render-1 -> painted 1 | paint on gpu-node",
                   "upload-1 -> uploaded report.pdf"],
    "versions.py": ["reshaped, version 1: diverges", "old-1 v1 DATA ['fetch', 'clean'] on node-a",
                    "new-2 v2 DATA ['check_quota', 'fetch', 'clean'] on node-b"],
}


@pytest.fixture
def user_env(tmp_path: Path) -> dict[str, str]:
    """A fresh user's environment: empty ``$HOME``, ``perdure`` and ``python`` on the PATH
    (and ``.venv`` in the folder, for a block that activates it)."""
    home = tmp_path / "home"
    home.mkdir()
    venv = Path(sys.prefix)
    (tmp_path / ".venv").symlink_to(venv, target_is_directory=True)
    bin_dir = Path(sys.executable).parent
    keep = {k: v for k, v in os.environ.items()
            if k in ("LANG", "LC_ALL", "TMPDIR", "PERDURE_TEST_PG")}
    return {**keep, "HOME": str(home), "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin",
            "PYTHONDONTWRITEBYTECODE": "1"}


def _run(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 180
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.mark.parametrize("name", [n for n in EXAMPLES if n not in DEDICATED])
def test_every_example_runs(name: str, tmp_path: Path, user_env: dict[str, str]) -> None:
    """``python examples/NAME`` exits 0 and prints what it says it does; an example that
    says to run it again (it answers from memory) does so."""
    if name == "migration.py" and "postgresql" not in BACKENDS:
        pytest.skip(NO_SERVER)
    assert name in PRINTS, f"say in PRINTS what examples/{name} prints when it works"
    args = [sys.executable, str(REPO_ROOT / "examples" / name)]
    if name == "migration.py":
        args.append(ADMIN_URL)
    done = _run(args, tmp_path, user_env)
    assert done.returncode == 0, done.stdout + done.stderr
    for needle in PRINTS[name]:
        assert needle in done.stdout, (needle, done.stdout)
    if "Run it again" in (REPO_ROOT / "examples" / name).read_text():
        again = _run(args, tmp_path, user_env)  # the finished object answers from memory
        assert again.returncode == 0, again.stdout + again.stderr
        assert PRINTS[name][-1] in again.stdout, again.stdout
        assert "fetching" not in again.stdout, "a recorded step ran again"


@pytest.mark.parametrize("name", sorted(DEDICATED))
def test_examples_with_their_own_test_are_run_there(name: str) -> None:
    text = (REPO_ROOT / DEDICATED[name]).read_text()
    assert f'"examples" / "{name}"' in text, f"{DEDICATED[name]} no longer runs {name}"


def _blocks(path: Path, section: str) -> list[str]:
    """The ``sh`` code blocks of ``section`` (a heading's text) in ``path``."""
    text = path.read_text()
    start = text.index(f"\n## {section}\n")
    end = text.find("\n## ", start + 1)
    body = text[start:end if end != -1 else len(text)]
    return re.findall(r"```sh\n(.*?)```", body, flags=re.S)


@pytest.fixture
def reaper() -> Iterator[list[subprocess.Popen[str]]]:
    """Process groups started by a test, killed when it ends (whatever happened)."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        if proc.stdout is not None:  # its pipe, read or not, is closed with the test
            proc.stdout.close()


def _shell(script: str, cwd: Path, env: dict[str, str],
           reaper: list[subprocess.Popen[str]]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(["bash", "-c", script], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    reaper.append(proc)
    return proc


def test_readme_walk_through(tmp_path: Path, user_env: dict[str, str],
                             reaper: list[subprocess.Popen[str]]) -> None:
    """README "Walk through it by hand", literally, where ``perdure demo`` ran: walk-1
    is killed mid-way, comes back, waits for approval, gets it, completes and verifies."""
    first, second = _blocks(REPO_ROOT / "README.md", "Walk through it by hand")
    demo = _run(["perdure", "demo"], tmp_path, user_env)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    # Between the blocks the README says to wait until `perdure show walk-1` prints
    # "waiting for event 'approval'": the test waits for exactly that, in the same shell.
    wait = ("for _ in $(seq 600); do perdure show walk-1 2>/dev/null | "
            "grep -q \"waiting for event 'approval'\" && break; sleep 0.1; done\n")
    proc = _shell("set -e\n" + first + wait + second, tmp_path, user_env, reaper)
    out, _ = proc.communicate(timeout=150)
    assert proc.returncode == 0, out
    assert "took back walk-1 from dead process" in out, out  # at once, as it says
    assert "sent 'approval' to walk-1" in out and '"approved_by": "you"' in out, out
    assert re.search(r"^ok +walk-1: \d+ records verified", out, flags=re.M), out
    reports = list((tmp_path / "demo-data" / "reports").glob("*.md"))
    assert len(reports) == 2, reports  # the demo's and walk-1's


def test_quickstart_doc(tmp_path: Path, user_env: dict[str, str],
                        reaper: list[subprocess.Popen[str]]) -> None:
    """docs/quickstart.md, literally: agents.py as printed, the worker command in one
    shell, the start/send/result/show/verify commands in another, then the Python way."""
    doc = REPO_ROOT / "docs" / "quickstart.md"
    text = doc.read_text()
    python = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    agents_py, from_python = python
    (tmp_path / "agents.py").write_text(agents_py)
    [setup] = _blocks(doc, "Set up")[:1]
    assert setup.split()[:2] == ["./dev", "demo"]  # a fresh clone's set-up: checked by hand
    [worker_cmd, commands] = _blocks(doc, "Run it")
    worker = _shell(worker_cmd, tmp_path, user_env, reaper)
    proc = _shell("set -e\n" + commands, tmp_path, user_env, reaper)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert "sent 'approval' to r-1" in out and '"tides-page-2"' in out, out
    assert re.search(r"^ok +r-1: \d+ records verified", out, flags=re.M), out
    script = "from agents import *  # the doc's agents.py\n" + from_python
    done = _run([sys.executable, "-c", script], tmp_path, user_env, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "tides-page-2" in done.stdout, done.stdout
    assert worker.poll() is None, "the worker of the first shell is still serving"
    os.killpg(worker.pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while worker.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert worker.returncode == 0, worker.communicate()[0]


def test_http_api_doc(tmp_path: Path, user_env: dict[str, str],
                      reaper: list[subprocess.Popen[str]]) -> None:
    """docs/howto/http-api.md "Try it", literally, from a folder holding ``examples/``:
    a worker and the API in the background, a token, an object started, followed,
    answered and awaited with curl, its stream picked up again after record 5."""
    setup, start, finish = _blocks(REPO_ROOT / "docs" / "howto" / "http-api.md", "Try it")
    (tmp_path / "examples").symlink_to(REPO_ROOT / "examples", target_is_directory=True)
    env = {**user_env, "PERDURE_API_PORT": str(_free_port())}
    # Between the blocks the doc says to wait until the API listens, then until the
    # agent asks: the test waits for exactly that, in the same shell.
    listening = ("for _ in $(seq 300); do curl -sf $API/openapi.json >/dev/null && break; "
                 "sleep 0.1; done\n")
    asking = ("for _ in $(seq 300); do curl -s $API/questions -H \"$AUTH\" | grep -q verdict "
              "&& break; sleep 0.1; done\n")
    proc = _shell("set -e\n" + setup + listening + start + asking + finish + "wait\n",
                  tmp_path, env, reaper)
    out, _ = proc.communicate(timeout=150)
    assert proc.returncode == 0, out
    assert '"created":true' in out and '"prompt":"Publish 4 words?"' in out, out
    assert '"result":{"verdict":"yes","words":4}' in out, out
    # Two streams: the first gets the 3 progress events and the end, the second each of
    # those after record 5 once more (their lines may interleave: count them).
    ids = [int(seq) for seq in re.findall(r"^id: (\d+)$", out, flags=re.M)]
    once = sorted(set(ids))
    assert len(once) == 4, out
    assert sorted(ids) == sorted(once + [i for i in once if i > 5]), out
    assert out.count("event: terminated") == 2, out


def test_webhooks_doc(tmp_path: Path, user_env: dict[str, str],
                      reaper: list[subprocess.Popen[str]]) -> None:
    """docs/howto/triggers.md "Webhooks", its "Try it" literally: a secret from openssl,
    a worker and the API in the background, a body signed with openssl and sent with
    curl twice (one object, the second answer says it was applied before), a forged one
    refused."""
    text = (REPO_ROOT / "docs" / "howto" / "triggers.md").read_text()
    section = text[text.index("\n### Try it\n"):text.index("\n## Not here\n")]
    setup, send = re.findall(r"```sh\n(.*?)```", section, flags=re.S)
    (tmp_path / "examples").symlink_to(REPO_ROOT / "examples", target_is_directory=True)
    env = {**user_env, "PERDURE_API_PORT": str(_free_port())}
    # Between the blocks the doc says nothing but to send: the test waits for the API
    # to listen, in the same shell.
    listening = ("for _ in $(seq 300); do curl -sf ${HOOK%/hooks/*}/openapi.json >/dev/null "
                 "&& break; sleep 0.1; done\n")
    proc = _shell("set -e\n" + setup + listening + send + "wait\n", tmp_path, env, reaper)
    out, _ = proc.communicate(timeout=150)
    assert proc.returncode == 0, out
    assert ('{"object_id":"reviews-delivery-1","applied":true,"delivery":"delivery-1"}'
            in out), out
    assert ('{"object_id":"reviews-delivery-1","applied":false,"delivery":"delivery-1"}'
            in out), out
    assert '"type":"urn:perdure:problem:bad-signature"' in out, out
    assert "reviews-delivery-1" in out and "review" in out, out


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
