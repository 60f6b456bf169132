"""The prefork pool: jobs run in child processes forked (with billiard) after the app is imported.

**Threads and callbacks.** ``start()`` forks the children in the calling thread and waits for
each to report ready. From then on a background thread drives the pipes and timers (the sync
loop), until :meth:`register_with_event_loop` hands everything to kombu's hub (the async loop):
there the pool runs no thread at all, every callback runs in the hub's thread, and the pool's
methods must be called from the hub's thread too. Under the background thread, callbacks run in
that thread; ``apply_async`` may be called from any thread. ``stop()`` and ``terminate()``
under the hub drive the pipes themselves in the calling thread until the children are gone.

**Forks.** On Linux a child gets SIGKILL when the *thread* that forked it ends
(PR_SET_PDEATHSIG), so no child outlives a killed worker. Forks therefore happen only in
``start()``'s caller and in the driving thread (the hub's, or the pool's own): call ``start()``
and run the hub from a thread that outlives the pool, normally the main thread.

**Initializer.** ``PoolOptions.initializer`` runs in every child after the fork, before the child
reports ready: use it to drop what must not be shared with the parent (open connections,
random seeds, thread pools) and to open per-process resources.

One module: the Pool protocol's methods, each a few lines over the engine and the supervisor.
"""

from __future__ import annotations

import logging
import os
import signal as signals
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from worker_core.exceptions import ConfigurationError, PoolError
from worker_core.slots import AcceptCallback, Pool, PoolOptions, SharesOneQueue, WithdrawsOneJob

from .drivers import HubDriver, SelectorDriver
from .engine import SCHEDULING, Engine
from .frames import STOP, encode
from .jobs import Job, withdrawn_unstarted
from .outcomes import Events, fail, run_events
from .plugin import CHILD_SCHEDULERS
from .stats import pool_info

if TYPE_CHECKING:
    from kombu.asynchronous import Hub

__all__ = ["PreforkPool"]

logger = logging.getLogger("worker.pool")

_STOP_FRAME = encode(STOP)


def _check_positive(options: PoolOptions, name: str, *, integer: bool) -> None:
    value = getattr(options, name)
    if value is None:
        return
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or value < 0 or (integer and value == 0):
        need = "a positive integer" if integer else "a number of seconds >= 0"
        raise ConfigurationError(
            f"prefork pool: {name} must be {need} or None (got {value!r} that is a {type(value).__name__})")


class PreforkPool:
    """Runs each job in a forked child process; see the module docstring for threads and forks.

    :param start_timeout: seconds ``start()`` waits for the first children to report ready, and
        after which a child still not ready (stuck initializer) is killed and replaced.
    :param kill_grace: seconds between SIGTERM and SIGKILL when a child is killed.
    """

    is_process_pool: ClassVar[bool] = True
    #: The worker hands the pool every task it receives: jobs wait in the children's pipes,
    #: where an idle child takes over one that waits behind a running job (fair scheduling),
    #: and :meth:`withdraw_queued` gives back those not started.
    shared_queue: ClassVar[bool] = True

    @classmethod
    def check_options(cls, options: PoolOptions) -> None:
        if not hasattr(os, "fork"):
            raise ConfigurationError("the prefork pool needs fork(), which this platform lacks; "
                                     "use -P threads or -P solo")
        concurrency = options.concurrency
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 0:
            raise ConfigurationError(
                f"prefork pool: concurrency must be an integer >= 0 (got {concurrency!r} that is a "
                f"{type(concurrency).__name__})")
        if options.scheduling not in SCHEDULING:
            raise ConfigurationError(
                f"prefork pool: scheduling must be 'fair' or 'fcfs' (got {options.scheduling!r}); "
                "fair writes a job only to an idle child, fcfs to any child in turn")
        for name in ("soft_time_limit", "time_limit"):
            _check_positive(options, name, integer=False)
        for name in ("max_tasks_per_child", "max_memory_per_child"):
            _check_positive(options, name, integer=True)
        scheduler = options.extra.get("child_scheduler", "batch")
        if scheduler not in CHILD_SCHEDULERS:
            raise ConfigurationError(
                f"prefork pool: child_scheduler must be one of {', '.join(CHILD_SCHEDULERS)} (got "
                f"{scheduler!r}): batch keeps a child woken by a job from preempting the main process")

    def __init__(self, options: PoolOptions, *, start_timeout: float = 10.0, kill_grace: float = 0.5) -> None:
        self.check_options(options)
        self.options = options
        self.start_timeout = start_timeout
        self._engine = Engine(options, start_timeout=start_timeout, kill_grace=kill_grace)
        self._state = "new"  # new -> running -> stopped
        self._thread_driver: SelectorDriver | None = None
        self._hub_driver: HubDriver | None = None
        self._started_ok = False

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        if self._state != "new":
            raise PoolError(f"the prefork pool was already started (it is {self._state})")
        engine = self._engine
        driver = SelectorDriver()
        try:
            with engine.lock:
                engine.attach(driver)
                for _ in range(engine.target):
                    engine.supervisor.spawn()
                initial = list(engine.children)
        except BaseException:
            self._abandon(driver)
            raise
        self._state = "running"
        driver.run_until(lambda: all(child.ready or child.reaped for child in initial), self.start_timeout)
        self._started_ok = all(child.ready for child in initial)
        if not self._started_ok:
            ready = sum(child.ready for child in initial)
            logger.error("prefork pool: only %d of %d child processes started within %gs (see the errors "
                         "above); failing ones are retried with a growing delay", ready, len(initial),
                         self.start_timeout)
        self._thread_driver = driver
        driver.start_thread("worker-prefork-pool", after=self._linger)

    def _abandon(self, driver: SelectorDriver) -> None:
        """A fork failed in start(): kill what was forked and release everything."""
        engine = self._engine
        events: Events = []
        with engine.lock:
            engine.terminating = True
            engine.supervisor.force_reap(events)
            engine.abandon_queue(events, "the pool failed to start")
            engine.detach()
        driver.close()
        run_events(events)
        self._state = "stopped"

    def _linger(self) -> None:
        """The driver thread's last act: wait until the children it forked are gone, since they
        die with it (PR_SET_PDEATHSIG) once it ends. Only matters after a switch to the hub."""
        me = threading.get_ident()
        engine = self._engine
        with engine.lock:
            while any(child.forker == me for child in engine.children):
                engine.supervisor.reaped.wait(1.0)

    def register_with_event_loop(self, hub: Hub) -> None:
        if self._hub_driver is not None and self._hub_driver.hub is hub and not self._hub_driver.closed:
            return  # already registered; after hub.reset() (a reconnect) everything is added again
        if self._state != "running":
            raise PoolError(
                f"register_with_event_loop: the prefork pool is {self._state}; call start() first")
        engine = self._engine
        old = self._thread_driver
        if old is not None:
            self._retire_thread(old)
        new = HubDriver(hub)
        with engine.lock:
            engine.detach()
            engine.attach(new)
        if self._hub_driver is not None:
            self._hub_driver.close()
        self._hub_driver = new

    def _retire_thread(self, driver: SelectorDriver) -> None:
        thread = driver.thread
        if thread is not None and thread.ident == threading.get_ident():
            raise PoolError("register_with_event_loop() was called from the prefork pool's own thread "
                            "(inside a pool callback); call it from the hub's thread")
        driver.request_stop()
        # Never let two loops drive the pipes: wait for the thread however long a callback takes.
        while not driver.wait_loop_exit(5.0):
            logger.warning("prefork pool: waiting for the pool's thread to hand over to the hub "
                           "(a pool callback has been running for a while)")
        # The thread leaves its loop and lingers only while children it forked are alive.
        if thread is not None:
            thread.join(0.05)
        with self._engine.lock:
            self._engine.detach()
        driver.close()
        self._thread_driver = None

    def stop(self) -> None:
        self._close(self._engine.begin_stop, None)

    def terminate(self) -> None:
        self._close(self._engine.begin_terminate, 10.0 + self._engine.supervisor.kill_grace)

    def _close(self, begin: Callable[[], None], timeout: float | None) -> None:
        if self._state == "new":
            self._state = "stopped"
            return
        if self._state == "stopped":
            return
        with self._engine.lock:
            self._engine.closed = True
        self._finish(begin, timeout)

    def _finish(self, begin: Callable[[], None], timeout: float | None) -> None:
        """Run ``begin`` in the driving thread and wait until every child was reaped."""
        engine = self._engine
        finished = engine.finished.is_set
        thread_driver = self._thread_driver
        done = False
        if thread_driver is not None:
            thread = thread_driver.thread
            if thread is not None and thread.ident == threading.get_ident():
                begin()  # called from a pool callback: keep driving in this very thread
                done = thread_driver.run_until(finished, timeout)
            else:
                thread_driver.call_soon(begin)
                done = self._wait(engine.finished, thread, timeout)
            thread_driver.request_stop()
            if thread is not None and thread.ident != threading.get_ident():
                thread.join(5.0)
            if not done:
                # The driving thread died or hung: finish in this thread instead.
                with engine.lock:
                    engine.detach()
                done = self._drive_here(begin, timeout)
            thread_driver.close()
            self._thread_driver = None
        else:
            with engine.lock:
                engine.detach()
            if self._hub_driver is not None:
                self._hub_driver.close()
                self._hub_driver = None
            done = self._drive_here(begin, timeout)
        if not done:
            logger.error("prefork pool: children did not exit in time; killing them")
            events: Events = []
            with engine.lock:
                engine.terminating = True
                engine.supervisor.force_reap(events)
                engine.abandon_queue(events, "the pool's children did not exit in time and were killed")
                engine.check_finished()
            run_events(events)
        self._state = "stopped"

    def _drive_here(self, begin: Callable[[], None], timeout: float | None) -> bool:
        engine = self._engine
        private = SelectorDriver()
        with engine.lock:
            engine.attach(private)
        try:
            begin()
            return private.run_until(engine.finished.is_set, timeout)
        finally:
            with engine.lock:
                engine.detach()
            private.close()

    @staticmethod
    def _wait(finished: threading.Event, thread: threading.Thread | None, timeout: float | None) -> bool:
        waited = 0.0
        while not finished.wait(0.05):
            if thread is None or not thread.is_alive():
                return finished.is_set()
            waited += 0.05
            if timeout is not None and waited >= timeout:
                return False
        return True

    def did_start_ok(self) -> bool:
        return self._started_ok

    # -- jobs ---------------------------------------------------------------------------------

    def apply_async(
        self,
        target: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        callback: Callable[[Any], None] | None = None,
        error_callback: Callable[[BaseException], None] | None = None,
        accept_callback: AcceptCallback | None = None,
        timeout_callback: Callable[[bool, float], None] | None = None,
        soft_timeout: float | None = None,
        timeout: float | None = None,
        name: str | None = None,
    ) -> Job | None:
        engine = self._engine
        soft = engine.soft_default if soft_timeout is None else soft_timeout or None
        hard = engine.hard_default if timeout is None else timeout or None
        return engine.submit(target, args, kwargs, callback, error_callback, accept_callback,
                             timeout_callback, soft, hard)

    def withdraw_job(self, handle: Any) -> bool:
        """Take back the job ``apply_async`` returned ``handle`` for, if no child has started it;
        its callbacks are then never called."""
        engine = self._engine
        events: Events = []
        with engine.lock:
            taken = engine.withdraw_job(handle, events)
        run_events(events)
        return taken

    def withdraw_queued(self) -> int:
        """Give back every job no child has started (``JobWithdrawn``); returns how many."""
        engine = self._engine
        with engine.lock:
            withdrawn = engine.withdraw_queued()
        run_events([(fail, (job, withdrawn_unstarted(job))) for job in withdrawn])
        return len(withdrawn)

    def terminate_job(self, pid: int, signal: int | None = None) -> None:
        """Send ``signal`` (SIGTERM by default) to the child running ``pid``.

        SIGUSR1 raises ``SoftTimeLimitExceeded`` in the running task, like a soft limit. SIGTERM
        is followed by SIGKILL after the kill grace period if the child still runs. A child that
        dies of the signal fails its running job with ``WorkerLostError`` and is replaced.
        """
        signum = signals.SIGTERM if signal is None else signal
        engine = self._engine
        with engine.lock:
            child = next((c for c in engine.children if c.pid == pid and not c.reaped), None)
            if child is None:
                pids = [c.pid for c in engine.children]
                raise PoolError(f"terminate_job: no child process with pid {pid} in this prefork pool "
                                f"(its children are {pids}); the task may have finished already")
            if signum == signals.SIGUSR1:
                running = child.jobs[0] if child.jobs and child.jobs[0].accepted is not None else None
                if running is None:
                    return
                child.slot.aim(running.id, 0.0)
            else:
                child.controlled = True
                if signum == signals.SIGTERM:
                    engine.supervisor.send_term(child)
                    return
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    # -- size ---------------------------------------------------------------------------------

    @property
    def num_processes(self) -> int:
        return self._engine.target

    def grow(self, n: int = 1) -> None:
        if n < 0:
            raise PoolError(f"grow: n must be >= 0 (got {n!r}); use shrink() to remove processes")
        engine = self._engine
        with engine.lock:
            if engine.closed:
                raise PoolError("grow: the prefork pool is stopped")
            engine.target += n
        if self._state == "running":
            engine.run_in_driver(engine.maintain)

    def shrink(self, n: int = 1) -> None:
        """Retire up to ``n`` idle children gracefully (each exits after a STOP frame)."""
        if n < 0:
            raise PoolError(f"shrink: n must be >= 0 (got {n!r}); use grow() to add processes")
        engine = self._engine
        with engine.lock:
            if n == 0:
                return
            if self._state != "running":
                engine.target = max(engine.target - n, 0)
                return
            live = [child for child in engine.children if child.live]
            if not live:
                raise PoolError("cannot shrink the prefork pool: it has no processes left to remove")
            idle = [child for child in live if not child.jobs and not child.outbuf]
            if not idle:
                raise PoolError(f"cannot shrink the prefork pool: all {len(live)} processes are busy; "
                                "try again when a task finishes")
            chosen = idle[-n:]
            for child in chosen:
                child.retiring = True
                child.stop_sent = True
                engine.write(child, _STOP_FRAME)
            engine.target = max(engine.target - len(chosen), 0)
            if len(chosen) < n:
                logger.debug("prefork pool: shrank by %d of %d; the other processes are busy", len(chosen), n)

    def restart(self) -> None:
        """Replace every child (``pool_restart``): each gets a STOP frame after the jobs written
        to it, so it exits once they are done, and a fresh child is forked in its place."""
        engine = self._engine
        with engine.lock:
            if engine.closed or self._state != "running":
                raise PoolError("restart: the prefork pool is not running")
            for child in [child for child in engine.children if child.live]:
                child.retiring = True
                child.stop_sent = True
                engine.write(child, _STOP_FRAME)
        engine.run_in_driver(engine.maintain)

    def maintain_pool(self) -> None:
        if self._state == "running":
            self._engine.run_in_driver(self._engine.maintain)

    # -- statistics ---------------------------------------------------------------------------

    def info(self) -> Mapping[str, Any]:
        engine = self._engine
        with engine.lock:
            return pool_info(self, engine, driver="hub" if self._hub_driver is not None else "thread")

    @property
    def forks(self) -> int:
        """How many children were forked so far (replacements included)."""
        return self._engine.supervisor.forks


if TYPE_CHECKING:
    # mypy proves the class satisfies its slot's Protocol and the capabilities it offers.
    _POOL: type[Pool] = PreforkPool
    _SHARED: type[SharesOneQueue] = PreforkPool
    _WITHDRAWS: type[WithdrawsOneJob] = PreforkPool
