"""Record the golden memory logs: run ``agents.py`` on a temporary SQLite store.

Run from the repository root::

    python -m tests.golden.record            # rewrites tests/golden/*.json
    python -m tests.golden.record --out DIR  # somewhere else

Some objects are driven to completion, others are left dormant mid-way (sleeping,
waiting for an event, waiting for a child), and every object in the store,
children included, is written as ``<object id>.json``. Earlier ``*.json`` files in
the output folder are removed first. Re-record only after an intended, versioned
change (see ``README.md`` in this folder).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import perdure
from tests.golden import agents
from tests.golden.logs import GOLDEN_DIR, golden_files, log_to_json

__all__ = ["SCENARIO", "main", "record"]

# object id -> (agent, args, kwargs, events sent at once, status to reach)
SCENARIO: dict[str, tuple[str, list[object], dict[str, object], dict[str, object], str]] = {
    "steps-done": ("steps", ["alpha"], {}, {"approval": {"by": "golden"}}, "completed"),
    "steps-waiting": ("steps", ["beta"], {}, {}, "dormant"),
    "sleeper": ("sleeper", [], {}, {}, "dormant"),
    "composer": ("composer", [2], {}, {}, "completed"),
    "waiting-parent": ("waiting_parent", [3], {}, {}, "dormant"),
    "refiner-done": ("refiner", ["tidy"], {}, {"done": True}, "completed"),
    "refiner-waiting": ("refiner", ["sort"], {}, {}, "dormant"),
    "patch-late": ("patch_late", [], {}, {}, "dormant"),
    "sync-done": ("sync_steps", [4], {}, {"answer": 42}, "completed"),
    "sync-waiting": ("sync_steps", [5], {}, {}, "dormant"),
}


def _recording_app(store_url: str, key_dir: Path) -> perdure.App:
    """An App on the temporary store with the golden agents.

    ``patch_late`` is registered with its body from before the patched block, so
    its log is memory written by older code.
    """
    app = perdure.App(store=store_url, key_dir=key_dir, node_id="golden-node",
                      lease_seconds=5.0, poll_interval=0.01)
    for name, definition in agents.app.agents.items():
        fn = agents._patch_late_before if name == "patch_late" else definition.fn
        app.agent(name=name, version=definition.version, requires=definition.requires)(fn)
    return app


def _wait(what: str, predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)


def record(out: Path) -> list[Path]:
    """Run the scenario and write one golden file per object to ``out``; the files written."""
    with tempfile.TemporaryDirectory(prefix="perdure-golden-") as tmp:
        app = _recording_app(f"sqlite:///{Path(tmp) / 'golden.db'}", Path(tmp) / "keys")
        try:
            with app.background_worker(concurrency=8):
                for object_id, (agent, args, kwargs, events, _) in SCENARIO.items():
                    app.options(object_id=object_id).start(agent, *args, **kwargs)
                    for event, payload in events.items():
                        app.send(object_id, event, payload)
                for object_id, (*_, status) in SCENARIO.items():
                    _wait(f"{object_id} {status}",
                          lambda o=object_id, s=status: _settled(app, o, s))
                # The children a dormant parent waits for settle too.
                _wait("the waiting child", lambda: _settled(app, "waiting-parent.2", "dormant"))
                app.refine("refiner-waiting", goal={"aim": "refined from outside"})
                _wait("the outside refinement",
                      lambda: sum(r.kind == perdure.Kind.INTENT_REFINED
                                  for r in app.history("refiner-waiting")) == 2)
                _wait("refiner-waiting dormant again",
                      lambda: _settled(app, "refiner-waiting", "dormant"))
            return _dump(app, out)
        finally:
            app.close()


def _settled(app: perdure.App, object_id: str, status: str) -> bool:
    info = app.get(object_id)
    if info.status != status:
        return False
    return status != "dormant" or info.lease_owner is None


def _dump(app: perdure.App, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    for old in golden_files(out):
        old.unlink()
    keys = {name: found[-1] for name, found in app.verifier.names().items() if found}
    written = []
    for info in sorted(app.list(limit=10_000), key=lambda i: i.object_id):
        records = app.history(info.object_id)
        report = app.verify(info.object_id)
        if not report.ok:
            raise RuntimeError(f"{info.object_id} does not verify: {report}")
        signers = {rec.node_id for rec in records}
        path = out / f"{info.object_id}.json"
        path.write_text(log_to_json(
            object_id=info.object_id, agent=info.agent, version=info.agent_version,
            status=str(info.status), public_keys={n: keys[n] for n in signers},
            records=records, recorded_with=perdure.__version__), encoding="utf-8")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: record into ``--out`` (default: this folder)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=GOLDEN_DIR,
                        help="folder for the *.json files (default: tests/golden)")
    options = parser.parse_args(argv)
    for path in record(options.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
