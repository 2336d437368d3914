"""Changing an agent's code while objects started with the old code are still running.

Run it: python examples/versions.py
An object started under version 1 waits for an event. The code is then "redeployed" as
version 2, which adds a step in front. Objects started under version 1 keep the old path
(the code branches on ``run.intent.version``); new objects take the new one.
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


def build_app(version: str) -> perdure.App:
    app = perdure.App(store="sqlite:///versions.db", key_dir=".perdure-keys")

    @app.agent(name="pipeline", version=version)
    async def pipeline(run: perdure.Run) -> str:
        if run.intent.version != "1":  # version 2 added this step in front
            await run.step(check_quota)
        data = await run.step(fetch)
        await run.wait_for("go")
        return await run.step(clean, data)

    return app


if __name__ == "__main__":
    for leftover in Path().glob("versions.db*"):  # each run starts over
        leftover.unlink()
    v1 = build_app("1")
    with v1.background_worker():
        v1.start("pipeline", object_id="old-1")
        while v1.get("old-1").waiting_event is None:
            time.sleep(0.05)
    v1.close()

    v2 = build_app("2")  # the redeployed code
    with v2.background_worker():
        v2.start("pipeline", object_id="new-1")
        for object_id in ("old-1", "new-1"):
            v2.send(object_id, "go")
            version = v2.get(object_id).agent_version
            print(object_id, f"v{version}", v2.handle(object_id).result(timeout=10))
