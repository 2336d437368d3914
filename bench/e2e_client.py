"""The client of the end-to-end part: a process of its own, as a user's program would be.

``python -m bench.e2e_client SCENARIO --store URL --key-dir DIR [sizes]`` opens
``perdure.App(store=URL, key_dir=DIR)`` with the benchmark agents registered (as a
user's program imports its agents), starts objects that a separate ``perdure worker``
process runs, waits on ``Handle.result()`` and prints one JSON document. Every step
of these agents is a plain ``def`` function returning ``time.time()`` when it ran
(``bench/agents.py``), and that value is read back from the object's memory.

Scenarios (see ``bench/e2e.py``):

* ``sequential``: one object of ``--steps`` steps (``--agent sync_steps``, or
  ``sync_steps_def`` for the plain ``def`` agent);
* ``concurrent``: ``--objects`` objects of ``--steps`` steps, all started, then waited on;
* ``start-result``: ``--pairs`` one-step objects one after another, each started and
  waited on before the next.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the ``bench`` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import perdure
from bench import agents

RESULT_TIMEOUT = 600.0


def _stamps(app: perdure.App, object_id: str) -> list[float]:
    """The times the object's steps ran, from its memory (``step_done`` results)."""
    return [float(r.body["result"]) for r in app.history(object_id) if r.kind == "step_done"]


def sequential(app: perdure.App, args: argparse.Namespace) -> dict[str, Any]:
    """One object of ``args.steps`` steps: µs per step from the first step to the last."""
    began = time.time()
    handle = app.start(args.agent, args.steps)
    if handle.result(timeout=RESULT_TIMEOUT) != args.steps:
        raise RuntimeError(f"{handle.object_id} returned a wrong result")
    seen = time.time()
    stamps = _stamps(app, handle.object_id)
    if len(stamps) != args.steps:
        raise RuntimeError(f"expected {args.steps} steps recorded, saw {len(stamps)}")
    per_step = (stamps[-1] - stamps[0]) / (len(stamps) - 1)
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    return {
        "agent": args.agent,
        "steps": args.steps,
        "us_per_step": per_step * 1e6,
        "us_per_step_median": statistics.median(gaps) * 1e6,
        "steps_per_s": 1 / per_step,
        "ms_start_to_first_step": (stamps[0] - began) * 1e3,
        "ms_last_step_to_result": (seen - stamps[-1]) * 1e3,
        "chain_verified": bool(app.verify(handle.object_id).ok),
    }


def concurrent(app: perdure.App, args: argparse.Namespace) -> dict[str, Any]:
    """``args.objects`` objects of ``args.steps`` steps: steps per second, first to last."""
    began = time.time()
    handles = [app.start("sync_steps", args.steps) for _ in range(args.objects)]
    started = time.time()
    for handle in handles:
        if handle.result(timeout=RESULT_TIMEOUT) != args.steps:
            raise RuntimeError(f"{handle.object_id} returned a wrong result")
    seen = time.time()
    stamps = sorted(itertools.chain.from_iterable(_stamps(app, h.object_id) for h in handles))
    total = args.objects * args.steps
    if len(stamps) != total:
        raise RuntimeError(f"expected {total} steps recorded, saw {len(stamps)}")
    return {
        "objects": args.objects,
        "steps_per_object": args.steps,
        "steps_per_s": (total - 1) / (stamps[-1] - stamps[0]),
        "client_steps_per_s": total / (seen - began),
        "ms_starting_all": (started - began) * 1e3,
        "ms_start_to_first_step": (stamps[0] - began) * 1e3,
        "chain_verified": bool(app.verify(handles[0].object_id).ok
                               and app.verify(handles[-1].object_id).ok),
    }


def start_result(app: perdure.App, args: argparse.Namespace) -> dict[str, Any]:
    """``args.pairs`` times: start a one-step object, wait for its result; milliseconds.
    With ``args.queue``, each object is started on that queue (declared here with a
    concurrency of 4; the worker claims it by the limits the store holds)."""
    total, start_calls, to_step, step_to_result = [], [], [], []
    last = ""
    starter = app.options()
    if args.queue:
        app.queue(args.queue, concurrency=4)
        starter = app.options(queue=args.queue)
    for i in range(args.pairs):
        wall = time.time()
        began = time.perf_counter()
        handle = starter.start("one_sync_step", i)
        called = time.perf_counter()
        ran = float(handle.result(timeout=RESULT_TIMEOUT))
        done = time.perf_counter()
        seen = time.time()
        total.append((done - began) * 1e3)
        start_calls.append((called - began) * 1e3)
        to_step.append((ran - wall) * 1e3)
        step_to_result.append((seen - ran) * 1e3)
        last = handle.object_id
    return {
        "pairs": args.pairs,
        "ms_values": total,
        "start_call_ms_median": statistics.median(start_calls),
        "start_to_step_ms_median": statistics.median(to_step),
        "step_to_result_ms_median": statistics.median(step_to_result),
        "chain_verified": bool(app.verify(last).ok),
    }


SCENARIOS = {"sequential": sequential, "concurrent": concurrent, "start-result": start_result}


def main(argv: list[str] | None = None) -> int:
    """Run one scenario against the worker, print its JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--store", required=True)
    parser.add_argument("--key-dir", required=True)
    parser.add_argument("--agent", default="sync_steps")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--objects", type=int, default=1)
    parser.add_argument("--pairs", type=int, default=1)
    parser.add_argument("--queue", default="", help="start-result: start on this queue")
    args = parser.parse_args(argv)
    logging.getLogger("perdure").setLevel(logging.ERROR)
    app = agents.register(perdure.App(store=args.store, key_dir=args.key_dir,
                                      node_id="bench-client"))
    try:
        figures = SCENARIOS[args.scenario](app, args)
    finally:
        app.close()
    json.dump(figures, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
