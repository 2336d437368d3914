"""Write the histories of this folder: run ``agents.py`` in a test environment.

Run from the repository root after an intended, versioned change only::

    python -m tests.histories.record

``digest-done.json`` is an object that slept, was answered ``yes`` and completed;
``digest-waiting.json`` one left at its question.
"""

from __future__ import annotations

import sys
from pathlib import Path

from perdure.testing import Environment
from tests.histories import agents

__all__ = ["FOLDER", "record"]

FOLDER = Path(__file__).resolve().parent


def record(out: Path = FOLDER) -> list[Path]:
    """Run the scenario and write its histories to ``out``; the files written."""
    with Environment(agents.app) as env:
        done = env.options(object_id="digest-done").start(agents.digest, "tides")
        env.run(done)
        env.answer(done, "yes")
        done.result()
        waiting = env.options(object_id="digest-waiting").start(agents.digest, "reefs")
        env.run(waiting)
        return [env.export(done, out / "digest-done.json"),
                env.export(waiting, out / "digest-waiting.json")]


if __name__ == "__main__":
    for path in record(Path(sys.argv[1]) if len(sys.argv) > 1 else FOLDER):
        print(path)
