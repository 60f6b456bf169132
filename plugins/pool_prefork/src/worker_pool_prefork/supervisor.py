"""Children's lives: forking, noticing deaths, reaping, killing, and keeping the pool at its size.

A death is noticed by EOF on the child's result pipe (the kernel closes a dead process's fds),
which arrives only after everything the child wrote was read, so its last ACK or RESULT is never
lost. The exit status is then collected with a non-blocking ``waitpid``, retried on short timers
because EOF can precede the status by a moment. A once-a-second tick also polls every child, for
the rare child whose pipe is held open by a grandchild it forked.

On Linux children get SIGKILL when *the thread that forked them* ends (PR_SET_PDEATHSIG), so
forks happen only in the driver's thread (or in ``start()``'s caller), which outlives them.

One module: forking, reaping and replacing children share the children's list and its timers.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from time import monotonic
from typing import TYPE_CHECKING, Any

from worker_core.exceptions import PoolError

from .backoff import RestartBackoff
from .children import Child, fork_child
from .claims import LOCK_WAIT
from .drivers import Driver, TimerHandle
from .jobs import lost_in_child
from .outcomes import Events, fail, run_events

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["Supervisor"]

logger = logging.getLogger("worker.pool")

_TICK = 1.0
#: A child dying sooner than this after its fork, without a job, counts as a failed start.
_EARLY_DEATH = 1.0


def human_status(code: int | None) -> str:
    """``'signal 9 (SIGKILL)'`` or ``'exitcode 1'``, as Celery (billiard) words it."""
    if code is None:
        return "an unknown status (reaped elsewhere)"
    if code < 0:
        try:
            return f"signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"signal {-code}"
    return f"exitcode {code}"


class Supervisor:
    """Forks, reaps and replaces the engine's children."""

    def __init__(self, engine: Engine, *, start_timeout: float, kill_grace: float) -> None:
        self.engine = engine
        self.start_timeout = start_timeout
        self.kill_grace = kill_grace
        self.backoff = RestartBackoff()
        self.number = 0
        self.forks = 0
        self.tick_timer: TimerHandle | None = None
        self.restart_timer: TimerHandle | None = None
        #: Notified whenever a child was reaped (lets a retired driver thread wait for its children).
        self.reaped = threading.Condition(engine.lock)
        self._context: Any = None

    # -- forking ------------------------------------------------------------------------------

    def spawn(self) -> Child:
        """Fork one child and watch its result pipe (lock held, in the driver's thread)."""
        engine = self.engine
        if self._context is None:
            import billiard

            self._context = billiard.get_context("fork")
        self.number += 1
        inherited = [fd for other in engine.children for fd in (other.job_fd, other.result_fd)]
        child = fork_child(self._context, self.number, inherited=inherited,
                           initializer=engine.options.initializer, finalizer=engine.options.finalizer,
                           max_tasks=engine.max_tasks,
                           max_memory_kib=engine.options.max_memory_per_child,
                           batch=engine.options.extra.get("child_scheduler", "batch") == "batch")
        self.forks += 1
        engine.children.append(child)
        if engine.driver is not None:
            engine.driver.add_reader(child.result_fd, engine.on_readable, child)
        return child

    def maintain(self, events: Events) -> None:
        """Fork children until the pool has its size again, unless restarts are backing off."""
        engine = self.engine
        driver = engine.driver
        if engine.terminating or driver is None:
            return
        # A warm stop only replaces children while there is still queued work for them.
        want = (max(engine.target, 1) if engine.outbound else 0) if engine.stopping else engine.target
        live = sum(1 for child in engine.children if child.live)
        missing = want - live
        if missing <= 0:
            return
        if engine.stopping and live == 0 and self.backoff.failures >= 3:
            engine.abandon_queue(events, "the pool is stopping and its child processes keep failing to start")
            engine.check_finished()
            return
        delay = self.backoff.remaining()
        if delay > 0:
            if self.restart_timer is None:
                self.restart_timer = driver.call_later(delay, self._restart_due)
            return
        for _ in range(missing):
            try:
                self.spawn()
            except PoolError as exc:
                delay = self.backoff.failed()
                logger.error("%s; trying again in %.1fs", exc, delay)
                if self.restart_timer is None:
                    self.restart_timer = driver.call_later(delay, self._restart_due)
                return

    def _restart_due(self) -> None:
        events: Events = []
        with self.engine.lock:
            self.restart_timer = None
            self.maintain(events)
            self.engine.dispatch(events)
        run_events(events)

    # -- what children tell us ----------------------------------------------------------------

    def on_ready(self, child: Child, events: Events) -> None:
        child.ready = True
        self.backoff.succeeded()
        self.engine.mark_idle(child)

    def on_retire(self, child: Child, reason: str, events: Events) -> None:
        logger.debug("prefork pool: %s pid:%s retires: %s", child.name, child.pid, reason)
        child.retiring = True
        # It exits without reading further: whatever else was written to it never started.
        waiting = list(child.jobs)
        child.jobs.clear()
        self._drop_output(child)
        self.engine.requeue(waiting, events)
        self.maintain(events)

    def on_init_failed(self, child: Child, trace: str) -> None:
        child.init_failed = True
        logger.error("prefork pool: the pool initializer raised in %s pid:%s, which exits:\n%s",
                     child.name, child.pid, trace.rstrip())

    def on_eof(self, child: Child, events: Events) -> None:
        child.eof = True
        if self.engine.driver is not None:
            self.engine.driver.remove_reader(child.result_fd)
        self._drop_output(child)
        self._try_reap(child, events)

    def _drop_output(self, child: Child) -> None:
        if child.outbuf:
            child.outbuf.clear()
            if self.engine.driver is not None:
                self.engine.driver.remove_writer(child.job_fd)

    # -- reaping ------------------------------------------------------------------------------

    def _exitcode(self, child: Child) -> tuple[bool, int | None]:
        """``(exited, status)`` without blocking."""
        try:
            code = child.process.exitcode
        except ValueError:
            code = None
        if code is not None:
            return True, code
        try:
            os.kill(child.pid, 0)
        except ProcessLookupError:
            return True, None  # someone else's waitpid(-1) took its status
        except PermissionError:
            pass
        return False, None

    def _try_reap(self, child: Child, events: Events) -> None:
        exited, code = self._exitcode(child)
        if exited:
            self._finalize(child, code, events)
            return
        # EOF can come a moment before the exit status; a child that closed its pipe but keeps
        # running (a task closed the fd) is killed after about a second.
        child.reap_tries += 1
        if child.reap_tries == 25:
            logger.warning("prefork pool: %s pid:%s closed its result pipe but did not exit; killing it",
                           child.name, child.pid)
            try:
                os.kill(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        driver = self.engine.driver
        if driver is not None:
            delay = min(0.0005 * (2 ** child.reap_tries), 0.05)
            child.reap_timer = driver.call_later(delay, self._reap_due, child)

    def _reap_due(self, child: Child) -> None:
        events: Events = []
        with self.engine.lock:
            child.reap_timer = None
            if not child.reaped:
                self._try_reap(child, events)
            self.engine.dispatch(events)
        run_events(events)

    def _finalize(self, child: Child, code: int | None, events: Events) -> None:
        engine = self.engine
        child.reaped = True
        child.exitcode = code
        for timer in (child.reap_timer, child.kill_timer):
            if timer is not None:
                timer.cancel()
        child.reap_timer = child.kill_timer = None
        driver = engine.driver
        if driver is not None and not child.eof:
            driver.remove_reader(child.result_fd)
        child.eof = True
        self._drop_output(child)
        for fd in (child.job_fd, child.result_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        child.slot.close()
        child.claims.close()
        try:
            child.process.close()
        except ValueError:
            pass
        engine.children.remove(child)
        status = human_status(code)
        jobs = list(child.jobs)
        child.jobs.clear()
        for job in jobs:
            if job.accepted is not None and not job.done:
                job.done = True
                job.cancel_timers()
                events.append((fail, (job, lost_in_child(job, status))))
        engine.requeue([job for job in jobs if job.accepted is None], events)
        expected = (child.controlled or engine.terminating
                    or (code == 0 and (child.retiring or child.stop_sent)))
        log = logger.debug if expected else logger.error
        log("Process %r pid:%r exited with %r", child.name, child.pid, status)
        if self._failed_start(child):
            delay = self.backoff.failed()
            logger.warning("prefork pool: %s died %s (%s); next fork in %.1fs (%d failed start(s) in a row)",
                           child.name, "before it was ready" if not child.ready else "right after starting",
                           status, delay, self.backoff.failures)
        self.reaped.notify_all()
        self.maintain(events)
        engine.dispatch(events)
        engine.check_finished()

    def _failed_start(self, child: Child) -> bool:
        """Whether a death counts toward restart backoff: it never got ready, or died within a
        second of starting without being given a job. Children we killed or asked to exit
        (stop, shrink) never count."""
        if child.controlled or child.stop_sent or child.retiring or self.engine.terminating:
            return False
        if not child.ready:
            return True
        return child.writes == 0 and monotonic() - child.forked_at < _EARLY_DEATH

    # -- killing ------------------------------------------------------------------------------

    def kill(self, child: Child, events: Events, *, controlled: bool = True) -> None:
        """SIGTERM now, SIGKILL after the grace period; its unstarted jobs go to other children."""
        if child.reaped:
            return
        child.doomed = True
        child.controlled = child.controlled or controlled
        if child.jobs:
            # Jobs it has not claimed go to other children now; one it claimed but did not report
            # started is settled once it is gone (it never ran if no ACK came before the EOF).
            taken = self.engine.take_back(child, child.jobs[-1].id, LOCK_WAIT)
            if taken:
                self.engine.requeue(taken, events)
        self._drop_output(child)
        self.send_term(child)
        self.maintain(events)

    def send_term(self, child: Child) -> None:
        """The parent's SIGTERM (the child dies of it, see :mod:`.child_setup`), and SIGKILL after
        the grace period if the child still runs: a task in a long C call runs the child's
        handler only when the call returns, and a task may have installed its own."""
        child.slot.mean_term()
        try:
            os.kill(child.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        if child.kill_at is None:
            child.kill_at = monotonic() + self.kill_grace
            driver = self.engine.driver
            if driver is not None:
                child.kill_timer = driver.call_later(self.kill_grace, self._escalate, child)

    def _escalate(self, child: Child) -> None:
        with self.engine.lock:
            child.kill_timer = None
            if not child.reaped:
                try:
                    os.kill(child.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    # -- periodic check -----------------------------------------------------------------------

    def tick(self) -> None:
        engine = self.engine
        events: Events = []
        now = monotonic()
        with engine.lock:
            for child in list(engine.children):
                if child.reaped or child.eof:
                    continue
                exited, code = self._exitcode(child)
                if exited:
                    engine.read(child, events)
                    if not child.reaped:
                        # Dead, but a grandchild still holds its result pipe open.
                        self._finalize(child, code, events)
                elif not child.ready and not child.doomed and now - child.forked_at > self.start_timeout:
                    logger.error("prefork pool: %s pid:%s did not report ready within %gs (a slow or stuck "
                                 "initializer?); killing it", child.name, child.pid, self.start_timeout)
                    self.kill(child, events, controlled=False)
            self.maintain(events)
            engine.dispatch(events)
        run_events(events)

    # -- drivers ------------------------------------------------------------------------------

    def attach(self, driver: Driver) -> None:
        self.tick_timer = driver.call_repeatedly(_TICK, self.tick)
        now = monotonic()
        for child in self.engine.children:
            if child.eof and not child.reaped:
                child.reap_timer = driver.call_later(0.0, self._reap_due, child)
            if child.kill_at is not None and not child.reaped:
                child.kill_timer = driver.call_later(max(child.kill_at - now, 0.0), self._escalate, child)
        self.restart_timer = driver.call_later(self.backoff.remaining(), self._restart_due)

    def detach(self) -> None:
        for timer in (self.tick_timer, self.restart_timer):
            if timer is not None:
                timer.cancel()
        self.tick_timer = self.restart_timer = None
        for child in self.engine.children:
            for timer in (child.reap_timer, child.kill_timer):
                if timer is not None:
                    timer.cancel()
            child.reap_timer = child.kill_timer = None

    def force_reap(self, events: Events) -> None:
        """Last resort when the driver did not finish: SIGKILL and block until each child is gone."""
        for child in list(self.engine.children):
            try:
                os.kill(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                child.process.join(2.0)
            except (AssertionError, ValueError):
                pass
            if not child.eof:
                self.engine.read(child, events)
            if not child.reaped:
                _, code = self._exitcode(child)
                self._finalize(child, code, events)
