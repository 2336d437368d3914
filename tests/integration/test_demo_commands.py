"""The commands ``perdure demo`` prints work as typed, in a fresh shell with an empty
``$HOME``: the key folder follows the SQLite store (``keys/`` beside the database), and
a command that only reads or answers never makes a root of its own."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import perdure


def _shell(home: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``perdure ARGS`` as a fresh shell runs it: no PERDURE_* settings, an empty HOME."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERDURE_")}
    env["HOME"] = str(home)
    return subprocess.run([sys.executable, "-m", "perdure", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_the_commands_the_demo_prints_work_in_a_fresh_shell(tmp_path: Path) -> None:
    """After ``perdure demo``, its printed ``perdure --store ... show`` and the same store
    with ``verify``, ``result`` and ``approvals`` exit 0 and say what the workers wrote,
    with nothing made in the empty home folder; pointed at a key folder of another root,
    ``verify`` says who certified nothing (not "bad"); with no keys beside the store,
    reading commands refuse in one line naming the folder, and make none."""
    home = tmp_path / "home"
    home.mkdir()
    demo = _shell(home, tmp_path, "demo", "--dir", "demo-data")
    assert demo.returncode == 0, demo.stdout + demo.stderr
    printed = re.search(r"Look closer: (perdure .+)$", demo.stdout, re.MULTILINE)
    assert printed, demo.stdout
    command = shlex.split(printed[1])
    assert command[:2] == ["perdure", "--store"] and command[-2:] == ["show", "demo-1"]
    store = command[2]

    shown = _shell(home, tmp_path, *command[1:])
    assert shown.returncode == 0, shown.stderr
    assert "completed" in shown.stdout and "demo-node-b" in shown.stdout
    verified = _shell(home, tmp_path, "--store", store, "verify", "demo-1")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert verified.stdout.startswith("ok   demo-1:")
    result = _shell(home, tmp_path, "--store", store, "result", "demo-1")
    assert result.returncode == 0 and '"documents"' in result.stdout, result
    listed = _shell(home, tmp_path, "--store", store, "approvals")
    assert listed.returncode == 0, listed.stderr
    assert list(home.iterdir()) == [], "nothing is made in $HOME"

    stranger = tmp_path / "stranger-keys"
    perdure.KeyFolder(stranger).ensure_trust("stranger")
    foreign = _shell(home, tmp_path, "--store", store, "--key-dir", str(stranger),
                     "verify", "demo-1")
    assert foreign.returncode == 1
    assert "is bad" not in foreign.stdout
    assert (f"is signed by a key that no root in {stranger} certifies" in foreign.stdout)
    assert "--key-dir" in foreign.stdout

    elsewhere = tmp_path / "copy"
    elsewhere.mkdir()
    shutil.copy(tmp_path / "demo-data" / "demo.db", elsewhere / "demo.db")
    copied = f"sqlite:///{elsewhere / 'demo.db'}"
    for args in (("show", "demo-1"), ("verify", "demo-1"), ("result", "demo-1"), ("ls",),
                 ("send", "demo-1", "ping", "{}"), ("approve", "demo-1", "1:0")):
        done = _shell(home, tmp_path, "--store", copied, *args)
        assert done.returncode == 1, (args, done)
        [line] = done.stderr.strip().splitlines()
        assert line.startswith(f"error: no trusted root in key folder {elsewhere / 'keys'}")
        assert "--key-dir" in line
    assert not (elsewhere / "keys").exists() and list(home.iterdir()) == []
