"""Fixtures of the acceptance tier: a cluster of real worker processes per test."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.harness import Cluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Store, keys, sink and worker processes in the test's folder; all killed afterwards."""
    made = Cluster(tmp_path)
    yield made
    made.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    """Attach every worker's log to the report of a failing acceptance test."""
    outcome = yield
    report = outcome.get_result()
    made = getattr(item, "funcargs", {}).get("cluster")
    if report.failed and isinstance(made, Cluster):
        report.sections.append(("perdure worker logs", made.logs()))
