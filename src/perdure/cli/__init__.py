"""The ``perdure`` command line: one module per command group.

``main`` is the console script's entry point (``perdure = "perdure.cli:main"``); ``cli`` is
the click group, for tests and for embedding. The groups: ``main`` (the root options and
the object commands: worker, start, ls, show, send, result, verify, ...), ``approvals``,
``keys``, ``data_keys``, ``steer`` (questions, queries, fork, retry), ``tail``, ``triggers``
and ``ui``.
"""

from __future__ import annotations

from perdure.cli.main import cli, main

__all__ = ["cli", "main"]
