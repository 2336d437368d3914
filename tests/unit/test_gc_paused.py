"""The collector pause around building a long history."""

from __future__ import annotations

import gc

import pytest

from perdure.core.gc import gc_paused


def test_the_collector_is_paused_and_comes_back() -> None:
    """Off inside the block, on again after it, also when the block raises."""
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_a_collector_the_program_turned_off_stays_off() -> None:
    """The pause never turns on a collector that was off before it."""
    gc.disable()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
