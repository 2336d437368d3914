"""docs/howto/keys-and-trust.md's one-machine example, typed as it reads in a fresh shell.

Its ``agents.py`` and its ``$ ...`` commands are read from the document, run one by one
in an empty folder with an empty ``$HOME`` and ``PERDURE_APP=agents:app`` (as the page
says), and what each prints is compared with what the page shows, once keys, times,
sizes and the host name (which differ on every run) are set aside.
"""

from __future__ import annotations

import re
import socket
import subprocess
from pathlib import Path

import pytest

from tests.acceptance.test_examples import REPO_ROOT, user_env  # noqa: F401 - a fixture

DOC = REPO_ROOT / "docs" / "howto" / "keys-and-trust.md"

pytestmark = pytest.mark.timeout(180)


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


def _session(block: str) -> list[tuple[str, list[str]]]:
    """A ``text`` block of a shell session: each ``$ command`` and the lines it printed."""
    steps: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            assert steps, f"output before any command in {DOC.name}: {line!r}"
            steps[-1][1].append(line)
    return steps


def _shape(lines: list[str], command: str) -> list[str]:
    """What must match between the page and a run: for ``ls -l``, the file names; else
    each line with hex digits, numbers and the host name set aside."""
    if command.startswith("ls -l"):
        return [line.split()[-1] for line in lines if not line.startswith("total")]
    host = re.escape(socket.gethostname())
    out = []
    for line in lines:
        line = re.sub(rf"\b(vm|{host})-[0-9a-f]{{8}}\b", "NODE", line)
        line = re.sub(r"[0-9a-f]{16,}", "HEX", line)
        out.append(re.sub(r"\s+", " ", re.sub(r"\d+", "N", line)).strip())
    return out


def test_one_machine_example_runs_as_printed(tmp_path: Path,
                                             user_env: dict[str, str]) -> None:  # noqa: F811
    text = DOC.read_text()
    [agents] = re.findall(r"```python\n(.*?)```", text, flags=re.S)[:1]
    (tmp_path / "agents.py").write_text(agents)
    [block] = re.findall(r"```text\n(.*?)```", _section(text, "One machine: nothing to do"),
                         flags=re.S)
    steps = _session(block)
    assert [c for c, _ in steps][:1] == [
        "perdure --store sqlite:///agents.db start job --args 1 --id solo-1"]
    env = {**user_env, "PERDURE_APP": "agents:app"}
    for command, shown in steps:
        done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, (command, done.stdout, done.stderr)
        printed = done.stdout.splitlines()
        assert _shape(printed, command) == _shape(shown, command), (command, printed)
    # Nothing was made in $HOME: the key folder followed the store.
    assert not (Path(user_env["HOME"]) / ".perdure").exists()
    assert (tmp_path / "keys" / "node.cert").is_file()
