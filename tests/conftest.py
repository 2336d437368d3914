"""Shared fixtures: every test gets its own real SQLite file and key directory."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import perdure


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked ``slow`` (soak variants) unless asked for.

    Run them with ``-m slow`` or ``PERDURE_RUN_SLOW=1``; their bounded variants always run.
    """
    if "slow" in (config.getoption("markexpr") or "") or os.environ.get("PERDURE_RUN_SLOW"):
        return
    skip = pytest.mark.skip(reason="soak variant: run with -m slow or PERDURE_RUN_SLOW=1")
    for item in items:
        if item.get_closest_marker("slow"):
            item.add_marker(skip)


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    """A fresh SQLite store URL in the test's temporary folder."""
    return f"sqlite:///{tmp_path / 'store.db'}"


@pytest.fixture
def key_dir(tmp_path: Path) -> Path:
    """A fresh key directory for this test's node(s)."""
    return tmp_path / "keys"


@pytest.fixture
def make_app(store_url: str, key_dir: Path) -> Iterator[Callable[..., perdure.App]]:
    """Build Apps on the test's store with short leases and fast polling; closed afterwards."""
    apps: list[perdure.App] = []

    def make(**options: Any) -> perdure.App:
        options.setdefault("store", store_url)
        options.setdefault("key_dir", key_dir)
        options.setdefault("lease_seconds", 2.0)
        options.setdefault("poll_interval", 0.01)
        app = perdure.App(**options)
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.close()
