"""Fixtures of the dashboard tests: a served dashboard over each store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.web.support import Served, serve, stop_serving


@pytest.fixture
def served(store_url: str, key_dir: Path) -> Iterator[Served]:
    """The dashboard over a fresh store of the backend under test."""
    dashboard = serve(store_url, key_dir)
    yield dashboard
    stop_serving(dashboard)
