"""Hypothesis without its default 200 ms deadline, for every property test.

A deadline measures the machine, not the code: on two shared cores one slow example
fails a correct test. Tests still bound their own size with ``max_examples``; pytest's
timeout bounds the time. Loaded by ``tests/conftest.py`` (``pytest_plugins``).
"""

from __future__ import annotations

from hypothesis import settings

settings.register_profile("perdure", deadline=None)
settings.load_profile("perdure")
