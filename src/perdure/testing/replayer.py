"""``Replayer``: check today's agent code against histories kept in files, no store needed.

Each history (``History``, read and checked from its file) is replayed by the engine's
own replay check (``perdure.engine.replay``, what ``App.replay_check`` and ``perdure
replay-check`` run against live memory): the agent runs again from the top against its
recorded memory through a read-only journal; recorded commands return what memory
holds, no step runs, nothing is written, and the first command past the history ends
the check. A command that is not the one recorded at its position (a step renamed,
commands reordered, one added before the end or removed) is a divergence.

``replay`` raises ``ReplayFailedError`` for a divergence (naming the position, what
memory recorded there and what the code asks for) or for an agent that raised while
replaying; ``raise_on_failure=False`` returns the ``ReplayReport`` instead. A history
whose agent the App registers at another version is ``not-served`` and passes (a new
version is how an incompatible change ships: its old objects keep their old code); one
whose agent the App does not register at all fails.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from pathlib import Path

from perdure.app import App
from perdure.engine.replay import ReplayReport, replay_check
from perdure.errors import ConfigurationError, ReplayFailedError
from perdure.testing.history import History, history_files

__all__ = ["Replayer"]


class Replayer:
    """Replays histories against the agents registered with ``app`` (its store is never
    opened)."""

    def __init__(self, app: App) -> None:
        if not isinstance(app, App):
            raise ConfigurationError(f"Replayer takes a perdure.App, not {type(app).__name__}")
        self.app = app

    def replay(self, history: History | str | Path, *, raise_on_failure: bool = True
               ) -> ReplayReport:
        """Replay one history (a ``History`` or the path of its file) against the
        current code; its report. See the module for what fails."""
        return asyncio.run(self.areplay(history, raise_on_failure=raise_on_failure))

    async def areplay(self, history: History | str | Path, *,
                      raise_on_failure: bool = True) -> ReplayReport:
        """``replay`` for async code."""
        loaded = history if isinstance(history, History) else History.read(history)
        agents = self.app.agents
        report = await replay_check(agents, loaded.records)
        if report.verdict == "not-served" and report.agent not in agents:
            report = dataclasses.replace(
                report, verdict="error",
                detail=f"this code registers no agent {report.agent!r} (registered: "
                       f"{', '.join(sorted(agents)) or 'none'})")
        if raise_on_failure and not report.ok:
            raise ReplayFailedError(report.object_id, report.verdict, report.detail,
                                    position=report.position, recorded=report.recorded,
                                    found=report.found,
                                    path=None if loaded.path is None else str(loaded.path))
        return report

    def replay_all(self, paths: Sequence[str | Path], *, raise_on_failure: bool = True
                   ) -> list[ReplayReport]:
        """Replay every history ``paths`` name (files, or folders of ``*.json`` files);
        the reports in order. With ``raise_on_failure``, the first failure raises."""
        return [self.replay(path, raise_on_failure=raise_on_failure)
                for path in history_files(paths)]
