"""What a green run promises: every tier ran. Skips are accounted for at the end of a run.

A skip is *expected* when ``tests/expected_skips.txt`` lists it (a path prefix of the
test's id and the start of its reason): a soak variant, or a test about one backend's
internals parametrized over both. Any other skip means a tier did not run here (no
Chromium, an extra not installed, no PostgreSQL server or server programs, a backend
left out of ``PERDURE_TEST_BACKENDS``).

Locally the run ends with a summary of those, grouped by reason. Under CI (``CI`` set to
anything but ``0``/``false``/``no``) each is a line naming the test and its reason, and
the run fails; so does a run leaving a backend out of ``PERDURE_TEST_BACKENDS``.

Loaded by ``tests/conftest.py`` (``pytest_plugins``); under pytest-xdist only the
controlling process keeps the account (workers' reports reach it).
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ALLOW_LIST = Path(__file__).with_name("expected_skips.txt")
ALL_BACKENDS = ("sqlite", "postgresql")


@dataclass(frozen=True, slots=True)
class Expected:
    """One line of the allow-list: where the skipped test lives, and its reason's start."""

    where: str
    reason: str

    def covers(self, nodeid: str, reason: str) -> bool:
        """Whether this entry expects a skip of ``nodeid`` for ``reason``."""
        return nodeid.startswith(self.where) and reason.startswith(self.reason)


def load(path: Path = ALLOW_LIST) -> list[Expected]:
    """The entries of the allow-list at ``path`` (comments and blank lines left out)."""
    entries = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        where, bar, reason = text.partition(" | ")
        if not bar or not where.strip() or not reason.strip():
            raise ValueError(f"{path}:{number}: expected 'PATH | REASON', got {text!r}")
        entries.append(Expected(where.strip(), reason.strip()))
    return entries


def in_ci() -> bool:
    """Whether this run is CI's (``CI`` set, and not to ``0``, ``false`` or ``no``)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def reason_of(report: pytest.CollectReport | pytest.TestReport) -> str:
    """A skip report's reason, without pytest's ``Skipped:`` prefix."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ").strip()


@dataclass
class Account:
    """The skips seen in one run, by test id."""

    expected: list[Expected]
    seen: dict[str, str] = field(default_factory=dict)

    def note(self, report: pytest.CollectReport | pytest.TestReport) -> None:
        """Record ``report`` if it is a skip (an expected failure, ``xfail``, is not)."""
        if report.skipped and not hasattr(report, "wasxfail"):
            self.seen.setdefault(report.nodeid, reason_of(report))

    def unexpected(self) -> dict[str, str]:
        """The skips no allow-list entry covers, by test id."""
        return {nodeid: reason for nodeid, reason in self.seen.items()
                if not any(entry.covers(nodeid, reason) for entry in self.expected)}


def missing_backends() -> list[str]:
    """The backends ``PERDURE_TEST_BACKENDS`` leaves out."""
    from tests.pg import BACKENDS

    return [name for name in ALL_BACKENDS if name not in BACKENDS]


_ACCOUNT = pytest.StashKey[Account]()
_config: pytest.Config | None = None  # the report hooks are given no configuration


def _controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    """Start the account (in the controlling process only)."""
    if _controller(config):
        config.stash[_ACCOUNT] = Account(load())


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Note a test's skip."""
    account = _account_of(report)
    if account is not None:
        account.note(report)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    """Note a module skipped while collecting (``pytest.importorskip`` at its top)."""
    account = _account_of(report)
    if account is not None:
        account.note(report)


def _account_of(report: pytest.CollectReport | pytest.TestReport) -> Account | None:
    if _config is None or _ACCOUNT not in _config.stash:
        return None
    return _config.stash[_ACCOUNT]


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Remember the configuration the report hooks need."""
    global _config
    _config = session.config


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under CI, fail a run that was otherwise green when a tier did not run."""
    config = session.config
    if not (_controller(config) and in_ci() and _ACCOUNT in config.stash):
        return
    if session.exitstatus == pytest.ExitCode.OK and (
            config.stash[_ACCOUNT].unexpected() or missing_backends()):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say which skips were expected and which were not (each one, under CI)."""
    config = terminalreporter.config
    if not _controller(config) or _ACCOUNT not in config.stash:
        return
    account = config.stash[_ACCOUNT]
    unexpected = account.unexpected()
    missing = missing_backends()
    if not account.seen and not missing:
        return
    write = terminalreporter.write_line
    expected = len(account.seen) - len(unexpected)
    terminalreporter.write_sep(
        "-", f"skips: {expected} expected ({ALLOW_LIST.name}), {len(unexpected)} not")
    if in_ci():
        for nodeid, reason in sorted(unexpected.items()):
            write(f"UNEXPECTED SKIP {nodeid}: {reason}", red=True)
        if missing:
            write(f"NOT RUN: PERDURE_TEST_BACKENDS leaves out {', '.join(missing)}; "
                  "CI runs every backend", red=True)
        if unexpected or missing:
            write("CI fails: a tier did not run (tests/expected_skips.txt lists the skips "
                  "a full run expects)", red=True)
        return
    by_reason: dict[str, list[str]] = defaultdict(list)
    for nodeid, reason in unexpected.items():
        by_reason[reason].append(nodeid)
    for reason, nodeids in sorted(by_reason.items(), key=lambda item: -len(item[1])):
        more = f" (and {len(nodeids) - 1} more)" if len(nodeids) > 1 else ""
        write(f"not run here: {reason}: {sorted(nodeids)[0]}{more}", yellow=True)
    if missing:
        write(f"not run here: PERDURE_TEST_BACKENDS leaves out {', '.join(missing)}",
              yellow=True)
    if unexpected or missing:
        write("under CI (CI=true) these fail the run", yellow=True)
