"""The default autoscaler: the pool follows demand (reserved requests) between MIN and MAX.

Grow to ``min(demand, max)`` at once; shrink to ``max(demand, min)`` only once ``keepalive``
seconds (``AUTOSCALE_KEEPALIVE``, 30 by default) have passed since the last growth. Under the
async loop it checks on every task message and every ``keepalive`` on the hub; under the sync
loop a background thread checks every second.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from time import monotonic
from typing import TYPE_CHECKING, Any

from ..exceptions import ConfigurationError, PoolError

if TYPE_CHECKING:
    from ..slots import Autoscaler

__all__ = ["DemandAutoscaler", "keepalive_from_environment"]

logger = logging.getLogger("worker.autoscale")


def keepalive_from_environment() -> float:
    text = os.environ.get("AUTOSCALE_KEEPALIVE", "30")
    try:
        value = float(text)
    except ValueError:
        raise ConfigurationError(f"AUTOSCALE_KEEPALIVE must be a number of seconds (got {text!r})") from None
    return value


class DemandAutoscaler:
    """Scales ``pool`` between ``min_concurrency`` and ``max_concurrency``.

    :param demand: how many requests are reserved (waiting or running) right now.
    :param on_max_change: told ``new_max - old_max`` when :meth:`update` changes the maximum, so
        the consumer can move the prefetch count by that many times the multiplier.
    :param hub: kombu's hub under the async loop, or ``None`` (then a thread does the checks).
    :param backlog: messages waiting in the broker (this autoscaler does not use it; others may).
    """

    def __init__(
        self,
        pool: Any,
        max_concurrency: int,
        min_concurrency: int = 0,
        *,
        demand: Callable[[], int],
        on_max_change: Callable[[int], None] | None = None,
        hub: Any = None,
        keepalive: float | None = None,
        backlog: Callable[[], int] | None = None,
    ) -> None:
        self.pool = pool
        self.max_concurrency = max_concurrency
        self.min_concurrency = min_concurrency
        self.demand = demand
        self.on_max_change = on_max_change
        self.hub = hub
        self.backlog = backlog
        self.keepalive = keepalive_from_environment() if keepalive is None else keepalive
        self._last_scale_up: float | None = None
        # Under the hub every call happens on the loop's thread; a thread needs a real lock.
        self.mutex: AbstractContextManager[Any] = nullcontext() if hub is not None else threading.RLock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._timer: Any = None

    # -- running ---------------------------------------------------------------------------------

    def start(self) -> None:
        if self.hub is not None:
            self._timer = self.hub.call_repeatedly(self.keepalive, self.maybe_scale)
            return
        self._thread = threading.Thread(target=self._run, name="Autoscaler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(1.0):
            self.maybe_scale()

    def stop(self) -> None:
        self._stopped.set()
        if self._timer is not None:
            self._timer.cancel()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    # -- the algorithm ---------------------------------------------------------------------------

    @property
    def processes(self) -> int:
        return int(self.pool.num_processes)

    @property
    def qty(self) -> int:
        return int(self.demand())

    def maybe_scale(self) -> None:
        with self.mutex:
            try:
                changed = self._maybe_scale()
            except Exception:
                logger.exception("Autoscaler: error while scaling")
                return
            if changed:
                try:
                    self.pool.maintain_pool()
                except Exception:
                    logger.exception("Autoscaler: error while maintaining the pool")

    def _maybe_scale(self) -> bool:
        procs, qty = self.processes, self.qty
        target = min(qty, self.max_concurrency)
        if target > procs:
            self.scale_up(target - procs)
            return True
        target = max(qty, self.min_concurrency)
        if target < procs:
            return self.scale_down(procs - target)
        return False

    def scale_up(self, n: int) -> None:
        self._last_scale_up = monotonic()
        logger.info("Autoscaler: scaling up by %d (to %d)", n, self.processes + n)
        self._grow(n)

    def scale_down(self, n: int) -> bool:
        if self._last_scale_up is None or monotonic() - self._last_scale_up <= self.keepalive:
            return False
        logger.info("Autoscaler: scaling down by %d (to %d)", n, self.processes - n)
        return self._shrink(n)

    def _grow(self, n: int) -> None:
        try:
            self.pool.grow(n)
        except Exception:
            logger.exception("Autoscaler: scale_up: could not grow the pool by %d", n)

    def _shrink(self, n: int) -> bool:
        try:
            self.pool.shrink(n)
        except PoolError:
            logger.debug("Autoscaler won't scale down: all processes busy.")
            return False
        except Exception:
            logger.exception("Autoscaler: scale_down: could not shrink the pool by %d", n)
            return False
        return True

    def update(self, max: int | None = None, min: int | None = None) -> tuple[int, int]:
        """Change the bounds now (``workerctl control autoscale MAX MIN``)."""
        with self.mutex:
            if max is not None:
                if max < self.processes:
                    self._shrink(self.processes - max)
                if self.on_max_change is not None and max != self.max_concurrency:
                    self.on_max_change(max - self.max_concurrency)
                self.max_concurrency = max
            if min is not None:
                if min > self.processes:
                    self._grow(min - self.processes)
                self.min_concurrency = min
            return self.max_concurrency, self.min_concurrency

    def info(self) -> Mapping[str, Any]:
        return {
            "max": self.max_concurrency,
            "min": self.min_concurrency,
            "current": self.processes,
            "qty": self.qty,
        }


if TYPE_CHECKING:
    # mypy proves the class satisfies its slot's Protocol and the capabilities it offers.
    _AUTOSCALER: type[Autoscaler] = DemandAutoscaler
