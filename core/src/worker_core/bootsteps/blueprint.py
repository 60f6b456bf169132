"""Running a resolved blueprint: start in order, stop and terminate in reverse, unwind on failure."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Generic

from .graph import StepGraph
from .step import ParentT, Step

__all__ = ["Blueprint"]

logger = logging.getLogger("worker.bootsteps")

INIT, RUN, CLOSE, TERMINATE = "init", "running", "closing", "terminating"


class Blueprint(Generic[ParentT]):
    """Starts the steps of a :class:`StepGraph` for one parent (the worker or the consumer).

    A step that fails to start makes the steps already started stop in reverse order before the
    error propagates, so a failed start leaves no process or thread behind.
    """

    def __init__(self, graph: StepGraph) -> None:
        self.graph = graph
        self.state = INIT
        self._started: list[Step[ParentT]] = []

    @property
    def name(self) -> str:
        return self.graph.blueprint

    @property
    def started(self) -> tuple[Step[ParentT], ...]:
        return tuple(self._started)

    def start(self, parent: ParentT) -> None:
        self.state = RUN
        logger.debug("%s: boot order %s", self.name.capitalize(), ", ".join(self.graph.names))
        for step in self.graph.order:
            logger.debug("%s: starting %s", self.name.capitalize(), step.name)
            try:
                step.start(parent)
            except BaseException:
                logger.debug("%s: %s failed to start; unwinding", self.name.capitalize(), step.name)
                self._unwind(parent, terminate=True)
                raise
            self._started.append(step)

    def stop(self, parent: ParentT) -> None:
        """Warm stop: every started step's ``stop`` in reverse; errors are logged, not raised."""
        self.state = CLOSE
        self._unwind(parent, terminate=False)

    def terminate(self, parent: ParentT) -> None:
        """Cold stop: every started step's ``terminate`` in reverse; errors are logged."""
        self.state = TERMINATE
        self._unwind(parent, terminate=True)

    def _unwind(self, parent: ParentT, *, terminate: bool) -> None:
        while self._started:
            step = self._started.pop()
            how = "terminating" if terminate else "stopping"
            logger.debug("%s: %s %s", self.name.capitalize(), how, step.name)
            try:
                (step.terminate if terminate else step.stop)(parent)
            except Exception:
                logger.exception("%s: error while %s step %s", self.name.capitalize(), how, step.name)
        self.state = INIT

    def info(self, parent: ParentT) -> Mapping[str, Any]:
        merged: dict[str, Any] = {}
        for step in self.graph.order:
            merged.update(step.info(parent))
        return merged
