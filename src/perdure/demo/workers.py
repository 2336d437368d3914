"""The demo's worker processes: ``perdure --app perdure.demo:app worker`` subprocesses
that the demo starts, kills with SIGKILL and stops (and no other process)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from perdure.demo.agents import DEMO_DIR_ENV

__all__ = ["WorkerProcess", "report_failure"]


class WorkerProcess:
    """A worker subprocess this demo started (and is the only one to stop)."""

    def __init__(self, label: str, root: Path, app_ref: str = "perdure.demo:app") -> None:
        """Start ``perdure --app APP_REF worker`` in ``root`` (``app_ref`` defaults to the
        review demo's App); its output goes to ``worker-<label>.log``."""
        self.label = label
        self.node_id = f"demo-node-{label.lower()}"
        self.log_path = root / f"worker-{label.lower()}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PERDURE_")}
        env[DEMO_DIR_ENV] = str(root)
        env["PYTHONUNBUFFERED"] = "1"
        command = [sys.executable, "-m", "perdure", "--app", app_ref,
                   "--node-id", self.node_id, "worker", "--concurrency", "4"]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(command, cwd=root, env=env, stdout=log,
                                         stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> int:
        self.proc.send_signal(signal.SIGKILL)
        return self.proc.wait(timeout=10)

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                return self.proc.wait(timeout=5)
        return self.proc.returncode

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def report_failure(out: Console, exc: BaseException, workers: Sequence[WorkerProcess]) -> int:
    """Say why a demo failed, with the end of each worker's log; the exit code (1)."""
    out.print(f"[bold red]demo failed:[/] {escape(str(exc))}")
    for worker in workers:
        tail = worker.log_tail()
        if tail:
            out.print(f"[dim]last lines of worker {worker.label}'s log:[/]")
            out.print(tail, markup=False)
    return 1
