"""The backlog autoscaler: demand = reserved requests + messages waiting in the broker.

It checks every second (on the hub or in a thread), grows to ``min(demand, max)`` and shrinks to
``max(demand, min)`` after the keepalive, like the default, but never while the broker still holds
messages for the worker's queues.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from time import monotonic
from typing import TYPE_CHECKING, Any

from worker_core.autoscale import DemandAutoscaler
from worker_core.exceptions import ConfigurationError

if TYPE_CHECKING:
    from worker_core.slots import Autoscaler

__all__ = ["BacklogAutoscaler"]

#: Seconds between two reads of the queue depth.
INTERVAL = 1.0


class BacklogAutoscaler(DemandAutoscaler):
    def __init__(self, pool: Any, max_concurrency: int, min_concurrency: int = 0, *,
                 backlog: Callable[[], int] | None = None, **kwargs: Any) -> None:
        if backlog is None:
            raise ConfigurationError(
                "the backlog autoscaler needs the worker's queue depth (backlog=...); run it inside "
                "workerctl worker"
            )
        super().__init__(pool, max_concurrency, min_concurrency, backlog=backlog, **kwargs)
        self._waiting = 0
        self._read_at = float("-inf")
        self._repeat: Any = None
        self._ticker: threading.Thread | None = None

    def waiting(self) -> int:
        """The broker's backlog, read at most once per :data:`INTERVAL`."""
        now = monotonic()
        if now - self._read_at >= INTERVAL:
            assert self.backlog is not None
            self._waiting = max(0, int(self.backlog()))
            self._read_at = now
        return self._waiting

    @property
    def qty(self) -> int:
        return int(self.demand()) + self.waiting()

    def scale_down(self, n: int) -> bool:
        if self.waiting():
            return False
        return super().scale_down(n)

    def start(self) -> None:
        super().start()
        if self.hub is not None:
            self._repeat = self.hub.call_repeatedly(INTERVAL, self.maybe_scale)

    def stop(self) -> None:
        if self._repeat is not None:
            self._repeat.cancel()
        super().stop()

    def info(self) -> Mapping[str, Any]:
        info = dict(super().info())
        info["backlog"] = self._waiting
        return info


if TYPE_CHECKING:
    # mypy proves the class satisfies its slot's Protocol and the capabilities it offers.
    _AUTOSCALER: type[Autoscaler] = BacklogAutoscaler
