"""The ``store`` fixture: one fresh, isolated store per test, for every backend.

Each backend is a context manager that opens an empty store for one test and
disposes of it afterwards: a SQLite file, or a private PostgreSQL database
cloned from a migrated template (``tests/pg.py``) and dropped on exit, so tests
never see each other's rows. ``PERDURE_TEST_BACKENDS`` selects the backends.
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
def _sqlite(folder: Path) -> Iterator[Store]:
    store = open_store(f"sqlite:///{folder / 'contract.db'}")
    try:
        yield store
    finally:
        store.close()


@contextlib.contextmanager
def _postgresql(folder: Path) -> Iterator[Store]:
    del folder
    with fresh_database() as url:
        store = open_store(url)
        try:
            yield store
        finally:
            store.close()


_ALL: dict[str, Callable[[Path], contextlib.AbstractContextManager[Store]]] = {
    "sqlite": _sqlite,
    "postgresql": _postgresql,
}
BACKENDS = {name: _ALL[name] for name in SELECTED}


@pytest.fixture(params=sorted(BACKENDS))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """An empty store of each backend, private to this test."""
    with BACKENDS[request.param](tmp_path) as opened:
        yield opened


@pytest.fixture
def signer(store: Store) -> Signer:
    """A node identity registered in ``store``."""
    from perdure._keys import public_bytes

    node = make_signer("node-a")
    store.register_node(node.node_id, public_bytes(node.private_key), 0.0)
    return node
