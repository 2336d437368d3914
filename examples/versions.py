"""Deploying changed agent code while objects started with the old code are still running.

Run it: python examples/versions.py
1. Version 1 of ``pipeline`` starts object old-1, which then waits for an event.
2. A compatible change (a new step behind ``run.patched``) is checked against old-1's
   memory with ``replay_check`` and deployed under the same version: old-1 keeps its
   recorded path, new objects take the new one.
3. An incompatible change (a new step in front, no guard) would diverge under version 1,
   so it ships as version 2. A node serving only version 2 never claims old-1; a node
   still serving version 1 finishes it.
"""

import time
from pathlib import Path

import perdure


def fetch() -> str:
    return "data"


def clean(text: str) -> str:
    return text.upper()


def check_quota() -> bool:
    return True


def node(node_id: str) -> perdure.App:
    return perdure.App(store="sqlite:///versions.db", key_dir=".perdure-keys",
                       node_id=node_id)


def original(app: perdure.App) -> None:
    @app.agent(name="pipeline", version="1")
    async def pipeline(run: perdure.Run) -> str:
        data = await run.step(fetch)
        await run.wait_for("go")
        return await run.step(clean, data)


def patched(app: perdure.App) -> None:
    @app.agent(name="pipeline", version="1")
    async def pipeline(run: perdure.Run) -> str:
        if run.patched("quota-check"):  # new objects only; old memory keeps the old path
            await run.step(check_quota)
        data = await run.step(fetch)
        await run.wait_for("go")
        return await run.step(clean, data)


def reshaped(app: perdure.App, version: str) -> None:
    @app.agent(name="pipeline", version=version)
    async def pipeline(run: perdure.Run) -> str:
        await run.step(check_quota)  # a new first command, unguarded
        data = await run.step(fetch)
        await run.wait_for("go")
        return await run.step(clean, data)


def wait_for_event(app: perdure.App, object_id: str) -> None:
    while app.get(object_id).waiting_event is None:
        time.sleep(0.05)


if __name__ == "__main__":
    for leftover in Path().glob("versions.db*"):  # each run starts over
        leftover.unlink()

    first = node("node-a")
    original(first)
    with first.background_worker():
        first.options(object_id="old-1").start("pipeline")
        wait_for_event(first, "old-1")
    first.close()

    # 2. Check the compatible change against live memory, then deploy it.
    second = node("node-a")
    patched(second)
    for report in second.replay_check():
        print("patched, version 1:", report.verdict)
    unversioned = node("node-a")
    reshaped(unversioned, "1")
    for report in unversioned.replay_check():
        print("reshaped, version 1:", report.verdict, "-", report.detail)

    # 3. The reshaped code ships as version 2, next to the patched version 1.
    third = node("node-b")
    reshaped(third, "2")
    with third.background_worker():
        third.options(object_id="new-2").start("pipeline")
        wait_for_event(third, "new-2")
        third.send("old-1", "go")
        time.sleep(0.5)
        info = third.get("old-1")
        print(f"old-1 with only node-b running: {info.status}, {info.records} records")
        with second.background_worker():
            third.send("new-2", "go")
            for object_id in ("old-1", "new-2"):
                result = third.handle(object_id).result(timeout=10)
                steps = [r.body["name"] for r in third.history(object_id)
                         if r.kind == perdure.Kind.STEP_DONE]
                by = {r.node_id for r in third.history(object_id)
                      if r.kind == perdure.Kind.STEP_DONE}
                print(object_id, f"v{third.get(object_id).agent_version}", result, steps,
                      "on", ", ".join(sorted(by)))
    for app in (second, unversioned, third):
        app.close()
