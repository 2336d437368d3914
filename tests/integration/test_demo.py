"""``perdure demo`` end to end: real worker processes, a real SIGKILL, no step run twice."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from rich.console import Console

import perdure
from perdure.core.records import Kind
from perdure.demo import build_app, run_demo


def _clean_env() -> dict[str, str]:
    """The environment without PERDURE_* settings that could point the demo elsewhere."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PERDURE_")}


def test_demo_kills_a_worker_and_resumes_without_running_a_step_twice(tmp_path: Path) -> None:
    """The demo exits 0; worker A died by SIGKILL; every step finished once; memory verifies."""
    folder = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "perdure", "demo", "--dir", str(folder)],
        capture_output=True, text=True, timeout=120, env=_clean_env(), cwd=tmp_path,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "Kill worker A with SIGKILL" in output
    assert "demo passed" in output

    effects = [json.loads(line) for line in
               (folder / "effects.jsonl").read_text(encoding="utf-8").splitlines()]
    finished = Counter(e["step"] for e in effects if e["event"] == "done")
    assert len(finished) == 9  # list, six documents, summary, report
    assert set(finished.values()) == {1}, finished
    # Two worker processes did the work: the one killed and the one that resumed.
    assert len({e["pid"] for e in effects if e["event"] == "done"}) == 2

    app = perdure.App(store=f"sqlite:///{folder / 'demo.db'}", key_dir=folder / "keys")
    try:
        records = app.history("demo-1")
        done = Counter(r.body["name"] for r in records if r.kind == Kind.STEP_DONE)
        assert set(done.values()) == {1}
        assert done == finished
        nodes = {r.node_id for r in records if r.kind == Kind.STEP_DONE}
        assert nodes == {"demo-node-a", "demo-node-b"}
        assert records[-1].kind == Kind.TERMINATED
        assert records[-1].body["outcome"] == "completed"
        assert app.verify("demo-1").ok
    finally:
        app.close()
    assert len(list((folder / "reports").glob("report-*.md"))) == 1


def test_demo_refuses_a_folder_it_did_not_make(tmp_path: Path) -> None:
    """With --fresh on a folder holding other files, the demo deletes nothing and fails."""
    precious = tmp_path / "notes.txt"
    precious.write_text("keep me", encoding="utf-8")
    shown = io.StringIO()
    code = run_demo(tmp_path, fresh=True, console=Console(file=shown, width=200))
    assert code == 1
    assert "was not made by `perdure demo`" in shown.getvalue()
    assert precious.read_text(encoding="utf-8") == "keep me"


def test_a_second_run_touches_only_its_own_object(tmp_path: Path) -> None:
    """Run again without --fresh, the demo keeps the store: an object made by hand (the
    README walk-through's ``walk-1``), a file beside the reports and the first run's
    ``demo-1`` stay as they were; the second run starts ``demo-2`` and passes."""
    folder = tmp_path / "demo"
    shown = io.StringIO()
    assert run_demo(folder, console=Console(file=shown, width=200)) == 0, shown.getvalue()
    app = build_app(folder, node_id="walker")
    try:
        with app.background_worker():  # the walk-through, done by hand
            walk = app.options(object_id="walk-1").start("review", pace=0)
            app.send("walk-1", "approval", {"by": "you"})
            walk.result(timeout=60)
        mine = folder / "reports" / "my-notes.md"
        mine.write_text("mine", encoding="utf-8")
        before = {oid: app.history(oid) for oid in ("demo-1", "walk-1")}

        again = io.StringIO()
        code = run_demo(folder, console=Console(file=again, width=200))
        assert code == 0, again.getvalue()
        assert "demo-2 completed" in again.getvalue()
        for oid, records in before.items():
            assert app.history(oid) == records, oid
        assert (folder / walk.result()["report"]).exists()
        assert mine.read_text(encoding="utf-8") == "mine"
        assert app.verify("demo-2").ok
    finally:
        app.close()
