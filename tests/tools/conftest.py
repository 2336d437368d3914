"""The tool-call tests need the ``perdure[llm]`` extra (the agent loop asks a model)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("openai")


@pytest.fixture
def sink(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The SQLite file tool effects land in (``PERDURE_TOOL_SINK``), for this test."""
    path = tmp_path / "sink.db"
    monkeypatch.setenv("PERDURE_TOOL_SINK", str(path))
    yield path
