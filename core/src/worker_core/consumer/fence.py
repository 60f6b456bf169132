"""Leases fenced against pauses: before a held message starts, and before one is acknowledged or
rejected, the worker asks its channel (:class:`~worker_core.slots.FencesLeases`) whether the lease
on it was lost while the worker stood still or could not renew it.

- A lost message not started yet (waiting for room, its ETA or its rate limit, or queued in a pool
  that can give it back) is dropped here: not run, nothing written to the broker (which has given
  it to a consumer again: it runs there, or here once more if it comes back here).
  One an executor was about to start is stopped there and given back (rejected with requeue), which
  writes nothing either, unless its copy came back here meanwhile (see :meth:`LeaseFence.not_run`).
- A lost message that runs finishes, and is not acknowledged on the broker (the record there is
  the copy's); its task id and delivery tag are remembered, so a copy of it that comes back here
  is dropped with one log line, however it came back.

The limit: a copy another worker took meanwhile runs there as well. One line says what each loss
did; :meth:`LeaseFence.check` runs every second too, so what is lost leaves the worker at once.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import execution
from ..redaction import redact_url
from ..slots import FencesLeases, WithdrawsOneJob

if TYPE_CHECKING:
    from kombu.message import Message

    from ..request import Request
    from .connection import BrokerConnection
    from .reservations import Reservations
    from .tasks import TaskConsumer

__all__ = ["RAN_REMEMBERED", "LeaseFence"]

logger = logging.getLogger("worker.consumer")

#: how many (task id, delivery tag) of tasks run with a lost lease are remembered
RAN_REMEMBERED = 10_000
#: how long (seconds) an executor waits to learn whether a task's lease was lost, before it runs
ADMIT_WAIT = 5.0


class LeaseFence:
    """The consumer's questions to channels that fence their leases."""

    def __init__(self, reservations: Reservations, tasks: TaskConsumer, broker: BrokerConnection,
                 pool: Callable[[], Any]) -> None:
        self.reservations = reservations
        self.tasks = tasks
        self.broker = broker
        self.pool = pool
        #: channel class -> whether it fences its leases (asked once per class)
        self._fences: dict[type, bool] = {}
        #: the last set of lost tags a channel handed back (the same object while nothing changed)
        self._last: frozenset[Any] = frozenset()
        #: lost tags already acted upon
        self._acted: set[Any] = set()
        #: (task id, delivery tag) of tasks that ran here with a lost lease, oldest first
        self.ran: collections.OrderedDict[tuple[str, Any], None] = collections.OrderedDict()
        self.dropped = 0
        self.copies_dropped = 0
        #: the last channel that fences its leases a message came on (asked by :meth:`admits`)
        self._channel: Any = None
        #: whether executors ask :meth:`admits` before each task (a pool running tasks in this process)
        self.gated = False

    def gate(self, pool: Any) -> None:
        """Have the executors of ``pool`` ask before each task starts, when they run in this
        process (a process pool's children cannot: the jobs already written to a child start
        there, the documented limit)."""
        self.gated = pool is not None and not pool.is_process_pool
        execution.admit_with(self.admits if self.gated else None)

    def _fenced(self, channel: Any) -> bool:
        kind = type(channel)
        fenced = self._fences.get(kind)
        if fenced is None:
            fenced = self._fences[kind] = isinstance(channel, FencesLeases)
        return fenced

    def lost(self, message: Message) -> bool | None:
        """Whether the lease on ``message`` was lost (None: cannot be told now, and may have been)."""
        channel = message.channel
        if channel is None or not self._fenced(channel):
            return False
        self._channel = channel
        lost = channel.lost_leases()
        if lost is None:
            return None
        if lost and lost is not self._last:
            self._notice(lost)
        return message.delivery_tag in lost

    def _notice(self, lost: frozenset[Any]) -> None:
        self._last = lost
        new = lost - self._acted
        self._acted &= lost
        if new:
            self._acted |= new
            self._sweep(new)

    def check(self) -> None:
        """Ask the channel consuming now (every second, from the consumer's timer)."""
        kombu = self.tasks.kombu
        channel = getattr(kombu, "channel", None) if kombu is not None else None
        if channel is None or not self._fenced(channel) or self.broker.lost:
            return
        try:
            lost = channel.lost_leases()
        except Exception as exc:
            logger.debug("could not ask for lost leases: %r", exc)
            return
        if lost and lost is not self._last:
            self._notice(lost)
        if lost is not None and self.reservations.ready:
            self.reservations.dispatch()  # (held back while the leases were in doubt)

    # -- what the request asks as it settles -------------------------------------------------------

    def settle(self, request: Request) -> bool:
        """Called as ``request`` is acknowledged or rejected: True when its lease was lost (the
        channel writes nothing for it), remembering it when it ran, so that a copy is dropped."""
        if self.lost(request.message) is not True:
            return False
        if request.worker_pid is not None or request.time_start is not None:
            self.ran[(request.id, request.message.delivery_tag)] = None
            while len(self.ran) > RAN_REMEMBERED:
                self.ran.popitem(last=False)
        return True

    def is_copy(self, request: Request) -> bool:
        """Whether ``request`` (just received) is a copy of a task that ran here with a lost lease:
        then it was dropped (acknowledged, not run), with one log line."""
        key = (request.id, request.message.delivery_tag)
        if key not in self.ran:
            return False
        del self.ran[key]
        self.copies_dropped += 1
        logger.warning("Task %s came back from the broker (delivery %s) after it ran here with a lost "
                       "lease: the copy is dropped, not run again", request.label,
                       request.message.delivery_tag)
        request.acknowledged = True
        self.tasks.ack(request.message)
        return True

    # -- what a loss does --------------------------------------------------------------------------

    def _sweep(self, lost: frozenset[Any]) -> None:
        """Drop every held message in ``lost`` not started yet; say what the loss did."""
        reservations = self.reservations
        dropped = 0
        waiting = [request for request in reservations.ready if request.message.delivery_tag in lost]
        if waiting:
            kept = [request for request in reservations.ready if request.message.delivery_tag not in lost]
            reservations.ready.clear()
            reservations.ready.extend(kept)
        for request in waiting:
            self.drop(request)
            dropped += 1
        for held in reservations.eta_held.take_tags(lost):
            self.tasks.prefetch_eventually(-1)
            self.tasks.ack(held.message())
            dropped += 1
        limited = [request for request in reservations.rate_limits.waiting()
                   if request.message.delivery_tag in lost]
        for request in reservations.rate_limits.discard({request.id for request in limited}):
            self.drop(request)
            dropped += 1
        pool = self.pool()
        running = 0
        for request in list(reservations.reserved):
            if request.message.delivery_tag not in lost or request.finished:
                continue
            queued = request.worker_pid is None and request.pool_job is not None
            if queued and isinstance(pool, WithdrawsOneJob) and pool.withdraw_job(request.pool_job):
                self.drop(request)
                reservations.task_done(request)  # it left the pool
                dropped += 1
            elif queued and self.gated:
                dropped += 1  # an executor took it meanwhile: stopped as it starts (:meth:`admits`)
            else:
                running += 1
        self.dropped += dropped
        url = self.broker.current
        logger.warning(
            "Lost the leases of %d message(s) held from %s: %d not started are dropped here (the broker "
            "gives them to a consumer again), %d started finish here and are not acknowledged on the "
            "broker (a copy another worker took runs there too)", len(lost), redact_url(url or "the broker"),
            dropped, running)

    def admits(self, task_id: str) -> bool:
        """Whether the task ``task_id`` may start now (asked in the executor's thread, for a pool
        that runs tasks in this process: its executors take queued jobs without the loop). False
        when its message's lease was lost."""
        channel = self._channel
        if channel is None:
            return True
        lost = channel.lost_leases()
        deadline = time.monotonic() + ADMIT_WAIT
        while lost is None and time.monotonic() < deadline:  # (the broker cannot tell yet: wait a little)
            time.sleep(0.05)
            lost = channel.lost_leases()
        if not lost:
            return True
        for request in list(self.reservations.reserved):  # (copied: the loop's thread changes it)
            if request.id == task_id:
                return request.message.delivery_tag not in lost
        return True

    def not_run(self, request: Request) -> None:
        """``request`` was stopped as it started: its lease was lost (see :meth:`admits`). It is
        rejected with requeue: for a lease still lost the channel writes nothing (its copy runs
        where it went, here too). A copy that came back here between the stop and now was taken
        by the channel for this message, which it still held (the record in the broker is this
        worker's again): the requeue puts that record back on its queue, and the task runs once,
        where an acknowledgement would have removed the only record left of it."""
        key = (request.id, request.message.delivery_tag)
        self.ran.pop(key, None)  # (its copy runs, here too)
        if self.lost(request.message) is False:
            logger.warning("Task %s was stopped as it started (its lease was lost), and its copy came back "
                           "here meanwhile: the message goes back to its queue, to run once", request.label)
        request.reject(requeue=True, reason=f"task {request.label} lost its lease before it started")
        self.ran.pop(key, None)
        self.dropped += 1

    def drop(self, request: Request) -> None:
        """Forget ``request`` (its lease was lost, it did not start): acknowledged here only."""
        request.finished = True
        request.acknowledged = True
        self.reservations.reserved.discard(request)
        self.tasks.ack(request.message)

    def info(self) -> dict[str, Any]:
        return {"dropped": self.dropped, "copies_dropped": self.copies_dropped, "remembered": len(self.ran)}
