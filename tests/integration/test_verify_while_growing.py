"""``verify`` reads an object's row and then its records: an object a worker appends to
between the two reads is not reported as damaged (memory only grows)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import perdure
from perdure.stores import open_store
from tests.integration.engine_support import wait_until


def _app(url: str | perdure.stores.Store, keys: Path) -> perdure.App:
    app = perdure.App(store=url, key_dir=keys, poll_interval=0.01)

    @app.agent(name="rounds")
    async def rounds(run: perdure.Run, count: int) -> int:
        for _ in range(count):
            await run.wait_for("go")
        return count

    return app


def test_an_append_between_the_row_and_the_records_is_not_damage(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'grow.db'}"
    keys = tmp_path / "keys"
    node = _app(url, keys)
    store = open_store(url)
    reader = _app(store, keys)
    real_records = store.records
    grown: list[int] = []

    def records(object_id: str, after_seq: int = 0) -> Any:
        # The first read of the records comes after an append that the row read before
        # it did not see.
        if not grown:
            before = store.get(object_id)
            assert before is not None
            node.send(object_id, "go")
            assert wait_until(lambda: store.get(object_id).head_seq > before.head_seq,  # type: ignore[union-attr]
                              timeout=15)
            grown.append(before.head_seq)
        return real_records(object_id, after_seq)

    with node.background_worker():
        handle = node.options(object_id="g-1").start("rounds", 3)
        assert wait_until(lambda: handle.info().status == "dormant", timeout=15)
        store.records = records  # type: ignore[method-assign]
        report = reader.verify("g-1")
        assert grown, "the append was not made between the reads"
        assert report.ok, report.reason
        store.records = real_records  # type: ignore[method-assign]
        node.send("g-1", "go")
        node.send("g-1", "go")
        assert handle.result(timeout=15) == 3
    assert reader.verify("g-1").ok
    reader.close()
    store.close()
    node.close()
