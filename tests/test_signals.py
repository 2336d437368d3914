"""One tree: every exception class perdure defines is a ``PerdureError`` or a
``PerdureSignal``, so nothing else can reach a user's code, and every signal gets past an
agent's ``except Exception``."""

from __future__ import annotations

import ast
import importlib

import pytest

import perdure.engine.journal
import perdure.engine.replay
import perdure.engine.run
import perdure.engine.signals
from perdure.errors import PerdureError, PerdureSignal
from tests.test_public_api import MODULES, PACKAGE_DIR

# ``Exception``s that never leave the module defining them (caught there, or, for the
# demo, by the demo's own story runner): internal control flow, not errors for people.
PRIVATE_EXCEPTIONS = {
    "perdure.stores._postgres_commit:Refused",
    "perdure.stores._postgres_commit:RetryWithSavepoints",
    "perdure.stores._sqlite_file:Busy",
    "perdure.stores._sqlite_commit:RetryWithSavepoints",
    "perdure.stores.memory:_Busy",
    "perdure.engine.failures:_TooLarge",
    "perdure.engine.failures:_Refused",
    "perdure.engine.restore:_StaleStopError",
    "perdure.demo.story:DemoError",
    "perdure.core.bodies.fields:MalformedBodyError",
    "perdure.llm._wire_responses:ResponsesStreamError",
    "perdure.keys.client:_BehindSeenHeadError",
    "perdure.web._api:_Problem",
}

ENGINE_SIGNALS = [
    perdure.engine.signals.Suspend,
    perdure.engine.signals.Park,
    perdure.engine.signals.DeadlineExceeded,
    perdure.engine.journal.StoreUnavailable,
    perdure.engine.journal.HistoryEnd,
]


def _perdure_exception_classes() -> list[type[BaseException]]:
    """Every exception class defined in the package (after importing all of it)."""
    for name in MODULES:
        importlib.import_module(name)
    found: list[type[BaseException]] = []
    todo: list[type[BaseException]] = [BaseException]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        module = cls.__module__
        if (module == "perdure" or module.startswith("perdure.")) and cls not in found:
            found.append(cls)
    return found


def test_the_walk_finds_the_classes() -> None:
    """The walk sees errors, signals and private exceptions alike (it cannot pass empty)."""
    found = {f"{cls.__module__}:{cls.__qualname__}" for cls in _perdure_exception_classes()}
    assert {"perdure.errors:PerdureError", "perdure.errors:LeaseLostError",
            "perdure.engine.signals:Suspend", "perdure.engine.journal:HistoryEnd",
            "perdure.stores._sqlite_file:Busy"} <= found


def test_every_exception_class_is_an_error_or_a_signal() -> None:
    """Each exception class perdure defines derives from ``PerdureError`` or
    ``PerdureSignal``; the few private ``Exception``s listed above are the only others."""
    stray = [
        f"{cls.__module__}:{cls.__qualname__}"
        for cls in _perdure_exception_classes()
        if not issubclass(cls, PerdureError | PerdureSignal)
        and f"{cls.__module__}:{cls.__qualname__}" not in PRIVATE_EXCEPTIONS
    ]
    assert stray == []


def test_private_exceptions_are_plain_exceptions() -> None:
    """A private exception is an ``Exception``: a bare ``BaseException`` would slip past
    every ``except Exception`` on its way out of its module."""
    for cls in _perdure_exception_classes():
        if f"{cls.__module__}:{cls.__qualname__}" in PRIVATE_EXCEPTIONS:
            assert issubclass(cls, Exception), cls


def test_no_class_in_the_source_derives_from_base_exception_but_the_root() -> None:
    """Read from the source, so classes defined inside functions count too: only
    ``PerdureSignal`` names ``BaseException`` as its base."""
    direct = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and any(
                    isinstance(base, ast.Name) and base.id == "BaseException"
                    for base in node.bases):
                direct.append(f"{path.relative_to(PACKAGE_DIR)}:{node.name}")
    assert direct == ["errors.py:PerdureSignal"]


@pytest.mark.parametrize("signal", ENGINE_SIGNALS, ids=lambda cls: cls.__name__)
def test_engine_signals_are_signals(signal: type[BaseException]) -> None:
    """The engine's own signals are ``PerdureSignal``s, never ``Exception``s."""
    assert issubclass(signal, PerdureSignal)
    assert not issubclass(signal, Exception)


def test_signals_stay_importable_from_run() -> None:
    """``perdure.engine.run`` still offers the names other modules import from it."""
    run = perdure.engine.run
    assert run.Suspend is perdure.engine.signals.Suspend
    assert run.Park is perdure.engine.signals.Park
    assert run.DeadlineExceeded is perdure.engine.signals.DeadlineExceeded


def test_an_agent_except_exception_does_not_catch_a_signal() -> None:
    """What the tree promises, shown: ``except Exception`` lets a ``Suspend`` through."""
    with pytest.raises(perdure.engine.signals.Suspend):
        try:
            raise perdure.engine.signals.Suspend([], ready_at=None)
        except Exception:  # the agent's catch-all this test is about
            pytest.fail("a signal was caught as an Exception")
