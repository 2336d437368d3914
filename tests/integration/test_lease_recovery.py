"""A restarted worker on the same node takes its dead predecessor's objects back at once.

The leases here last two minutes, far longer than any wait below: an object comes back
within the test's bounds only because the new process saw that the lease's holder (an
earlier process of the same node) is dead and ended its lease (``engine/leases.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import perdure
from tests.integration.engine_support import (
    count_lines,
    kill_process,
    start_worker_process,
    two_steps,
    wait_until,
)

AppFactory = Callable[..., perdure.App]
LEASE = 120.0  # seconds: the object could only come back sooner through recovery


def test_the_same_node_takes_a_dead_process_lease_back_at_once(
        make_app: AppFactory, store_url: str, key_dir: Path, tmp_path: Path) -> None:
    first, second = str(tmp_path / "first"), str(tmp_path / "second")
    starter = make_app(lease_seconds=LEASE)
    starter.agent(name="two_steps")(two_steps)
    starter.options(object_id="held-1").start("two_steps", first, second, 60.0)
    log = tmp_path / "worker.log"
    proc = start_worker_process(store_url, key_dir, log, lease=LEASE)
    try:
        assert wait_until(lambda: count_lines(second) == 1, timeout=30), log.read_text()
        held = starter.get("held-1")
        assert held.lease_owner is not None and held.lease_owner.endswith(f"/{proc.pid}")
    finally:
        kill_process(proc)
    epoch = starter.get("held-1").epoch

    resumer = make_app(lease_seconds=LEASE)  # same key folder: the same node
    resumer.agent(name="two_steps")(two_steps)
    assert resumer.node_id == starter.node_id
    with resumer.background_worker():
        result = resumer.handle("held-1").result(timeout=30)
    assert result == ["quick", "done"]
    assert resumer.get("held-1").epoch > epoch
    assert count_lines(first) == 1 and count_lines(second) == 2
    assert resumer.verify("held-1").ok
