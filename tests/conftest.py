"""Shared fixtures: every test gets its own real SQLite file and key directory."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import perdure
from tests import pg
from tests.pg import BACKENDS, fresh_database

# Fails any test during which a worker's event loop stalls over 100 ms (tests/watchdog.py);
# skips accounted for (CI fails when a tier did not run); Hypothesis without deadlines.
pytest_plugins = ["tests.watchdog", "tests.skips", "tests.hypothesis_profile"]


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


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Drop this process's PostgreSQL template and spare clones (each xdist worker has its
    own), once every test database has been dropped."""
    pg.close()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The store backend under test: ``sqlite`` and ``postgresql`` (see ``tests/pg.py``)."""
    return str(request.param)


@pytest.fixture
def store_url(backend: str, tmp_path: Path) -> Iterator[str]:
    """A fresh store URL of the backend under test: a SQLite file or a private database."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
        return
    with fresh_database() as url:
        yield url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A fresh SQLite store URL, for tests about the SQLite file itself."""
    return f"sqlite:///{tmp_path / 'store.db'}"


@pytest.fixture
def key_dir(tmp_path: Path) -> Path:
    """A fresh key directory for this test's node(s)."""
    return tmp_path / "keys"


@pytest.fixture
def make_sqlite_app(sqlite_url: str, key_dir: Path) -> Iterator[Callable[..., perdure.App]]:
    """Build Apps on one SQLite store file (short leases, fast polling); closed afterwards."""
    apps: list[perdure.App] = []

    def make(**options: Any) -> perdure.App:
        options.setdefault("lease_seconds", 2.0)
        app = perdure.App(store=sqlite_url, key_dir=key_dir, poll_interval=0.01, **options)
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.close()


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
