"""An App on the in-memory store: what a user's own tests do with ``store="memory:"``."""

from __future__ import annotations

from pathlib import Path

import perdure
from perdure.stores.memory import MemoryStore
from tests.integration.engine_support import wait_until


def test_an_agent_runs_to_completion_on_a_memory_store(key_dir: Path) -> None:
    """Steps, an event it waits for and a child it delegates to, run by a node on the
    App's own in-memory store; the memory verifies, and a second App given the same
    store object sees the same objects."""
    app = perdure.App(store="memory:", key_dir=key_dir, poll_interval=0.01)
    try:
        assert app.store_url == "memory:"

        def double(x: int) -> int:
            return 2 * x

        @app.agent(name="child")
        async def child(run: perdure.Run, x: int) -> int:
            return await run.step(double, x)

        @app.agent(name="parent")
        async def parent(run: perdure.Run, x: int) -> dict[str, int]:
            doubled = await run.step(double, x)
            extra = await run.wait_for("extra")
            from_child = await (await run.delegate(child, doubled + extra["n"]))
            return {"doubled": doubled, "child": from_child}

        handle = app.start("parent", 5, object_id="memory-parent")
        with app.background_worker(concurrency=4):
            assert wait_until(lambda: handle.info().waiting_event == "extra", timeout=10)
            assert app.send("memory-parent", "extra", {"n": 1})
            assert handle.result(timeout=10) == {"doubled": 10, "child": 22}
        assert app.verify("memory-parent").ok
        kids = app.list(parent="memory-parent")
        assert len(kids) == 1 and kids[0].status == "completed"
        assert app.verify(kids[0].object_id).ok

        assert isinstance(app.store, MemoryStore)
        other = perdure.App(store=app.store, key_dir=key_dir)
        assert other.get("memory-parent").status == "completed"
    finally:
        app.close()
