"""The composition commands of the ``perdure`` CLI, against real worker processes.

``perdure tree`` prints an object's lineage with statuses, ``perdure show`` lists an
object's children, ``perdure replay-check`` says whether today's code (``--app``)
replays live memory (exit 0) or where it diverges (exit 1), and ``perdure worker
--capability NAME`` serves objects and steps that require ``NAME``.

This module is the ``--app`` of the CLI processes: ``app`` is the code that ran the
objects, ``changed_app`` the same agents with one step renamed. The store and key
directory come from the command line, so the Apps' own URLs are never opened. Each
test runs on SQLite and on PostgreSQL (claims filter by capability in each store's SQL).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import perdure
from tests.cluster import one_root

ROOT = Path(__file__).resolve().parents[2]
MODULE = "tests.integration.test_cli_composition"

app = perdure.App(store="sqlite:///cli-composition-never-opened.db")
changed_app = perdure.App(store="sqlite:///cli-composition-never-opened.db")


def square(n: int) -> int:
    """A step."""
    return n * n


def cube(n: int) -> int:
    """The step ``changed_app``'s waiter calls where ``square`` was recorded."""
    return n * n * n


def paint(n: int) -> str:
    """A step only a node with the ``gpu`` capability may run."""
    return f"painted {n}"


@app.agent(name="leaf")
@changed_app.agent(name="leaf")
async def leaf(run: perdure.Run, n: int) -> int:
    """A child with one step."""
    return await run.step(square, n)


@app.agent(name="waiter")
async def waiter(run: perdure.Run, n: int) -> dict[str, Any]:
    """A grandchild: one step, then wait for ``go``."""
    value = await run.step(square, n)
    return {"value": value, "go": await run.wait_for("go")}


@changed_app.agent(name="waiter")
async def waiter_changed(run: perdure.Run, n: int) -> dict[str, Any]:
    """``waiter`` with its first step swapped for another one: diverges at #0."""
    value = await run.step(cube, n)
    return {"value": value, "go": await run.wait_for("go")}


@app.agent(name="middle")
@changed_app.agent(name="middle")
async def middle(run: perdure.Run, n: int) -> Any:
    """A child that delegates a grandchild and waits for it."""
    return await (await run.delegate("waiter", n))


@app.agent(name="family")
@changed_app.agent(name="family")
async def family(run: perdure.Run, n: int) -> list[Any]:
    """Two children, one of which has a child of its own."""
    first = await run.delegate("leaf", n)
    second = await run.delegate("middle", n + 1)
    return await run.join(first, second)


@app.agent(name="render", requires={"gpu"})
async def render(run: perdure.Run, n: int) -> str:
    """An agent that needs the ``gpu`` capability for all of its work."""
    return await run.step(paint, n)


@app.agent(name="mixed")
async def mixed(run: perdure.Run, n: int) -> list[Any]:
    """Any node runs the first step; only a ``gpu`` node the second."""
    first = await run.step(square, n)
    return [first, await run.step(paint, n, requires={"gpu"})]


@app.agent(name="later")
async def later(run: perdure.Run, n: int) -> int:
    """Waits for ``go`` (refined meanwhile to require ``gpu``), then one step."""
    await run.wait_for("go")
    return await run.step(square, n, name="after_go")


# -- helpers ----------------------------------------------------------------------


@pytest.fixture
def url(store_url: str) -> str:
    """The store the CLI processes share: a SQLite file, or a PostgreSQL database."""
    return store_url


@pytest.fixture
def viewer(url: str, tmp_path: Path) -> Iterator[perdure.App]:
    """An App on the store without agents: to read and send from the test itself."""
    # The test's nodes, its CLI and this viewer: one cluster, one root; each key folder
    # is certified under the node id it acts as (a key acts only under its certificate's).
    nodes = {"viewer": "viewer", "cli": "cli", "worker": "node-a", "plain": "plain",
             "gpu": "gpu-node", "older": "older", "newer": "newer"}
    one_root(tmp_path / "keys-root",
             *((tmp_path / f"keys-{folder}", node_id) for folder, node_id in nodes.items()))
    reader = perdure.App(store=url, key_dir=tmp_path / "keys-viewer", node_id="viewer")
    yield reader
    reader.close()


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERDURE_")}
    env["PYTHONPATH"] = str(ROOT)
    return env


def cli(url: str, keys: Path, *args: str, app_attr: str | None = "app",
        node_id: str = "cli") -> subprocess.CompletedProcess[str]:
    """Run ``perdure`` with the test's store; ``app_attr`` picks this module's App."""
    command = [sys.executable, "-m", "perdure", "--store", url, "--key-dir", str(keys),
               "--node-id", node_id]
    if app_attr is not None:
        command += ["--app", f"{MODULE}:{app_attr}"]
    return subprocess.run([*command, *args], cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=30, check=False)


def start_worker(url: str, keys: Path, node_id: str, log: Path,
                 *extra: str) -> subprocess.Popen[bytes]:
    """A ``perdure worker`` process on this module's ``app``."""
    with open(log, "ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "perdure", "--store", url, "--key-dir", str(keys),
             "--node-id", node_id, "--app", f"{MODULE}:app", "worker", "--lease", "2",
             "--poll", "0.02", *extra],
            cwd=ROOT, env=_env(), stdout=sink, stderr=subprocess.STDOUT,
        )


def stop(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM a worker and return its exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=15)


def wait_until(predicate: Callable[[], bool], timeout: float = 15.0) -> None:
    """Poll ``predicate`` until true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail("condition not reached in time")
        time.sleep(0.05)


def settled(viewer: perdure.App, object_id: str, status: str) -> bool:
    """The object has ``status`` and no node holds it."""
    info = viewer.get(object_id)
    return info.status == status and info.lease_owner is None


# -- tests ------------------------------------------------------------------------


def test_tree_show_and_replay_check(url: str, tmp_path: Path, viewer: perdure.App) -> None:
    """Lineage and children on the command line; replay-check before and after a change."""
    keys = tmp_path / "keys-cli"
    worker = start_worker(url, tmp_path / "keys-worker", "node-a", tmp_path / "worker.log")
    code = None
    try:
        started = cli(url, keys, "start", "family", "--id", "fam", "--args", "[2]")
        assert started.returncode == 0, started.stderr
        wait_until(lambda: viewer.list(parent="fam.1", limit=5) != []
                   and settled(viewer, "fam.1.0", "dormant"))
        wait_until(lambda: settled(viewer, "fam", "dormant") and settled(viewer, "fam.1",
                                                                         "dormant"))

        tree = cli(url, keys, "tree", "fam", app_attr=None)
        assert tree.returncode == 0, tree.stderr
        lines = tree.stdout.splitlines()
        assert lines[0].split() == ["fam", "family@1", "dormant", "phase", "dormancy"]
        assert lines[1].startswith("├── fam.0  leaf@1  completed")
        assert lines[2].startswith("└── fam.1  middle@1  dormant")
        assert lines[3].startswith("    └── fam.1.0  waiter@1  dormant")
        assert len(lines) == 4

        show = cli(url, keys, "show", "fam", app_attr=None)
        assert show.returncode == 0, show.stderr
        assert "children (2):" in show.stdout
        kids = show.stdout.split("children (2):")[1].split()
        assert kids[:3] == ["fam.0", "leaf@1", "completed"]
        assert kids[5:8] == ["fam.1", "middle@1", "dormant"]
        assert "delegated" in show.stdout and "child_finished" in show.stdout

        same = cli(url, keys, "replay-check")
        assert same.returncode == 0, same.stdout + same.stderr
        assert "3 checked, 0 would diverge" in same.stdout
        for object_id in ("fam", "fam.1", "fam.1.0"):
            assert f"compatible  {object_id} " in same.stdout

        changed = cli(url, keys, "replay-check", app_attr="changed_app")
        assert changed.returncode == 1, changed.stdout + changed.stderr
        assert "3 checked, 1 would diverge" in changed.stdout
        line = next(ln for ln in changed.stdout.splitlines() if "fam.1.0" in ln)
        assert line.startswith("diverges")
        assert ("at command #0: recorded step('square'), code asks for step('cube')"
                in line)

        named = cli(url, keys, "replay-check", "fam", "fam.0", app_attr="changed_app")
        assert named.returncode == 0, named.stdout + named.stderr
        assert "2 checked, 0 would diverge" in named.stdout

        viewer.send("fam.1.0", "go", "yes")
        wait_until(lambda: viewer.get("fam").status == "completed")
        done = cli(url, keys, "tree", "fam", app_attr=None)
        statuses = [line.split("@1")[1].split()[0] for line in done.stdout.splitlines()]
        assert statuses == ["completed"] * 4
        assert viewer.result_of("fam") == [4, {"value": 9, "go": "yes"}]
    finally:
        code = stop(worker)
    assert code == 0


def test_worker_with_a_capability_serves_what_requires_it(url: str, tmp_path: Path,
                                                          viewer: perdure.App) -> None:
    """A node without ``gpu`` leaves ``gpu`` work alone; ``--capability gpu`` takes it.

    ``gpu`` is required by a whole agent, by one step, and by an object whose intent
    was refined to require it while it was dormant.
    """
    keys = tmp_path / "keys-cli"
    plain = start_worker(url, tmp_path / "keys-plain", "plain", tmp_path / "plain.log")
    gpu = None
    try:
        for agent, object_id in (("render", "r-1"), ("mixed", "m-1"), ("later", "l-1")):
            started = cli(url, keys, "start", agent, "--id", object_id, "--args", "[3]")
            assert started.returncode == 0, started.stderr
        wait_until(lambda: any(r.kind == perdure.Kind.CAPABILITY_MISSING
                               for r in viewer.history("m-1")))
        wait_until(lambda: settled(viewer, "l-1", "dormant"))
        viewer.refine("l-1", requires=["gpu"])  # from now on only for gpu nodes
        wait_until(lambda: viewer.get("l-1").requires == ("gpu",))
        viewer.send("l-1", "go")
        time.sleep(0.5)  # time enough for the plain node to claim anything it may
        assert viewer.get("r-1").status == "ready"
        assert [str(r.kind) for r in viewer.history("r-1")] == ["instantiated"]
        assert viewer.get("r-1").note == "waiting: no live node serving render@1 has gpu"
        assert viewer.get("m-1").status == "ready"
        assert viewer.get("l-1").status != "completed"
        assert "event_received" not in [str(r.kind) for r in viewer.history("l-1")]

        gpu = start_worker(url, tmp_path / "keys-gpu", "gpu-node", tmp_path / "gpu.log",
                           "--capability", "gpu")
        wait_until(lambda: all(viewer.get(o).status == "completed"
                               for o in ("r-1", "m-1", "l-1")))
        assert viewer.result_of("r-1") == "painted 3"
        assert viewer.result_of("m-1") == [9, "painted 3"]
        steps = {(rec.body["name"], rec.node_id) for oid in ("r-1", "m-1", "l-1")
                 for rec in viewer.history(oid) if rec.kind == perdure.Kind.STEP_DONE}
        assert steps == {("square", "plain"), ("paint", "gpu-node"), ("after_go", "gpu-node")}
        missing = [rec for rec in viewer.history("m-1")
                   if rec.kind == perdure.Kind.CAPABILITY_MISSING]
        assert len(missing) == 1
        assert missing[0].body["node"] == "plain"
        assert missing[0].body["capabilities"] == ["gpu"]
    finally:
        codes = [stop(plain)] + ([stop(gpu)] if gpu is not None else [])
    assert codes == [0] * len(codes)
    assert "capabilities gpu" in (tmp_path / "gpu.log").read_text(encoding="utf-8")
