"""Model quotas: how much of a provider's token quota worker processes sharing it use,
and how many of their calls the provider refuses (``python -m bench --only quota``).

A scripted model server on 127.0.0.1 enforces a quota of tokens per window (answering
429 with ``retry-after`` past it, as a provider does) and reports in each reply's usage
the prompt's tokens as OpenAI's encoding counts them plus all that ``max_tokens`` lets
it write. ``objects`` objects each make one call of ``gpt-4o-mini`` under
``app.model_quota`` with the same limits, claimed by ``workers`` worker processes on one
SQLite file. Figures:

- ``used``: the tokens served over what the quota admits, in the whole windows from the
  first request while calls were still waiting (a sliding window admits ``cap`` tokens
  within any ``window`` seconds; the last, partial window, when the calls ran out, is
  left out);
- ``refused``: the share of requests answered 429;
- ``peak_window``: the most tokens the provider's window held at once (at most ``cap``).

Floors: ``used >= 0.85`` and ``refused <= 0.01`` (``verdict``).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import perdure

__all__ = ["FULL", "QUICK", "app", "measure", "table"]

MODEL = "gpt-4o-mini"
MAX_TOKENS = 40
USED_FLOOR = 0.85
REFUSED_CEILING = 0.01
ROOT = Path(__file__).resolve().parents[1]

QUICK = {"objects": 36, "workers": 2, "tokens_per_minute": 9_000, "window": 4.0}
FULL = {"objects": 240, "workers": 3, "tokens_per_minute": 24_000, "window": 5.0}


def _quota() -> perdure.ModelQuota:
    """The quota the worker processes declare (from the environment the bench sets)."""
    tpm, window = os.environ.get("PERDURE_BENCH_QUOTA", "36000,1.0").split(",")
    return perdure.ModelQuota("openai", MODEL, tokens_per_minute=int(tpm),
                              window=float(window))


app = perdure.App(store="sqlite:///never-opened.db", lease_seconds=5.0, poll_interval=0.01)
app.model_quota(_quota())


@app.agent(name="quota_call")
async def quota_call(run: perdure.Run, base_url: str, question: str) -> int:
    """One call under the quota; the tokens its reply reported."""
    from perdure.llm import ChatCompletionsClient, Message, ModelParams

    client = ChatCompletionsClient(base_url=base_url, api_key=lambda: "bench")
    try:
        reply = await run.model(client, model=MODEL, messages=[Message.user(question)],
                                params=ModelParams(max_tokens=MAX_TOKENS))
    finally:
        await client.aclose()
    return reply.usage.total_tokens


def measure(folder: Path, sizes: dict[str, Any]) -> dict[str, Any]:
    """Run the calls through worker processes against the quota-enforcing server."""
    from perdure.llm import Message, counter_for_model
    from perdure.llm.scripted import RecordedRequest, ScriptedReply, ScriptedServer, Step

    folder.mkdir(parents=True, exist_ok=True)
    tpm, window = int(sizes["tokens_per_minute"]), float(sizes["window"])
    cap = max(1, int(tpm * window / 60))
    counter = counter_for_model(MODEL)

    def provider(request: RecordedRequest) -> Step:
        text = request.last_user_text()
        return ScriptedReply(text="ok", input_tokens=counter.count_prompt(
            (Message.user(text),), ()), output_tokens=MAX_TOKENS)

    store = f"sqlite:///{folder / 'quota.db'}"
    keys = folder / "keys"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PERDURE_BENCH_QUOTA": f"{tpm},{window}"}
    os.environ["PERDURE_BENCH_QUOTA"] = env["PERDURE_BENCH_QUOTA"]
    with ScriptedServer(responder=provider, tokens_per_minute=tpm,
                        quota_window=window) as server:
        starter = perdure.App(store=store, key_dir=keys)
        starter.model_quota(_quota())
        starter.agent(name="quota_call")(quota_call)
        try:
            with starter.background_worker(concurrency=1):
                pass  # registers the quota and the node's keys
            questions = [f"Question {i}: " + "tell me more " * 10
                         for i in range(int(sizes["objects"]))]
            handles = [starter.options(object_id=f"quota-{i}").start(
                "quota_call", server.openai_base_url, q) for i, q in enumerate(questions)]
            logs = [open(folder / f"worker-{i}.log", "ab")  # noqa: SIM115 - closed below
                    for i in range(sizes["workers"])]
            procs = [subprocess.Popen(
                [sys.executable, "-m", "perdure", "--store", store, "--key-dir", str(keys),
                 "--app", "bench.quota:app", "worker", "--lease", "5", "--poll", "0.01",
                 "--concurrency", "16"], cwd=ROOT, env=env, stdout=log,
                stderr=subprocess.STDOUT) for log in logs]
            try:
                deadline = time.monotonic() + 30 + 3 * window * len(questions) * 60 / cap
                pending = {h.object_id for h in handles}
                while pending and time.monotonic() < deadline:
                    pending = {oid for oid in pending
                               if starter.get(oid).status != "completed"}
                    time.sleep(0.1)
            finally:
                for proc in procs:
                    proc.terminate()
                for proc in procs:
                    try:
                        proc.wait(timeout=15)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
                for log in logs:
                    log.close()
        finally:
            starter.close()
        figures = server.quota
        received = [r.received for r in server.requests]
        served = server.served
    span = (max(received) - min(received)) if received else 0.0
    # Whole windows from the first request while calls were waiting (the last, partial
    # one, when the calls ran out, is left out): each admits ``cap`` tokens.
    windows = max(1, math.floor(span / window))
    start = min(received) if received else 0.0
    in_windows = sum(n for at, n in served if at < start + windows * window)
    requests = len(received)
    used = in_windows / (cap * windows)
    refused = figures["throttled"] / requests if requests else 1.0
    done = len(handles) - len(pending)
    verdict = ("PASS" if used >= USED_FLOOR and refused <= REFUSED_CEILING
               and done == len(handles) and figures["peak_window"] <= cap else "FAIL")
    return {"objects": len(handles), "completed": done, "workers": sizes["workers"],
            "cap_tokens": cap, "window_s": window, "span_s": round(span, 2),
            "served_tokens": figures["served_tokens"], "windows": windows,
            "tokens_in_windows": in_windows, "requests": requests,
            "refused_429": figures["throttled"], "peak_window": figures["peak_window"],
            "used": round(used, 3), "refused": round(refused, 4),
            "floors": {"used": USED_FLOOR, "refused": REFUSED_CEILING}, "verdict": verdict}


def table(report: dict[str, Any]) -> str:
    """A Markdown table of the figures (empty when the part did not run)."""
    got = report.get("quota")
    if not got or "na" in got:
        return ""
    rows = [("workers", got["workers"]), ("calls", f"{got['completed']}/{got['objects']}"),
            ("quota", f"{got['cap_tokens']} tokens / {got['window_s']:g} s"),
            ("quota used", f"{100 * got['used']:.1f}% (floor {100 * USED_FLOOR:.0f}%)"),
            ("answered 429", f"{got['refused_429']} of {got['requests']} "
                             f"({100 * got['refused']:.2f}%, ceiling "
                             f"{100 * REFUSED_CEILING:.0f}%)"),
            ("peak window", f"{got['peak_window']} tokens"), ("verdict", got["verdict"])]
    return "| figure | value |\n| --- | --- |\n" + "".join(
        f"| {name} | {value} |\n" for name, value in rows)
