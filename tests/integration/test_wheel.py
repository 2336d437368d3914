"""The built wheel installs into a fresh venv and its ``perdure demo`` passes there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(command: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PERDURE_", "PYTHON", "VIRTUAL_ENV"))}
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(command)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_wheel_installs_in_a_fresh_venv_and_runs_the_demo(tmp_path: Path) -> None:
    """Build the wheel, install it (dependencies from the index) and run the demo from it."""
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-w", str(dist), "-q"],
         cwd=tmp_path, timeout=300)
    wheels = list(dist.glob("perdure-*.whl"))
    assert len(wheels) == 1, wheels

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path, timeout=120)
    python = venv / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "-q", str(wheels[0])], cwd=tmp_path, timeout=300)

    where = _run([str(python), "-c", "import perdure; print(perdure.__file__)"],
                 cwd=tmp_path, timeout=60).stdout.strip()
    assert Path(where).is_relative_to(venv), f"perdure imported from {where}, not the venv"

    demo = _run([str(venv / "bin" / "perdure"), "demo", "--dir", str(tmp_path / "demo")],
                cwd=tmp_path, timeout=120)
    assert "demo passed" in demo.stdout
    assert (tmp_path / "demo" / "reports").is_dir()
