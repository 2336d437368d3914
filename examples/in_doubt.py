"""A payment step that must not run twice, and what to do when a crash leaves it in doubt.

Run it: python examples/in_doubt.py
A first worker process dies right after the charge, before perdure records it. A second
worker resumes the agent, which gets ``StepInDoubtError``, asks the "payment provider"
(a JSON file here) about the idempotency key, and finds the charge: it is not repeated.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import perdure

app = perdure.App(store="sqlite:///shop.db", key_dir=".perdure-keys", lease_seconds=1.0)
LEDGER = Path("ledger.json")  # stands in for the payment provider


def _ledger() -> dict:
    return json.loads(LEDGER.read_text()) if LEDGER.exists() else {}


@perdure.step(idempotent=False)
def charge(order: str, cents: int) -> str:
    key = perdure.current_step().idempotency_key
    LEDGER.write_text(json.dumps({**_ledger(), key: {"order": order, "cents": cents}}))
    if os.environ.get("CRASH_AFTER_CHARGE"):
        os._exit(1)  # the process dies after the charge, before perdure records it
    return key


def find_charge(key: str) -> bool:
    return key in _ledger()


@app.agent()
async def checkout(run: perdure.Run, order: str, cents: int) -> str:
    try:
        return await run.step(charge, order, cents)
    except perdure.StepInDoubtError as doubt:
        if await run.step(find_charge, doubt.idempotency_key):
            return doubt.idempotency_key  # it did land: do not charge again
        return await run.step(charge, order, cents, name="charge again")


def work_until_done() -> None:
    app.run_worker(until=lambda: app.get("order-7").terminal)


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        work_until_done()
        sys.exit(0)
    app.options(object_id="order-7").start(checkout, "order-7", 1250)
    crashing = {**os.environ, "CRASH_AFTER_CHARGE": "1"}
    subprocess.run([sys.executable, __file__, "--worker"], env=crashing, check=False)
    work_until_done()
    print("result:", app.handle("order-7").result())
    print("charges in the ledger:", len(_ledger()))
