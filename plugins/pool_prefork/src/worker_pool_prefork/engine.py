"""The parent's side of the job flow: queueing, fair/fcfs dispatch, non-blocking writes, reading
and parsing results, and reporting outcomes.

Both schedulings write a job to a busy child when no child is idle, so a child finishing one
job finds the next in its pipe, and results come back in runs instead of one loop turn each. A
job waiting in a child's pipe can be taken back until the child claims it (:mod:`.claims`):
under fair scheduling an idle child takes over a job that has waited :data:`QUEUE_GRACE` behind a
running one, so a short task never waits long behind a long one while a child is free; and
:meth:`Engine.withdraw_queued` gives back every job not started (warm shutdown, lost broker
connection). fcfs leaves written jobs where they are and writes to idle and busy children alike.

All state is guarded by one lock (under the hub it is never contended). Handlers collect the
callbacks they owe into an ``events`` list and run them after releasing the lock, so a callback
may call back into the pool (``apply_async`` from a result callback) from any thread.

One module: dispatch, writes and results share one lock and one job table.
"""

from __future__ import annotations

import logging
import os
import pickle
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from time import monotonic
from typing import Any

from worker_core.exceptions import PoolError
from worker_core.slots import PoolOptions

from . import frames
from .children import Child
from .claims import LOCK_WAIT
from .drivers import Driver, TimerHandle
from .jobs import Job, never_started
from .limits import TimeLimits
from .outcomes import Events, deliver_error, deliver_result, fail, run_events
from .supervisor import Supervisor

__all__ = ["QUEUE_GRACE", "SCHEDULING", "Engine"]

logger = logging.getLogger("worker.pool")

_READ_SIZE = 1 << 16
_dumps = pickle.dumps
_PROTOCOL = pickle.HIGHEST_PROTOCOL
_HEADER_PACK = frames.HEADER.pack
_JOB = frames.JOB
_ACK = frames.ACK
_RESULT = frames.RESULT
_ERROR = frames.ERROR
_ACK_UNPACK = frames.ACK_TIME.unpack
_STOP_FRAME = frames.encode(frames.STOP)

SCHEDULING = {"fair": "fair", "default": "fair", "fcfs": "fcfs", "fast": "fcfs"}

#: Fair scheduling: how long (seconds) a job may wait in a child's pipe behind a running job while
#: another child is idle, before the idle child takes it over. Shorter waits are left alone: the
#: running job is about to end, and moving the job would cost more than waiting.
QUEUE_GRACE = 0.005


class Engine:
    """Jobs and children of one prefork pool; driven by whichever :class:`Driver` is attached."""

    def __init__(self, options: PoolOptions, *, start_timeout: float, kill_grace: float) -> None:
        self.options = options
        self.scheduling = SCHEDULING[options.scheduling]
        self.fair = self.scheduling == "fair"
        self.soft_default = options.soft_time_limit or None
        self.hard_default = options.time_limit or None
        self.max_tasks = options.max_tasks_per_child
        self.lock = threading.Lock()
        self.children: list[Child] = []
        #: Ready children with nothing to do (fair scheduling). The one idle since last goes
        #: first: its memory and caches are warm and it has just been running, which shortens
        #: the start of a task on a worker that is not busy.
        self.idle: deque[Child] = deque()
        #: Jobs waiting for a child, in submission order.
        self.outbound: deque[Job] = deque()
        self.target = options.concurrency
        self.driver: Driver | None = None
        self.closed = False  # takes no new jobs
        self.stopping = False
        self.terminating = False
        self.finished = threading.Event()
        self.next_id = 0
        #: fair: runs the take-over check when the oldest waiting job reaches QUEUE_GRACE
        self.takeover_timer: TimerHandle | None = None
        #: jobs an idle child took over from one whose running job held them up
        self.taken_over = 0
        self.total_writes = 0
        self._rr = 0
        self.limits = TimeLimits(self)
        self.supervisor = Supervisor(self, start_timeout=start_timeout, kill_grace=kill_grace)

    # -- submitting ---------------------------------------------------------------------------

    def submit(self, target: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any] | None,
               callback: Callable[[Any], None] | None, error_callback: Callable[[BaseException], None] | None,
               accept_callback: Callable[[int, float], None] | None,
               timeout_callback: Callable[[bool, float], None] | None,
               soft: float | None, hard: float | None) -> Job | None:
        """Queue or write a job; the job (a handle for :meth:`withdraw_job`), or None if it could
        not even be pickled (its error callback has been called)."""
        try:
            payload = _dumps((target, args, kwargs or None), _PROTOCOL)
        except Exception as exc:
            if self.closed:
                raise PoolError("the prefork pool is stopped and takes no more jobs") from None
            error = PoolError(
                f"prefork pool: cannot send a job for {getattr(target, '__module__', '?')}."
                f"{getattr(target, '__qualname__', target)!s} to a child process: {exc!r}; the target "
                "must be a module-level function and its arguments plain picklable data"
            )
            error.__cause__ = exc
            if error_callback is not None:
                error_callback(error)
            return None
        with self.lock:
            if self.closed:
                raise PoolError("the prefork pool is stopped and takes no more jobs")
            job = Job(payload, callback, error_callback, accept_callback, timeout_callback, soft, hard)
            child = None if self.outbound else self.pick()
            if child is None:
                self.outbound.append(job)
            else:
                self.write_job(child, job)
        return job

    def pick(self) -> Child | None:
        """The child the next job goes to, or None if it must wait (lock held)."""
        max_tasks = self.max_tasks
        fair = self.fair
        if fair:
            child = self._idle_child()
            if child is not None:
                return child
        # Round-robin over every child that accepts work (under fair scheduling all are busy by
        # now, and one whose job has run for QUEUE_GRACE is passed over); a child whose pipe is
        # full (a partial write pending) is skipped until it drains.
        children = self.children
        count = len(children)
        now = monotonic() if fair else 0.0
        for step in range(count):
            index = (self._rr + step) % count
            child = children[index]
            if not child.outbuf and child.takes_jobs(max_tasks) and not (fair and self._stuck(child, now)):
                self._rr = index + 1
                return child
        return None

    def _idle_child(self) -> Child | None:
        idle = self.idle
        while idle:
            child = idle.pop()
            child.idle_listed = False
            if not child.jobs and child.takes_jobs(self.max_tasks):
                return child
        return None

    @staticmethod
    def _stuck(child: Child, now: float) -> bool:
        """Whether the child's running job has run for QUEUE_GRACE (from the child's own clock)."""
        started = child.claims.running_since()
        return started > 0.0 and now - started >= QUEUE_GRACE

    def mark_idle(self, child: Child) -> None:
        if self.fair and not child.idle_listed and not child.jobs and child.takes_jobs(self.max_tasks):
            child.idle_listed = True
            self.idle.append(child)

    def dispatch(self, events: Events) -> None:
        """Hand queued jobs to children that can take them; on warm stop, send STOP once idle."""
        if self.idle and self.fair and self.takeover_timer is None:
            self.take_over()  # jobs waiting in pipes are older than those waiting here
        outbound = self.outbound
        while outbound:
            child = self.pick()
            if child is None:
                break
            self.write_job(child, outbound.popleft())
        if self.stopping and not outbound:
            for child in self.children:
                if child.live:
                    child.stop_sent = True
                    self.write(child, _STOP_FRAME)

    # -- taking jobs back ---------------------------------------------------------------------------

    def take_back(self, child: Child, newest: int, wait: float) -> list[Job] | None:
        """Take back the jobs written to ``child`` up to job ``newest`` that it has not claimed,
        oldest first; None if its claims lock stayed taken (lock held)."""
        claimed = child.claims.withdraw(newest, wait)
        if claimed is None:
            return None
        taken = [job for job in child.jobs if claimed < job.id <= newest]
        for job in taken:
            child.jobs.remove(job)
            job.child = None
        child.sent -= len(taken)
        if not child.jobs:
            self.mark_idle(child)
        return taken

    def take_over(self) -> None:
        """Fair: idle children take over the oldest jobs waiting behind a job that has run for
        QUEUE_GRACE; if some wait for less, check again when the first of them reaches it
        (lock held)."""
        now = monotonic()
        soonest: float | None = None
        for busy in self.children:
            jobs = busy.jobs
            if len(jobs) < 2 or busy.eof or busy.doomed:
                continue
            started = busy.claims.running_since()
            if started <= 0.0:
                continue  # between jobs: it claims the next one now
            due = started + QUEUE_GRACE
            if due > now:
                soonest = due if soonest is None else min(soonest, due)
                continue
            index = 1  # the jobs after the first were written behind it; ids grow in the deque
            while index < len(jobs) and self.idle:
                taken = self.take_back(busy, jobs[index].id, 0.0)
                if taken is None:  # it is claiming a job right now: look again soon
                    soonest = now
                    break
                if not taken:  # claimed: it runs there, or already ran
                    index += 1
                    continue
                idle = self._idle_child()
                if idle is None:
                    self.outbound.extendleft(reversed(taken))
                    break
                self.write_job(idle, taken.pop(0))
                self.taken_over += 1
                self.outbound.extendleft(reversed(taken))
        if soonest is not None and self.idle and self.driver is not None:
            self.takeover_timer = self.driver.call_later(max(soonest - now, 0.0005), self._takeover_due)

    def _takeover_due(self) -> None:
        events: Events = []
        with self.lock:
            self.takeover_timer = None
            self.dispatch(events)
        run_events(events)

    def withdraw_queued(self) -> list[Job]:
        """Take back every job no child has started, and those waiting for one (lock held)."""
        jobs = list(self.outbound)
        self.outbound.clear()
        for child in self.children:
            if child.jobs and not child.eof:
                taken = self.take_back(child, child.jobs[-1].id, LOCK_WAIT)
                if taken is None:
                    logger.warning("prefork pool: could not take back the jobs queued in %s pid:%s (it "
                                   "holds its claims lock); they run there", child.name, child.pid)
                else:
                    jobs.extend(taken)
        for job in jobs:
            job.done = True
        return jobs

    def withdraw_job(self, job: Job, events: Events) -> bool:
        """Take back ``job`` if no child has started it; its callbacks are then never called
        (lock held). Jobs written to the same child before it and not started go back to the
        queue, in order."""
        if job.done or job.accepted is not None:
            return False
        child = job.child
        if child is None:
            try:
                self.outbound.remove(job)
            except ValueError:
                return False
        else:
            taken = self.take_back(child, job.id, LOCK_WAIT)
            if not taken:  # the child claimed it (or holds its lock): it runs there
                return False
            taken.pop()  # the job itself, the newest taken
            if taken:
                self.requeue(taken, events)
                self.dispatch(events)
        job.done = True
        return True

    def requeue(self, jobs: list[Job], events: Events) -> None:
        """Put back jobs a child never started (it exited or was killed first), at the front."""
        for job in jobs:
            job.child = None
            job.accepted = None
        if self.terminating:
            for job in jobs:
                job.done = True
                events.append((fail, (job, never_started(job, "the pool was terminated first"))))
        elif jobs:
            logger.debug("prefork pool: %d job(s) never started by their child; queued again", len(jobs))
            self.outbound.extendleft(reversed(jobs))

    # -- writing ------------------------------------------------------------------------------

    def write_job(self, child: Child, job: Job) -> None:
        # a new id at every write: ids written to one child only grow (see claims)
        self.next_id = job.id = self.next_id + 1
        job.child = child
        child.jobs.append(job)
        child.sent += 1
        child.writes += 1
        self.total_writes += 1
        payload = job.payload
        self.write(child, _HEADER_PACK(len(payload), _JOB, job.id) + payload)

    def write(self, child: Child, data: bytes) -> None:
        if child.outbuf:
            child.outbuf += data
            return
        try:
            written = os.write(child.job_fd, data)
        except BlockingIOError:
            written = 0
        except OSError:
            return  # the child is gone: EOF on its result pipe settles its jobs
        if written < len(data):
            child.outbuf += memoryview(data)[written:]
            driver = self.driver
            if driver is not None:
                if driver.in_driver_thread():
                    driver.add_writer(child.job_fd, self.on_writable, child)
                else:
                    driver.call_soon(self._watch_writable, child)

    def _watch_writable(self, child: Child) -> None:
        with self.lock:
            if child.outbuf and not child.eof and self.driver is not None:
                self.driver.add_writer(child.job_fd, self.on_writable, child)

    def on_writable(self, child: Child) -> None:
        events: Events = []
        with self.lock:
            if child.eof:
                return
            if not child.outbuf:
                # Nothing left to write: a registration that outlived its data would spin.
                if self.driver is not None:
                    self.driver.remove_writer(child.job_fd)
                return
            try:
                written = os.write(child.job_fd, child.outbuf)
            except BlockingIOError:
                return
            except OSError:
                written = len(child.outbuf)  # gone; EOF on its result pipe follows
            del child.outbuf[:written]
            if not child.outbuf:
                if self.driver is not None:
                    self.driver.remove_writer(child.job_fd)
                self.dispatch(events)
        run_events(events)

    # -- reading ------------------------------------------------------------------------------

    def on_readable(self, child: Child) -> None:
        events: Events = []
        with self.lock:
            self.read(child, events)
            if self.outbound or self.stopping or (self.idle and self.fair and self.takeover_timer is None):
                self.dispatch(events)
        if events:
            run_events(events)

    def read(self, child: Child, events: Events) -> None:
        """Read what the child wrote so far and act on every complete frame (lock held)."""
        if child.eof:
            return
        fd = child.result_fd
        while True:
            try:
                data = os.read(fd, _READ_SIZE)
            except BlockingIOError:
                return
            except OSError as exc:
                logger.error("prefork pool: reading from %s pid:%s failed: %s", child.name, child.pid, exc)
                data = b""
            if not data:
                self.supervisor.on_eof(child, events)
                return
            for kind, job_id, payload in child.reader.feed(data):
                self.handle(child, kind, job_id, payload, events)
            if len(data) < _READ_SIZE:
                return

    def handle(self, child: Child, kind: int, job_id: int, payload: bytes, events: Events) -> None:
        if kind == _ACK:
            job = self._head(child, job_id, kind, events)
            if job is not None:
                job.accepted = started = _ACK_UNPACK(payload)[0]
                if job.soft or job.hard:
                    self.limits.arm(job)
                if job.accept_callback is not None:
                    events.append((job.accept_callback, (child.pid, started)))
        elif kind in (_RESULT, _ERROR):
            job = self._head(child, job_id, kind, events)
            if job is not None:
                child.jobs.popleft()
                job.done = True
                if job.soft_timer is not None or job.hard_timer is not None:
                    job.cancel_timers()
                events.append((deliver_result if kind == _RESULT else deliver_error, (job, payload)))
                if self.fair and not child.jobs:
                    self.mark_idle(child)
        elif kind == frames.READY:
            self.supervisor.on_ready(child, events)
        elif kind == frames.RETIRE:
            self.supervisor.on_retire(child, payload.decode("utf-8", "replace"), events)
        elif kind == frames.INIT_FAILED:
            self.supervisor.on_init_failed(child, payload.decode("utf-8", "replace"))
        else:
            self._protocol_error(child, f"unknown frame kind {kind!r}", events)

    def _head(self, child: Child, job_id: int, kind: int, events: Events) -> Job | None:
        jobs = child.jobs
        if jobs and jobs[0].id == job_id:
            return jobs[0]
        if child.doomed:
            return None  # its job already ended at the hard limit; late frames are moot
        self._protocol_error(
            child, f"{frames.KIND_NAMES.get(kind, kind)} frame for job {job_id}, expected job "
                   f"{jobs[0].id if jobs else None}", events)
        return None

    def _protocol_error(self, child: Child, what: str, events: Events) -> None:
        logger.error("prefork pool: %s pid:%s sent a bad frame (%s); killing it", child.name, child.pid, what)
        self.supervisor.kill(child, events)

    # -- driving ------------------------------------------------------------------------------

    def attach(self, driver: Driver) -> None:
        """Register every open pipe end and pending timer with ``driver`` (lock held)."""
        self.driver = driver
        for child in self.children:
            if not child.eof:
                driver.add_reader(child.result_fd, self.on_readable, child)
                if child.outbuf:
                    driver.add_writer(child.job_fd, self.on_writable, child)
            for job in child.jobs:
                if job.accepted is not None and (job.soft or job.hard):
                    self.limits.arm(job)
        self.supervisor.attach(driver)

    def detach(self) -> None:
        """Take everything off the current driver (lock held)."""
        driver = self.driver
        if driver is None:
            return
        for child in self.children:
            if not child.eof:
                driver.remove_reader(child.result_fd)
                if child.outbuf:
                    driver.remove_writer(child.job_fd)
            for job in child.jobs:
                job.cancel_timers()
        if self.takeover_timer is not None:
            self.takeover_timer.cancel()
            self.takeover_timer = None
        self.supervisor.detach()
        self.driver = None

    def run_in_driver(self, function: Callable[[], None]) -> None:
        """Run ``function`` in the driver's thread: forks must happen there (see supervisor)."""
        driver = self.driver
        if driver is None or driver.in_driver_thread():
            function()
        else:
            driver.call_soon(function)

    def maintain(self) -> None:
        events: Events = []
        with self.lock:
            self.supervisor.maintain(events)
            self.dispatch(events)
        run_events(events)

    def begin_stop(self) -> None:
        events: Events = []
        with self.lock:
            self.stopping = True
            self.dispatch(events)
            self.supervisor.maintain(events)
            self.check_finished()
        run_events(events)

    def begin_terminate(self) -> None:
        events: Events = []
        with self.lock:
            self.terminating = True
            self.abandon_queue(events, "the pool was terminated first")
            for child in list(self.children):
                if not child.doomed:
                    self.supervisor.kill(child, events, controlled=True)
            self.check_finished()
        run_events(events)

    def check_finished(self) -> None:
        # Queued jobs keep a warm stop going: they wait for a replacement child (if children keep
        # failing to start, the supervisor fails them instead).
        if (self.stopping or self.terminating) and not self.children and not self.outbound:
            self.finished.set()

    def abandon_queue(self, events: Events, why: str) -> None:
        """Fail every job still waiting for a child (lock held)."""
        jobs = list(self.outbound)
        self.outbound.clear()
        for job in jobs:
            job.done = True
            events.append((fail, (job, never_started(job, why))))

