"""``workerctl``: the command line.

Internal to worker-core (see :mod:`worker_core` for the public API).
"""

import sys
from typing import TYPE_CHECKING, Any

from . import collector

if TYPE_CHECKING:
    from .group import main

__all__ = ["main", "run"]


def run() -> None:
    """The ``workerctl`` program. The garbage collector is off before the command group and the
    rest of the worker are imported (see :mod:`.collector`).

    ``workerctl health`` (the exec probe) answers before any of that: it imports only what reads
    the worker's state file, not the command-line library, the app or its tasks."""
    if sys.argv[1:2] == ["health"]:
        from ..health.probe import main as probe

        sys.exit(probe(sys.argv[2:]))
    with collector.paused():
        from .group import main

        main(prog_name="workerctl")


def __getattr__(name: str) -> Any:
    if name == "main":
        from .group import main

        return main
    raise AttributeError(f"module 'worker_core.cli' has no attribute {name!r}")
