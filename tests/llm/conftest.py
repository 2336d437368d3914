"""Tests of ``perdure.llm``: collected only when the ``perdure[llm]`` extra is installed.

Without it every module here but ``test_extra.py`` is left out of collection (they import
the package at the top), and ``test_extra.py`` reports the skip with its reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perdure.errors import ConfigurationError

try:
    import perdure.llm  # noqa: F401 - only whether it imports
except ConfigurationError as exc:
    MISSING_EXTRA: str | None = str(exc)
else:
    MISSING_EXTRA = None


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Leave out the modules that need the extra when it is missing."""
    if MISSING_EXTRA is not None and collection_path.name != "test_extra.py":
        return collection_path.suffix == ".py" and collection_path.name.startswith("test_")
    return None


@pytest.fixture
def server() -> Iterator[Any]:
    """A scripted model server on a free port of 127.0.0.1, stopped after the test."""
    from perdure.llm.scripted import ScriptedServer

    with ScriptedServer() as running:
        yield running
