"""The requests a worker holds between their message's arrival and their end: waiting for their
ETA, their rate limit or room in the pool, queued in the pool, running; and the rules that move
them (dispatch under fair or fcfs scheduling, revokes, giving back the unstarted)."""

from __future__ import annotations

import collections
import itertools
import logging
import math
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

from ..slots import SharesOneQueue, WithdrawsOneJob, WithdrawsQueuedJobs
from .eta import EtaHold, HeldTask, MakeRequest
from .fence import LeaseFence
from .ratelimit import RateLimits

if TYPE_CHECKING:
    from ..app.base import App
    from ..control.stamps import RevokedStamps
    from ..options import WorkerOptions
    from ..request import Request
    from ..revoked import RevokedIds
    from .clock import Clock
    from .connection import BrokerConnection
    from .leases import LeaseCheck
    from .poison import PoisonCap
    from .tasks import TaskConsumer

__all__ = ["Reservations"]

logger = logging.getLogger("worker.consumer")


class Reservations:
    """What the consumer holds, and how it goes to the pool.

    ``reserved`` holds every request from its arrival (or the end of its ETA wait) to its end;
    ``ready`` those waiting for room in the pool, ``active`` those running; ``eta_held`` the
    tasks waiting for their ETA, in their compact form (:mod:`.eta`). ``inflight`` counts the
    requests handed to the pool and not done.
    """

    def __init__(self, app: App, options: WorkerOptions, *, pool: Callable[[], Any], timer: Any,
                 clock: Clock, broker: BrokerConnection, tasks: TaskConsumer, leases: LeaseCheck,
                 poison: PoisonCap, revoked: RevokedIds, revoked_stamps: RevokedStamps,
                 on_task_message: list[Callable[[], None]], notify: Callable[..., None], log_info: bool,
                 make_request: MakeRequest, accept: frozenset[str]) -> None:
        """``pool()`` is the worker's pool (None before it starts), ``on_task_message`` what
        runs as each request becomes ready, ``make_request(message, envelope, task)`` builds a
        request again (a task held for its ETA), of messages of the content types ``accept``."""
        self.pool = pool
        self.clock = clock
        self.tasks = tasks
        self.leases = leases
        self.poison = poison
        self.notify = notify
        self.log_info = log_info
        self.on_task_message = on_task_message
        self.revoked = revoked
        self.revoked_stamps = revoked_stamps
        self.fcfs = options.scheduling == "fcfs"
        self.ready: collections.deque[Request] = collections.deque()
        self.eta_held = EtaHold(timer, self._eta_due, clock.deadline)
        self._make_request = make_request
        self._accept = accept
        self._max_size = app.settings.worker_max_message_size
        #: the leases of what the worker holds, on a channel that fences them
        self.fence = LeaseFence(self, tasks, broker, pool)
        self.reserved: set[Request] = set()
        self.active: set[Request] = set()
        self.inflight = 0
        #: tasks done, by name (``inspect stats``' ``total``)
        self.totals: collections.Counter[str] = collections.Counter()
        self.rate_limits = RateLimits(timer, self._reserve_now)
        self.rate_limits_enabled = not app.settings.worker_disable_rate_limits
        pool = pool()
        # Under fcfs, or when the executors take jobs from one queue, the pool gets every request
        # at once; under fair scheduling otherwise, one per idle executor.
        self._ungated = self.fcfs or (isinstance(pool, SharesOneQueue) and pool.shared_queue)
        self._dispatching = False
        #: no more dispatching: the worker stops, or leaves its broker, once the running end
        self.draining = False
        #: the requests the pool gives back unstarted are requeued (see :meth:`forget_unstarted`)
        self._give_back = False

    # -- arrival -----------------------------------------------------------------------------

    def receive(self, request: Request) -> None:
        if self.log_info:
            logger.info("Task %s received", request.label)
        if request.id in self.revoked:
            request.revoke("revoked")
            return
        if self.revoked_stamps:
            hit = self.revoked_stamps.match(request.stamps)
            if hit is not None:
                request.revoke("revoked", why=f"revoked by header: {hit}")
                return
        self.notify("task_received", request=request)
        envelope = request.envelope
        if envelope.expires is not None or envelope.eta is not None:
            now = self.clock.utcnow()  # (the broker's clock, when the transport tells it)
            if envelope.expires is not None and envelope.expires <= now:
                request.revoke("expired")
                return
            if envelope.eta is not None and envelope.eta > now:
                self._hold_until_eta(request, (envelope.eta - now).total_seconds())
                return
        self._reserve(request)

    def _hold_until_eta(self, request: Request, delay: float) -> None:
        # The message stays unacknowledged until it runs; widen the window so it does not
        # block other messages meanwhile.
        assert request.envelope.eta is not None
        self.tasks.prefetch_eventually(1)
        self.leases.check(request, delay)
        self.eta_held.hold(request.envelope.eta.timestamp(), request)

    def held_request(self, held: HeldTask) -> Request:
        """The request of a task held for its ETA, built again from its message."""
        return held.request(self._make_request, self._accept, self._max_size)

    def _eta_due(self, held: HeldTask) -> None:
        self.tasks.prefetch_eventually(-1)
        try:
            request = self.held_request(held)
        except Exception as exc:
            # it was read once as it arrived: only a fault here can make it unreadable now
            logger.critical("Internal error while building task %s again at its ETA: %r; it goes back "
                            "to the broker", held.id, exc, exc_info=True)
            self.tasks.reject(held.message(), requeue=True)
            return
        expires = request.envelope.expires
        if expires is not None and expires <= self.clock.utcnow():
            request.revoke("expired")
            return
        self._reserve(request)

    def _reserve(self, request: Request) -> None:
        rate = request.task.rate_per_second
        if rate and self.rate_limits_enabled:
            self.rate_limits.hold(request, rate)
            return
        self._reserve_now(request)

    def _reserve_now(self, request: Request) -> None:
        self.reserved.add(request)
        self.ready.append(request)
        for callback in self.on_task_message:
            callback()
        self.dispatch()

    # -- to the pool ---------------------------------------------------------------------------

    def capacity(self) -> float:
        """How many requests the pool may hold: every one under fcfs or with a shared queue, else
        one per executor (fair scheduling hands a job only to an idle one)."""
        pool = self.pool()
        if self._ungated or pool is None:
            return math.inf
        return float(pool.num_processes)

    def dispatch(self) -> None:
        """Hand ready requests to the pool while it has room."""
        if self._dispatching or self.draining:
            return
        self._dispatching = True
        try:
            pool = self.pool()
            ready = self.ready
            fence = self.fence
            while ready and self.inflight < self.capacity():
                request = ready.popleft()
                lost = fence.lost(request.message)
                if lost:  # the broker took it back while the worker stood still: it runs elsewhere
                    fence.drop(request)
                    continue
                if lost is None:  # it may have been: held back until the broker can say
                    ready.appendleft(request)
                    break
                expires = request.envelope.expires
                if expires is not None and expires <= self.clock.utcnow():
                    request.revoke("expired")
                    continue
                if request.count_at_start:  # delivered again: counted as it starts (the poison cap)
                    if self._ungated and pool is not None and self.inflight >= pool.num_processes:
                        # it waits for an idle executor instead of in the pool: a task that takes
                        # the worker down meanwhile cannot take a start of this one along
                        ready.appendleft(request)
                        break
                    if not self.poison.may_start(request):
                        continue
                self.inflight += 1
                try:
                    request.execute_using_pool(pool)
                except Exception as exc:
                    self.inflight -= 1
                    logger.error("Could not hand %s to the pool: %r; it goes back to the broker",
                                 request.label, exc)
                    self.reserved.discard(request)
                    request.reject(requeue=True)
        finally:
            self._dispatching = False

    def task_started(self, request: Request) -> None:
        self.active.add(request)
        self.notify("task_started", request=request, pid=request.worker_pid)

    def task_done(self, request: Request, *, started: bool = True) -> None:
        request.finished = True
        request.pool_job = None  # the pool's job holds the request's callbacks: no cycle is left
        self.reserved.discard(request)
        self.active.discard(request)
        if started:
            self.inflight -= 1
            self.tasks.restore_prefetch_step()
        self.totals[request.name] += 1
        if not self._dispatching:
            self.dispatch()

    # -- revokes -------------------------------------------------------------------------------

    def requests_by_id(self, task_ids: Collection[str]) -> dict[str, Request]:
        """The requests with these ids this worker holds: waiting (for room, their ETA or their
        rate limit), queued in the pool or running."""
        found = {request.id: request for request in itertools.chain(self.reserved, self.rate_limits.waiting())
                 if request.id in task_ids}
        found.update((held.id, self.held_request(held)) for held in self.eta_held if held.id in task_ids)
        return found

    def revoke_waiting(self, task_ids: Collection[str]) -> list[Request]:
        """Discard the requests with these ids that have not started (waiting for room, their ETA
        or their rate limit, or queued in a pool that can give them back): stored REVOKED and
        acknowledged at once. Returns them."""
        waiting = [request for request in self.ready if request.id in task_ids]
        if waiting:
            kept = [request for request in self.ready if request.id not in task_ids]
            self.ready.clear()
            self.ready.extend(kept)
        held = []
        for task in self.eta_held.take(task_ids):
            self.tasks.prefetch_eventually(-1)
            held.append(self.held_request(task))
        held += self.rate_limits.discard(task_ids)
        for request in waiting + held:
            request.revoke("revoked")
        return waiting + held + self._withdraw_from_pool(task_ids)

    def _withdraw_from_pool(self, task_ids: Collection[str]) -> list[Request]:
        pool = self.pool()
        if not isinstance(pool, WithdrawsOneJob):
            return []
        taken = [request for request in self.reserved
                 if request.id in task_ids and request.pool_job is not None and request.worker_pid is None
                 and not request.finished and pool.withdraw_job(request.pool_job)]
        for request in taken:
            request.discard("revoked")
            self.task_done(request)  # it left the pool
        return taken

    # -- giving back ---------------------------------------------------------------------------

    def forget_unstarted(self, *, give_back: bool = False) -> int:
        """Drop the requests not started yet (ready, waiting for their ETA or rate limit, or
        queued in a pool that can give them back). With ``give_back`` (a warm shutdown, or
        leaving a broker that still answers) their messages are requeued now, so that another
        worker runs them while the running tasks finish; without it (the connection is gone)
        they stay unacknowledged and the broker delivers them again. Returns how many."""
        held = self.eta_held.clear()
        dropped = list(self.ready)
        for request in dropped:
            self.reserved.discard(request)
        self.ready.clear()
        dropped += self.rate_limits.forget()
        self._give_back = give_back
        pool = self.pool()
        # first those queued in the pool (they came first), each through :meth:`withdrawn`
        withdrawn = pool.withdraw_queued() if isinstance(pool, WithdrawsQueuedJobs) else 0
        if give_back:
            for request in dropped:
                request.reject(requeue=True)
            for task in held:
                self.tasks.reject(task.message(), requeue=True)
        return len(dropped) + len(held) + withdrawn

    def withdrawn(self, request: Request) -> None:
        """The pool gave ``request`` back unstarted (``JobWithdrawn``): requeued now if the last
        :meth:`forget_unstarted` gave back, else left unacknowledged for the broker."""
        if self._give_back:
            request.reject(requeue=True)
        self.task_done(request)

    def info(self) -> dict[str, Any]:
        return {
            "total": dict(self.totals),
            "reserved": len(self.reserved),
            "active": len(self.active),
            "waiting": len(self.ready),
            "in_pool": self.inflight,
            "eta_held": len(self.eta_held),
        }
