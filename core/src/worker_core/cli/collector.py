"""The cyclic garbage collector stays off while a command starts, and a worker turns it back on
before its first task, with what the start made set aside for good."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["paused", "resume"]

_paused = False


@contextmanager
def paused() -> Iterator[None]:
    """Starting makes many objects and next to no garbage, and the collector would pass over the
    growing heap again and again as modules load (about 100 collections, 14 ms of a worker's
    start). It is on again when the command ends or, for a worker, just before it consumes."""
    global _paused
    if not gc.isenabled():  # someone turned it off on purpose: leave it so
        yield
        return
    gc.disable()
    _paused = True
    try:
        yield
    finally:
        if _paused:
            _paused = False
            gc.enable()


def resume() -> None:
    """Turn the collector back on if :func:`paused` turned it off: a worker calls this just before
    it first asks the broker for tasks, so that no task runs with the collector off (a task's
    garbage would be frozen with the rest).

    Everything made while the collector was off sits in its youngest generation, and the first
    collection would go over all of it (about 10 ms, in front of the first task). The start's
    objects (modules, classes, the app, the steps) live as long as the worker, so they are
    frozen instead: no collection looks at them again, which also leaves the memory pages a
    prefork child shares with the parent unwritten.
    """
    global _paused
    if _paused:
        _paused = False
        gc.freeze()
        gc.enable()
