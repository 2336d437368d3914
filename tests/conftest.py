"""Shared fixtures: every test gets its own real SQLite file and key directory."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import perdure


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
