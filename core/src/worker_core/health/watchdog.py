"""The stall watchdog (``--stall-timeout``): a consumer that is connected and has room in its
prefetch window, while messages wait on its queues, but took none for that long, has stalled (a
connection a network silently stopped forwarding, a consumer the broker forgot). The worker is
then not ready (``consumer-stalled``) until it takes a message again, and with ``--stall-exit``
it stops, with exit status 1, so its orchestrator replaces it: warm (running tasks finish), but
without waiting for the broker to answer on the silent connection, and once its tasks are done it
exits within :data:`STOP_GRACE` seconds even if closing a connection hangs.

The checks run on the worker's timer, in the loop's thread, and read only what the worker holds;
the broker is asked how many messages wait (one short query, from a thread of the watchdog's
own, on a new connection each time) only once the consumer has been quiet for the whole timeout.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from typing import TYPE_CHECKING, Any

from .state import CONSUMER_STALLED

if TYPE_CHECKING:
    from ..consumer.consumer import Consumer
    from ..worker.worker import Worker

__all__ = ["StallWatchdog"]

logger = logging.getLogger("worker.health")

#: exit status of a worker that stopped itself because its consumer stalled
STALL_EXIT_STATUS = 1
#: seconds the steps may take to stop after a stall's warm shutdown (the running tasks done)
#: before the process exits without them: closing a silent connection can wait on it for long
STOP_GRACE = 10.0


class StallWatchdog:
    """Watches one worker's consumer; :meth:`check` runs every :attr:`every` seconds."""

    def __init__(self, worker: Worker, timeout: float, exit_on_stall: bool = False) -> None:
        self.worker = worker
        self.timeout = timeout
        self.exit_on_stall = exit_on_stall
        self.every = max(0.5, min(5.0, timeout / 4))
        now = time.monotonic()
        self._quiet_since = now
        self._last_check = now
        self._last_count = -1
        self._asking = False
        self._questions: queue.SimpleQueue[tuple[Consumer, int] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._backlog: Any = None
        #: the watchdog stopped the worker (``--stall-exit``)
        self.exiting = False

    # -- in the loop's thread ----------------------------------------------------------------------

    def check(self) -> None:
        worker = self.worker
        consumer = worker.consumer
        now = time.monotonic()
        gap, self._last_check = now - self._last_check, now
        if consumer is None or consumer.broker.connection is None or worker.stopping:
            self._reset(now, -1)
            return
        count = consumer.tasks.delivered
        # A gap between checks: the loop was busy (a task running inline with the solo pool), so
        # it could not take messages; the quiet time starts again.
        if count != self._last_count or gap > 3 * self.every or not self._has_room(consumer):
            self._reset(now, count)
            return
        if now - self._quiet_since >= self.timeout and not self._asking and not self._stalled:
            self._asking = True
            self._ask(consumer, count)

    @property
    def _stalled(self) -> bool:
        return self.worker.health.holds(CONSUMER_STALLED)

    def _reset(self, now: float, count: int) -> None:
        self._quiet_since = now
        self._last_count = count
        if self._stalled and count != -1:
            logger.warning("consumer: takes messages again after its stall")
        self.worker.health.release(CONSUMER_STALLED)

    @staticmethod
    def _has_room(consumer: Consumer) -> bool:
        window: int | None = consumer.tasks.info()["prefetch_count"]
        if window is None:
            return False
        if window == 0:  # no window at all
            return True
        reservations = consumer.reservations
        return len(reservations.reserved) + len(reservations.eta_held) < window

    def _answered(self, consumer: Consumer, count: int, waiting: int) -> None:
        self._asking = False
        if consumer is not self.worker.consumer or consumer.tasks.delivered != count or self.worker.stopping:
            return  # it took a message meanwhile, or is gone
        if waiting <= 0:
            self._quiet_since = time.monotonic()  # idle, nothing waits: ask again a timeout later
            return
        quiet = time.monotonic() - self._quiet_since
        queues = ", ".join(self.worker.queues)
        self.worker.health.hold(CONSUMER_STALLED)
        logger.error("consumer: stalled: %d message(s) wait on %s and the worker has room for more, but "
                     "it took none for %.0fs; not ready until it takes one%s", waiting, queues, quiet,
                     " (--stall-exit: stopping, so that it is replaced)" if self.exit_on_stall else "")
        if self.exit_on_stall:
            # its connection is suspect: stopping must not wait for the broker to answer on it
            consumer.broker.lost = True
            self.exiting = True
            self.worker.exit_status = STALL_EXIT_STATUS
            self.worker.request_stop()

    def exit_unless_stopped(self) -> None:
        """The stall's warm shutdown has drained (no task runs): exit within :data:`STOP_GRACE`
        seconds, whatever the steps still wait for."""

        def backstop() -> None:
            time.sleep(STOP_GRACE)  # the grace itself
            logger.error("Not stopped %.0fs after the stall's shutdown began closing (a silent broker "
                         "connection holds it up): exiting now", STOP_GRACE)
            logging.shutdown()
            os._exit(STALL_EXIT_STATUS)

        threading.Thread(target=backstop, name="worker-stall-exit", daemon=True).start()

    # -- the question to the broker, in a thread of its own ------------------------------------------

    def _ask(self, consumer: Consumer, count: int) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._answering, name="worker-stall-watchdog", daemon=True)
            self._thread.start()
        self._questions.put((consumer, count))

    def _answering(self) -> None:
        from ..consumer.backlog import Backlog

        worker = self.worker
        while True:
            question = self._questions.get()
            if question is None:
                break
            consumer, count = question
            if self._backlog is None:
                self._backlog = Backlog(worker.plugins, worker.app.settings, worker.options, worker.queues)
            try:
                waiting = self._backlog.depth()
            finally:
                # a new connection each time (once a timeout at most): a connection kept open
                # could be silenced as the consumer's was
                self._backlog.close()
            consumer.inbox.call(self._answered, consumer, count, waiting)

    def stop(self) -> None:
        if self._thread is not None:
            self._questions.put(None)
            self._thread = None
