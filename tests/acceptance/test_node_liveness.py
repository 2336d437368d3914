"""Which nodes are live, as the dashboard and ``perdure show`` see them: a worker that
stops is gone at once; a killed one ages out when its last heartbeat runs out (one lease)."""

from __future__ import annotations

import time

from tests.acceptance.harness import Cluster, wait_until


def _live(cluster: Cluster) -> list[str]:
    app = cluster.app()
    try:
        return [n.node_id for n in app.store.live_nodes(time.time())]
    finally:
        app.close()


def test_a_stopped_worker_is_gone_at_once(cluster: Cluster) -> None:
    """SIGTERM: the worker says it stopped on its way out, so no reader counts it live,
    though its last heartbeat promised a whole (long) lease."""
    worker = cluster.spawn(lease=60.0)
    wait_until("the worker to come up", worker.ready, timeout=60)
    wait_until("the worker to be live", lambda: _live(cluster) == [worker.node_id], timeout=30)
    assert worker.stop() == 0
    assert _live(cluster) == []


def test_a_killed_worker_ages_out_after_its_lease(cluster: Cluster) -> None:
    """SIGKILL: nothing says the worker stopped; it counts as live until its last
    heartbeat runs out (its lease length), then no longer."""
    worker = cluster.spawn(lease=2.0)
    wait_until("the worker to come up", worker.ready, timeout=60)
    wait_until("the worker to be live", lambda: _live(cluster) == [worker.node_id], timeout=30)
    worker.kill()
    wait_until("the killed worker to age out", lambda: _live(cluster) == [], timeout=30)
