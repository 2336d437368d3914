"""Pausing the cyclic garbage collector while a long history is built in memory."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["gc_paused"]


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Hold off the cyclic collector for the block, if it is on.

    Reading 10,000 records builds tens of thousands of tuples and dicts. Each batch of
    new containers starts a collection that walks every young object again, and the
    growing heap soon sets off full ones: on a cold resume that is a third of the time.
    These objects hold no cycles, so nothing is lost by collecting after the block. A
    collector the program turned off stays off.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
