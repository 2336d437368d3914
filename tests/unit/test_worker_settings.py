"""A node's settings are checked as they are built."""

from __future__ import annotations

import pytest

from perdure.engine.settings import WorkerSettings
from perdure.errors import ConfigurationError


@pytest.mark.parametrize(("field", "value"), [("concurrency", 0), ("held_records", -1),
                                              ("lease_seconds", 0.2), ("poll_interval", 0)])
def test_wrong_worker_settings_are_configuration_errors(field: str, value: float) -> None:
    """A wrong setting fails as it is built, with the error for settings."""
    with pytest.raises(ConfigurationError, match=field):
        WorkerSettings(**{field: value})
