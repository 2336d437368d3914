"""Fixtures of the acceptance tier: a cluster of real worker processes per test."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.harness import Cluster
from tests.pg import BACKENDS, NO_SERVER, fresh_database


@pytest.fixture
def cluster(tmp_path: Path, store_url: str) -> Iterator[Cluster]:
    """Store (of each backend), keys, sink and worker processes; all killed afterwards."""
    made = Cluster(tmp_path, store_url)
    yield made
    made.close()


@pytest.fixture
def pg_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A cluster on a fresh PostgreSQL database (skipped when that backend is not selected)."""
    if "postgresql" not in BACKENDS:
        pytest.skip(NO_SERVER)
    with fresh_database() as url:
        made = Cluster(tmp_path, url)
        try:
            yield made
        finally:
            made.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    """Attach every worker's log to the report of a failing acceptance test."""
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    for made in getattr(item, "funcargs", {}).values():
        if isinstance(made, Cluster):
            report.sections.append(("perdure worker logs", made.logs()))
