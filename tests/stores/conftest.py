"""The ``store`` fixture: one fresh, isolated store per test, for every backend.

Each backend is a context manager that gives one test the URL of an empty place
and disposes of it afterwards: a SQLite file, or a private PostgreSQL database
cloned from a migrated template (``tests/pg.py``) and dropped on exit, so tests
never see each other's rows. ``store`` opens it; ``open_again`` opens more stores
on it, as other nodes would. ``PERDURE_TEST_BACKENDS`` selects the SQL backends;
the in-memory store is always in: it needs nothing outside the test, and it shows
that the contract holds without SQL. Nodes in one process share one in-memory store
by sharing the object, so ``open_again`` gives the test's own store back there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from perdure.core.chain import Signer
from perdure.stores import Store, open_store
from tests.pg import BACKENDS as SELECTED
from tests.pg import fresh_database
from tests.stores.builders import make_signer


@contextlib.contextmanager
def _sqlite(folder: Path) -> Iterator[str]:
    yield f"sqlite:///{folder / 'contract.db'}"


@contextlib.contextmanager
def _postgresql(folder: Path) -> Iterator[str]:
    del folder
    with fresh_database() as url:
        yield url


@contextlib.contextmanager
def _memory(folder: Path) -> Iterator[str]:
    del folder
    yield "memory://contract"


_ALL: dict[str, Callable[[Path], contextlib.AbstractContextManager[str]]] = {
    "sqlite": _sqlite,
    "postgresql": _postgresql,
    "memory": _memory,
}
BACKENDS = {name: _ALL[name] for name in [*SELECTED, "memory"]}


@pytest.fixture(params=sorted(BACKENDS))
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of an empty place for a store of each backend, private to this test."""
    with BACKENDS[request.param](tmp_path) as url:
        yield url


@pytest.fixture
def store(place: str) -> Iterator[Store]:
    """An empty store of each backend, private to this test."""
    opened = open_store(place)
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def open_again(place: str, store: Store) -> Iterator[Callable[[], Store]]:
    """Open more stores on the test's store (as other nodes do); closed after the test.
    An in-memory store is shared by sharing the object: the test's own store, then."""
    opened: list[Store] = []

    def open_one() -> Store:
        if place.startswith("memory:"):
            return store
        opened.append(open_store(place))
        return opened[-1]

    yield open_one
    for other in opened:
        other.close()


@pytest.fixture
def signer(store: Store) -> Signer:
    """A node identity signing the test's records (the store holds no key of it)."""
    return make_signer("node-a")
