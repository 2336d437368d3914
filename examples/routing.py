"""Capability routing: work goes only to nodes that can do it, and no node spins on it.

Run it: python examples/routing.py
Two nodes share one SQLite file: ``cpu-node`` and ``gpu-node`` (capability ``gpu``).
``render`` requires ``gpu`` for the whole object, ``prepare`` only for one step, and
``upload`` has a step that raises ``CannotDo`` on ``cpu-node``. The memory of each
object shows which node did what, and what a node said it could not do.
"""

import time
from pathlib import Path

import perdure


def resize(n: int) -> int:
    return n * 2


def paint(n: int) -> str:
    return f"painted {n}"


def node(node_id: str, capabilities: set[str], *, reaches_uploads: bool) -> perdure.App:
    app = perdure.App(store="sqlite:///routing.db", key_dir=".perdure-keys",
                      node_id=node_id, capabilities=capabilities, poll_interval=0.02)

    def send_file(name: str) -> str:
        if not reaches_uploads:  # found out only by trying, on this node
            raise perdure.CannotDo("no route to the upload host from here")
        return f"uploaded {name}"

    @app.agent(name="render", requires={"gpu"})
    async def render(run: perdure.Run, n: int) -> str:
        return await run.step(paint, n)

    @app.agent(name="prepare")
    async def prepare(run: perdure.Run, n: int) -> list:
        size = await run.step(resize, n)  # any node
        return [size, await run.step(paint, size, requires={"gpu"})]

    @app.agent(name="upload")
    async def upload(run: perdure.Run, name: str) -> str:
        return await run.step(send_file, name, name="send_file")

    return app


def who_did_what(app: perdure.App, object_id: str) -> list[str]:
    lines = []
    for rec in app.history(object_id):
        if rec.kind == perdure.Kind.STEP_DONE:
            lines.append(f"{rec.body['name']} on {rec.node_id}")
        elif rec.kind == perdure.Kind.CAPABILITY_MISSING:
            said = rec.body.get("reason") or f"lacks {', '.join(rec.body['capabilities'])}"
            lines.append(f"{rec.node_id}: {said}")
    return lines


if __name__ == "__main__":
    for leftover in Path().glob("routing.db*"):  # each run starts over
        leftover.unlink()
    cpu = node("cpu-node", set(), reaches_uploads=False)
    gpu = node("gpu-node", {"gpu"}, reaches_uploads=True)

    with cpu.background_worker():
        cpu.options(object_id="render-1").start("render", 1)
        cpu.options(object_id="prepare-1").start("prepare", 2)
        cpu.options(object_id="upload-1").start("upload", "report.pdf")
        time.sleep(1.0)
        for object_id in ("render-1", "prepare-1", "upload-1"):
            info = cpu.get(object_id)
            print(f"{object_id}: {info.status}, {info.note or 'no note'}")

    with gpu.background_worker():
        for object_id in ("render-1", "prepare-1", "upload-1"):
            result = gpu.handle(object_id).result(timeout=10)
            print(object_id, "->", result, "|", "; ".join(who_did_what(gpu, object_id)))
    cpu.close()
    gpu.close()
