"""The ``store`` fixture: one fresh, isolated store per test, for every backend.

Each backend is a context manager that opens an empty store for one test and
disposes of it afterwards. Only SQLite exists today. A PostgreSQL backend is
added by one more entry in ``BACKENDS``: it creates a database named after the
test (``CREATE DATABASE perdure_test_<hex>`` on a server given by an environment
variable, skipping when none is given), yields ``open_store`` on it, and drops
the database on exit, so tests never see each other's rows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from perdure.core.chain import Signer
from perdure.stores import Store, open_store
from tests.stores.builders import make_signer


@contextlib.contextmanager
def _sqlite(folder: Path) -> Iterator[Store]:
    store = open_store(f"sqlite:///{folder / 'contract.db'}")
    try:
        yield store
    finally:
        store.close()


BACKENDS: dict[str, Callable[[Path], contextlib.AbstractContextManager[Store]]] = {
    "sqlite": _sqlite,
}


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
