"""``perdure demo``: a document-review agent that is killed mid-way and carries on.

The agent reads the text files in ``<folder>/docs``, analyses each one in its
own recorded step, summarises them, sleeps, waits for a person's approval and
writes a report. ``run_demo`` tells the whole story with real processes: it
starts the object, runs a worker, kills that worker with SIGKILL while the
documents are being analysed, runs a second worker that resumes from memory,
approves, waits for the result and verifies the signed memory.

Every step appends ``began`` and ``done`` lines to ``<folder>/effects.jsonl``,
so the demo (and anyone) can count how many times each step really ran.

``perdure.demo:app`` is the same agent for running by hand
(``perdure --app perdure.demo:app worker``); its folder comes from the
``PERDURE_DEMO_DIR`` environment variable (default ``demo-data``).

Where it lives: ``samples`` (the documents), ``agents`` (the agent, its steps and
``build_app``), ``workers`` (the worker processes it starts and kills) and ``story``
(``run_demo``). It uses perdure only through its public names (``perdure``,
``perdure.describe``, ``perdure.errors``), as a program of one's own would.

``perdure demo --llm`` is the same story for a model call (``llm_agent``: an agent of
three streamed ``run.model`` calls and the scripted model answering it; ``llm_story``:
``run_llm_demo``, a worker killed mid-stream and the draft continued from its salvaged
text); it needs ``perdure[llm]`` and is imported only when asked for.
"""

from __future__ import annotations

import os

from perdure.demo.agents import AGENT, DEFAULT_DIR, DEMO_DIR_ENV, build_app
from perdure.demo.samples import write_samples
from perdure.demo.story import OBJECT_ID, run_demo

__all__ = ["AGENT", "DEMO_DIR_ENV", "OBJECT_ID", "app", "build_app", "run_demo", "write_samples"]

app = build_app(os.environ.get(DEMO_DIR_ENV) or DEFAULT_DIR)
"""The demo App for ``perdure --app perdure.demo:app ...`` (folder from ``PERDURE_DEMO_DIR``)."""
