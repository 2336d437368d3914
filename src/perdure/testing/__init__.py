"""Testing agents: run them fast on a clock you skip, answer and approve, replay histories.

- ``Environment(app)``: ``app``'s agents on an in-memory store (or a temporary SQLite
  file) with a worker of their own and a ``VirtualClock``; sleeps, timeouts, retries'
  pauses, approvals' deadlines and deadlines fire at once while the environment waits
  for an object (``run``, ``run_until_complete``, ``EnvHandle.result``) or is told to
  (``skip``). ``run`` says where an object stopped (``Summary``); ``answer``,
  ``approve`` and ``reject`` answer it through the App's own API.
- ``History``: one object's memory as a JSON file to check into a repository (records,
  hashes, signatures; tampering is found when it is read), and ``Replayer(app)``, which
  replays such files against today's code with the engine's own replay check and raises
  ``ReplayFailedError`` naming the position of a non-deterministic change. ``perdure
  replay-check --history FILE...`` does the same from the command line.

See ``docs/howto/testing.md``.
"""

from __future__ import annotations

from perdure.testing.clock import VirtualClock
from perdure.testing.environment import EnvHandle, Environment
from perdure.testing.history import History, history_files
from perdure.testing.replayer import Replayer
from perdure.testing.summary import Summary

__all__ = [
    "EnvHandle",
    "Environment",
    "History",
    "Replayer",
    "Summary",
    "VirtualClock",
    "history_files",
]
