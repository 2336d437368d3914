"""Two versions of perdure side by side, in one run: ``python -m bench.compare REV``.

Unpacks the commit ``REV`` (``git archive``) into a temporary folder and runs ``python
-m bench`` alternately with that tree's code and with this checkout's, ``--rounds``
times each (the machine's speed drifts within minutes: alternating keeps the two
versions under the same conditions). Each run is a separate process with ``PYTHONPATH``
set to its tree, so each side uses its own ``perdure`` and its own ``bench``.

Prints, per backend, the medians of each side and their ratio for: sequential steps
(µs per step), concurrent steps per second, and the resume cost at each history length
(claim → next new step, cold and on the same node), and the end-to-end figures through a
worker process (``e2e``: sequential and concurrent sync steps, start → result p50 and p99,
idle CPU). ``--json`` prints every run instead. Nothing asserts on speed.

``--bench-here`` runs this checkout's benchmark on both sides, with only ``perdure``
taken from ``REV``: for a part that ``REV``'s own ``bench`` does not have yet.

    python -m bench.compare f60f4d8 --only history,steps --backends sqlite_full,postgresql
    python -m bench.compare 7270774 --bench-here --only e2e --backends sqlite_full
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _unpack(rev: str, into: Path) -> Path:
    """The tree of commit ``rev`` under ``into``."""
    archive = into / "tree.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "archive", "--format=tar", rev], cwd=ROOT, stdout=out,
                       check=True)
    tree = into / "tree"
    tree.mkdir()
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


def _run(tree: Path, bench_args: list[str], bench_tree: Path | None = None
         ) -> dict[str, Any]:
    """One ``python -m bench`` run with ``tree``'s ``perdure`` and ``bench_tree``'s
    benchmark (default: ``tree``'s too); its JSON report."""
    bench_tree = bench_tree or tree
    env = {**os.environ, "PYTHONPATH": f"{tree / 'src'}{os.pathsep}{bench_tree}"}
    done = subprocess.run([sys.executable, "-m", "bench", *bench_args], cwd=bench_tree, env=env,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"bench failed in {tree}:\n{done.stderr[-3000:]}")
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def _figures(report: dict[str, Any]) -> dict[str, dict[str, float]]:
    """The compared figures of one report, per backend."""
    out: dict[str, dict[str, float]] = {}
    for name, backend in report["backends"].items():
        got: dict[str, float] = {}
        if "sequential" in backend:
            got["sequential µs/step"] = backend["sequential"]["us_per_step"]
            got["concurrent steps/s"] = backend["concurrent"]["steps_per_s"]
        e2e = backend.get("e2e")
        if e2e:
            got["e2e sequential sync µs/step"] = e2e["sequential"]["us_per_step"]
            got["e2e 50 objects steps/s"] = e2e["concurrent"]["steps_per_s"]
            got["e2e start→result p50 ms"] = e2e["start_result"]["ms_p50"]
            got["e2e start→result p99 ms"] = e2e["start_result"]["ms_p99"]
            got["e2e idle CPU %"] = e2e["idle_cpu"]["percent_of_core"]
        for workers, claims in backend.get("claims", {}).items():
            got[f"claims, {workers} worker(s): objects/s"] = claims["objects_per_s"]
        for length, resume in backend.get("resume", {}).items():
            got[f"resume {length} ms"] = resume["ms_claim_to_next_step"]
            got[f"resume {length} same node ms"] = resume["ms_claim_to_next_step_same_node"]
        out[name] = got
    return out


def main(argv: list[str] | None = None) -> int:
    """Run both sides alternately and print the medians side by side."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rev", help="the commit to compare against (e.g. main~3 or a hash)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each side (default 3)")
    parser.add_argument("--only", default="history,steps", help="bench parts (default "
                        "history,steps)")
    parser.add_argument("--backends", help="bench --backends (default: every backend)")
    parser.add_argument("--quick", action="store_true", help="bench --quick sizes")
    parser.add_argument("--json", action="store_true", help="print every run as JSON")
    parser.add_argument("--bench-here", action="store_true", help="this checkout's bench "
                        "on both sides (only perdure from REV)")
    args = parser.parse_args(argv)
    bench_args = ["--only", args.only, "--no-peers"]
    if args.backends:
        bench_args += ["--backends", args.backends]
    if args.quick:
        bench_args.append("--quick")
    runs: dict[str, list[dict[str, dict[str, float]]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="perdure-compare-") as tmp:
        before = _unpack(args.rev, Path(tmp))
        for round_no in range(args.rounds):
            order = [("before", before), ("after", ROOT)]
            if round_no % 2:
                order.reverse()
            for side, tree in order:
                began = time.monotonic()
                bench_tree = ROOT if args.bench_here else None
                runs[side].append(_figures(_run(tree, bench_args, bench_tree)))
                print(f"compare: round {round_no + 1} {side}: {time.monotonic() - began:.0f} s",
                      file=sys.stderr)
    if args.json:
        json.dump({"rev": args.rev, "runs": runs}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(f"| backend | figure | {args.rev} (median) | this checkout (median) | ratio |")
    print("| --- | --- | --- | --- | --- |")
    for backend in runs["after"][0]:
        for figure in runs["after"][0][backend]:
            old = statistics.median(r[backend][figure] for r in runs["before"]
                                    if figure in r.get(backend, {}))
            new = statistics.median(r[backend][figure] for r in runs["after"])
            print(f"| {backend} | {figure} | {old:,.3f} | {new:,.3f} | {new / old:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
