"""The worker's side of the asyncio pool: its loop processes, the jobs waiting for room in them,
their time limits and their ends, all handled in one thread of the worker (the pool's own, which
runs a small asyncio loop over the processes' pipes).

Jobs wait here until a loop process has room (its share of the concurrency, and a free thread
for a plain function), so that every job a process gets starts at once and every job not
started can be given back. Callbacks run in the pool's thread.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections import deque
from collections.abc import Callable
from time import monotonic
from typing import Any

from worker_core.exceptions import PoolError, TimeLimitExceeded, WorkerLostError

from . import frames
from .child import ChildConfig, child_main
from .crashes import Marks, culprit
from .frames import FrameReader
from .process import fork, human_status

__all__ = ["Child", "Engine", "Job"]

logger = logging.getLogger("worker.pool")

_READ = 1 << 18


class Job:
    """One ``apply_async`` call, from submission until exactly one outcome was reported."""

    __slots__ = (
        "abandoned",
        "accept_callback",
        "accepted",
        "callback",
        "child",
        "done",
        "error_callback",
        "frame",
        "hard",
        "id",
        "name",
        "plain",
        "soft",
        "timeout_callback",
        "timers",
    )

    def __init__(
        self,
        job_id: int,
        frame: bytes,
        name: str,
        plain: bool,
        callback: Callable[[Any], None] | None,
        error_callback: Callable[[BaseException], None] | None,
        accept_callback: Callable[[int, float], None] | None,
        timeout_callback: Callable[[bool, float], None] | None,
        soft: float | None,
        hard: float | None,
    ) -> None:
        self.id = job_id
        self.frame = frame
        self.name = name
        self.plain = plain
        self.callback = callback
        self.error_callback = error_callback
        self.accept_callback = accept_callback
        self.timeout_callback = timeout_callback
        self.soft = soft
        self.hard = hard
        self.child: Child | None = None
        self.accepted: float | None = None
        self.done = False
        self.abandoned = False  # cancelled and still running after the grace: its process is replaced
        self.timers: list[asyncio.TimerHandle] = []

    @property
    def label(self) -> str:
        return f"{self.name} (job {self.id})"

    def cancel_timers(self) -> None:
        for timer in self.timers:
            timer.cancel()
        self.timers.clear()


class Child:
    """One loop process as the worker sees it."""

    __slots__ = (
        "capacity",
        "crash_fd",
        "dead",
        "doomed",
        "forked_at",
        "job_fd",
        "jobs",
        "marks",
        "name",
        "number",
        "outbuf",
        "pid",
        "plain",
        "reader",
        "ready",
        "reap_tries",
        "result_fd",
        "retiring",
        "sent",
        "stalled",
        "stop_sent",
        "threads",
        "writing",
    )

    def __init__(self, number: int, pid: int, job_fd: int, result_fd: int, threads: int, marks: Marks,
                 crash_fd: int) -> None:
        self.number = number
        self.marks = marks
        self.crash_fd = crash_fd  # the read end of its crash report
        self.threads = threads  # for plain functions
        self.name = f"AsyncioLoop-{number}"
        self.pid = pid
        self.job_fd = job_fd
        self.result_fd = result_fd
        self.reader = FrameReader()
        self.outbuf = bytearray()
        self.writing = False
        self.jobs: dict[int, Job] = {}
        self.plain = 0  # plain functions running in its threads
        self.capacity = 0
        self.ready = False
        self.retiring = False  # takes no more jobs; exits once its own are done
        self.doomed = False  # being killed
        self.stop_sent = False
        self.stalled = False
        self.dead = False
        self.sent = 0
        self.reap_tries = 0
        self.forked_at = monotonic()

    @property
    def live(self) -> bool:
        return not (self.retiring or self.doomed or self.dead)

    def __repr__(self) -> str:
        return f"<{self.name} pid:{self.pid} jobs={len(self.jobs)}>"


class Engine:
    """Everything the pool does, in its own thread (see the module docstring)."""

    def __init__(
        self,
        *,
        concurrency: int,
        processes: int,
        threads: int | None,
        io_threads: int,
        loop: str,
        stall_after: float,
        cancel_grace: float,
        max_tasks: int | None,
        initializer: Callable[[], None] | None,
        finalizer: Callable[[int], None] | None,
    ) -> None:
        self.concurrency = concurrency
        self.processes = processes
        self.threads_option = threads
        self.io_threads = io_threads
        self.loop_kind = loop
        self.stall_after = stall_after
        self.cancel_grace = cancel_grace
        self.max_tasks = max_tasks
        self.initializer = initializer
        self.finalizer = finalizer
        self.children: list[Child] = []
        self.waiting: deque[Job] = deque()  # coroutines waiting for room
        self.waiting_plain: deque[Job] = deque()  # plain functions waiting for a thread
        self.running = 0  # jobs in the loop processes
        self.closed = False
        self.stopping = False
        self.terminating = False
        self.finished = threading.Event()
        self.numbers = 0
        self.forks = 0
        self.failures = 0  # loop processes that died before they were ready, in a row
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        self._incoming: deque[Job] = deque()
        self._incoming_lock = threading.Lock()
        self._kicked = False
        self._restart: asyncio.TimerHandle | None = None

    # -- the pool's thread ---------------------------------------------------------------------

    def start_thread(self) -> None:
        started = threading.Event()

        def main() -> None:
            loop = asyncio.new_event_loop()
            self.loop = loop
            asyncio.set_event_loop(loop)
            started.set()
            try:
                loop.run_forever()
            finally:
                loop.close()

        self.thread = threading.Thread(target=main, name="worker-asyncio-pool", daemon=True)
        self.thread.start()
        started.wait()

    def in_thread(self) -> bool:
        return self.thread is not None and threading.get_ident() == self.thread.ident

    def call(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None) -> Any:
        """Run ``fn(*args)`` in the pool's thread and return what it returns (or raise)."""
        if self.in_thread() or self.loop is None or self.loop.is_closed():
            return fn(*args)
        import concurrent.futures

        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(fn(*args))
            except BaseException as exc:
                future.set_exception(exc)

        self.loop.call_soon_threadsafe(run)
        return future.result(timeout)

    def soon(self, fn: Callable[..., Any], *args: Any) -> None:
        if self.in_thread():
            fn(*args)
        elif self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(fn, *args)

    def submit(self, job: Job) -> None:
        """Queue ``job`` (from any thread): one wake-up of the pool's thread for many jobs."""
        if self.in_thread():
            self._queue(job)
            self.dispatch()
            return
        with self._incoming_lock:
            self._incoming.append(job)
            kick = not self._kicked
            self._kicked = True
        if kick and self.loop is not None:
            self.loop.call_soon_threadsafe(self._take_incoming)

    def _take_incoming(self) -> None:
        with self._incoming_lock:
            jobs, self._incoming = self._incoming, deque()
            self._kicked = False
        for job in jobs:
            self._queue(job)
        self.dispatch()

    def _queue(self, job: Job) -> None:
        if self.terminating:
            _call(
                job.error_callback,
                WorkerLostError(f"Job {job.id} never started: the asyncio pool was terminated first."),
            )
            return
        (self.waiting_plain if job.plain else self.waiting).append(job)

    # -- loop processes --------------------------------------------------------------------------

    def spawn(self) -> Child:
        self.numbers += 1
        number = self.numbers
        job_r, job_w = os.pipe()
        result_r, result_w = os.pipe()
        crash_r, crash_w = os.pipe()
        _report_room(crash_w)
        inherited = tuple(
            fd for child in self.children for fd in (child.job_fd, child.result_fd, child.crash_fd)
        )
        threads = self.threads_option or max(min(-(-self.concurrency // max(self.processes, 1)), 16), 1)
        marks = Marks(1 + threads)
        config = ChildConfig(
            name=f"AsyncioLoop-{number}",
            parent_pid=os.getpid(),
            job_fd=job_r,
            result_fd=result_w,
            close_fds=(*inherited, job_w, result_r, crash_r),
            threads=threads,
            io_threads=self.io_threads,
            loop=self.loop_kind,
            stall_after=self.stall_after,
            marks=marks,
            crash_fd=crash_w,
            initializer=self.initializer,
            finalizer=self.finalizer,
        )
        try:
            pid = fork(lambda: child_main(config))
        except OSError as exc:
            for fd in (job_r, job_w, result_r, result_w, crash_r, crash_w):
                os.close(fd)
            marks.close()
            raise PoolError(
                f"asyncio pool: cannot fork a loop process: {exc}; check the process and memory "
                "limits (ulimit -u, available memory)"
            ) from exc
        os.close(job_r)
        os.close(result_w)
        os.close(crash_w)
        os.set_blocking(job_w, False)
        os.set_blocking(result_r, False)
        os.set_blocking(crash_r, False)
        child = Child(number, pid, job_w, result_r, threads, marks, crash_r)
        self.forks += 1
        self.children.append(child)
        self.share()
        assert self.loop is not None
        self.loop.add_reader(result_r, self._on_readable, child)
        return child

    def share(self) -> None:
        """Split the concurrency among the live processes (the first ones get the remainder)."""
        live = [child for child in self.children if child.live]
        for child in self.children:
            if not child.live:
                child.capacity = 0
        if not live:
            return
        base, extra = divmod(self.concurrency, len(live))
        for index, child in enumerate(live):
            child.capacity = base + (1 if index < extra else 0)

    def maintain(self) -> None:
        """Fork loop processes until the pool has its number again (with a growing delay after
        processes that died before they were ready)."""
        if self.terminating or (self.stopping and not (self.waiting or self.waiting_plain)):
            return
        missing = self.processes - sum(1 for child in self.children if child.live)
        if missing <= 0 or self._restart is not None:
            return
        if self.failures:
            delay = min(0.5 * 2 ** (self.failures - 1), 10.0)
            assert self.loop is not None
            self._restart = self.loop.call_later(delay, self._restart_due)
            if self.failures >= 3:
                logger.error(
                    "asyncio pool: loop processes keep dying before they are ready; next try in %.1fs", delay
                )
            return
        for _ in range(missing):
            try:
                self.spawn()
            except PoolError as exc:
                logger.error("%s", exc)
                self.failures += 1
                self.maintain()
                return

    def _restart_due(self) -> None:
        self._restart = None
        missing = self.processes - sum(1 for child in self.children if child.live)
        if missing > 0 and not self.terminating:
            try:
                self.spawn()
            except PoolError as exc:
                logger.error("%s", exc)
                self.failures += 1
            self.maintain()

    # -- dispatching -----------------------------------------------------------------------------

    def _pick(self, plain: bool) -> Child | None:
        best: Child | None = None
        room = 0
        for child in self.children:
            if not child.ready or not child.live or child.stop_sent:
                continue
            free = child.capacity - len(child.jobs)
            if plain and child.plain >= child.threads:
                continue
            if free > room:
                best, room = child, free
        return best

    def dispatch(self) -> None:
        if self.terminating:
            return
        touched: set[Child] = set()
        for queue, plain in ((self.waiting, False), (self.waiting_plain, True)):
            while queue:
                child = self._pick(plain)
                if child is None:
                    break
                job = queue.popleft()
                job.child = child
                child.jobs[job.id] = job
                if plain:
                    child.plain += 1
                child.outbuf += job.frame
                child.sent += 1
                self.running += 1
                touched.add(child)
                if self.max_tasks is not None and child.sent >= self.max_tasks:
                    self._retire(child, "it ran its max_tasks_per_child jobs")
        for child in touched:
            self._flush(child)
        self._check_stopped()

    def _write(self, child: Child, data: bytes) -> None:
        child.outbuf += data
        self._flush(child)

    def _flush(self, child: Child) -> None:
        while child.outbuf and not child.dead:
            try:
                written = os.write(child.job_fd, child.outbuf)
            except BlockingIOError:
                if not child.writing:
                    child.writing = True
                    assert self.loop is not None
                    self.loop.add_writer(child.job_fd, self._on_writable, child)
                return
            except OSError:  # it died: its EOF comes on the other pipe
                child.outbuf.clear()
                break
            del child.outbuf[:written]
        if child.writing:
            child.writing = False
            assert self.loop is not None
            self.loop.remove_writer(child.job_fd)

    def _on_writable(self, child: Child) -> None:
        self._flush(child)

    # -- what loop processes say -----------------------------------------------------------------

    def _on_readable(self, child: Child) -> None:
        while not child.dead:
            try:
                data = os.read(child.result_fd, _READ)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:
                self._on_eof(child)
                break
            for kind, job_id, payload in child.reader.feed(data):
                self._handle(child, kind, job_id, payload)
        self.dispatch()

    def _handle(self, child: Child, kind: int, job_id: int, payload: Any) -> None:
        if kind == frames.ACCEPTED:
            job = child.jobs.get(job_id)
            if job is not None and not job.done:
                job.accepted = payload
                _call(job.accept_callback, child.pid, payload)
                self._arm(job)
        elif kind in (frames.RESULT, frames.ERROR):
            job = child.jobs.pop(job_id, None)
            if job is None:
                return
            self.running -= 1
            if job.plain:
                child.plain -= 1
            if not job.done:
                job.done = True
                job.cancel_timers()
                if kind == frames.RESULT:
                    _call(job.callback, payload)
                else:
                    _call(job.error_callback, payload)
            job.cancel_timers()
            if child.retiring:
                self._settle_retiring(child)
        elif kind == frames.READY:
            child.ready = True
            self.failures = 0
        elif kind == frames.STALLED:
            self._on_stalled(child, job_id, payload)
        elif kind == frames.INIT_FAILED:
            logger.error(
                "asyncio pool: the pool initializer raised in %s pid:%s, which exits:\n%s",
                child.name,
                child.pid,
                str(payload).rstrip(),
            )

    def _on_stalled(self, child: Child, job_id: int, payload: tuple[str | None, float, bool]) -> None:
        label, seconds, over = payload
        culprit = f"Task {label}" if label else "a callback outside any task"
        if not over:
            child.stalled = True
            logger.warning(
                "%s has blocked the event loop of %s pid:%s for %.2fs: every task of that process waits. A "
                "blocking call in a coroutine (time.sleep, a synchronous client) belongs in a thread "
                "(await asyncio.to_thread(...)), or the task should be a plain function",
                culprit,
                child.name,
                child.pid,
                seconds,
            )
            if child.retiring:
                assert self.loop is not None
                self.loop.call_later(self.cancel_grace, self._kill_if_stalled, child)
        else:
            child.stalled = False
            logger.warning(
                "The event loop of %s pid:%s ran again after %.2fs blocked by %s",
                child.name,
                child.pid,
                seconds,
                culprit,
            )

    # -- time limits and stopping one job --------------------------------------------------------

    def _arm(self, job: Job) -> None:
        assert self.loop is not None and job.accepted is not None
        if not (job.soft or job.hard):
            return
        elapsed = max(monotonic() - job.accepted, 0.0)
        if job.soft and (not job.hard or job.soft < job.hard):
            job.timers.append(self.loop.call_later(job.soft - elapsed, self._on_soft, job))
        if job.hard:
            job.timers.append(self.loop.call_later(job.hard - elapsed, self._on_hard, job))

    def _on_soft(self, job: Job) -> None:
        child = job.child
        if job.done or child is None or child.dead:
            return
        self._write(child, frames.encode(frames.CANCEL, job.id, signal.SIGUSR1))
        if job.timeout_callback is not None:
            _call(job.timeout_callback, True, job.soft)

    def _on_hard(self, job: Job) -> None:
        child = job.child
        if job.done or child is None or child.dead:
            return
        job.done = True
        if job.timeout_callback is not None:
            _call(job.timeout_callback, False, job.hard)
        _call(job.error_callback, TimeLimitExceeded(job.hard))
        self.cancel(job, None)

    def cancel(self, job: Job, signum: int | None) -> None:
        """Cancel the running ``job`` (SIGUSR1: raise ``SoftTimeLimitExceeded`` in it instead);
        a job still running ``cancel_grace`` seconds later has its process replaced."""
        child = job.child
        if child is None or child.dead or job.id not in child.jobs:
            raise PoolError(
                f"stop_job: job {job.id} ({job.name}) does not run in the asyncio pool (it finished, "
                "or never started)"
            )
        self._write(child, frames.encode(frames.CANCEL, job.id, signum))
        if signum != signal.SIGUSR1:
            assert self.loop is not None
            self.loop.call_later(self.cancel_grace, self._check_cancelled, job)

    def _check_cancelled(self, job: Job) -> None:
        child = job.child
        if child is None or child.dead or job.id not in child.jobs or job.abandoned:
            return
        job.abandoned = True
        logger.error(
            "Task %s is still running %gs after it was cancelled (it swallows CancelledError, or "
            "blocks its event loop): %s pid:%s is replaced; its other tasks finish there first",
            job.label,
            self.cancel_grace,
            child.name,
            child.pid,
        )
        if not job.done:
            job.done = True
            _call(
                job.error_callback,
                WorkerLostError(f"Task {job.label} ignored its cancellation; its process was replaced"),
            )
        self._retire(child, f"task {job.label} ignored its cancellation")
        if child.stalled:
            self._kill(child)

    def _kill_if_stalled(self, child: Child) -> None:
        if child.stalled and not child.dead:
            logger.error(
                "asyncio pool: %s pid:%s, replaced, has its event loop blocked: killing it",
                child.name,
                child.pid,
            )
            self._kill(child)

    # -- retiring, stopping, killing -------------------------------------------------------------

    def _retire(self, child: Child, reason: str) -> None:
        if child.retiring or child.dead:
            return
        logger.debug("asyncio pool: %s pid:%s retires: %s", child.name, child.pid, reason)
        child.retiring = True
        self.share()
        self.maintain()
        self._settle_retiring(child)

    def _settle_retiring(self, child: Child) -> None:
        """A retiring process exits once it runs nothing but jobs that ignored their cancellation
        (those die with it)."""
        if child.dead or child.doomed:
            return
        if all(job.abandoned for job in child.jobs.values()):
            if child.jobs:
                self._kill(child)
            elif not child.stop_sent:
                child.stop_sent = True
                self._write(child, frames.encode(frames.STOP))

    def _kill(self, child: Child) -> None:
        if child.dead:
            return
        child.doomed = True
        self.share()
        try:
            os.kill(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.maintain()

    def begin_stop(self) -> None:
        self.closed = True
        self.stopping = True
        self.maintain()
        self._check_stopped()

    def _check_stopped(self) -> None:
        if not self.stopping or self.terminating or self.waiting or self.waiting_plain:
            return
        for child in self.children:
            if not child.jobs and not child.stop_sent and not child.dead:
                child.stop_sent = True
                self._write(child, frames.encode(frames.STOP))
        self._check_finished()

    def _check_finished(self) -> None:
        if (self.stopping or self.terminating) and not self.children:
            if self._restart is not None:
                self._restart.cancel()
                self._restart = None
            self.finished.set()

    def begin_terminate(self) -> None:
        self.closed = True
        self.terminating = True
        lost = [*self.waiting, *self.waiting_plain]
        self.waiting.clear()
        self.waiting_plain.clear()
        for job in lost:
            job.done = True
            _call(
                job.error_callback,
                WorkerLostError(f"Job {job.id} never started: the asyncio pool was terminated first."),
            )
        for child in self.children:
            for job in child.jobs.values():
                if not job.done:
                    job.done = True
                    job.cancel_timers()
                    _call(
                        job.error_callback,
                        WorkerLostError(
                            f"Task {job.label} was running when the asyncio pool was terminated: it was "
                            "cancelled"
                        ),
                    )
            if not child.dead:
                self._write(child, frames.encode(frames.TERMINATE))
                assert self.loop is not None
                self.loop.call_later(1.0, self._kill, child)
        self._check_finished()

    def withdraw(self, job: Job) -> bool:
        for queue in (self.waiting, self.waiting_plain):
            try:
                queue.remove(job)
            except ValueError:
                continue
            job.done = True
            return True
        return False

    def withdraw_all(self) -> list[Job]:
        jobs = [*self.waiting, *self.waiting_plain]
        self.waiting.clear()
        self.waiting_plain.clear()
        for job in jobs:
            job.done = True
        self._check_stopped()
        return jobs

    # -- deaths ----------------------------------------------------------------------------------

    def _on_eof(self, child: Child) -> None:
        assert self.loop is not None
        self.loop.remove_reader(child.result_fd)
        if child.writing:
            self.loop.remove_writer(child.job_fd)
            child.writing = False
        self._try_reap(child)

    def _try_reap(self, child: Child) -> None:
        try:
            pid, status = os.waitpid(child.pid, os.WNOHANG)
        except ChildProcessError:
            pid, status = child.pid, None
        if pid == 0:
            child.reap_tries += 1
            if child.reap_tries == 50:
                logger.warning(
                    "asyncio pool: %s pid:%s closed its pipe but did not exit; killing it",
                    child.name,
                    child.pid,
                )
                self._kill(child)
            assert self.loop is not None
            self.loop.call_later(min(0.001 * 2**child.reap_tries, 0.05), self._try_reap, child)
            return
        self._reaped(child, status)

    def _reaped(self, child: Child, status: int | None) -> None:
        child.dead = True
        report = _read_report(child.crash_fd)
        blamed = culprit(status, child.marks.pairs(), report)
        child.marks.close()
        for fd in (child.job_fd, child.result_fd, child.crash_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self.children.remove(child)
        text = human_status(status)
        clean = status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        expected = child.doomed or self.terminating or (clean and (child.stop_sent or child.retiring))
        crasher = child.jobs.get(blamed) if blamed is not None else None
        if expected:
            logger.debug("Process %r pid:%r exited with %r", child.name, child.pid, text)
        else:
            logger.error(
                "Process %r pid:%r exited with %r%s%s",
                child.name,
                child.pid,
                text,
                f" while running task {crasher.label}" if crasher is not None else "",
                f"; its crash report:\n{_excerpt(report)}" if report else "",
            )
        if not child.ready and not expected:
            self.failures += 1
        for job in child.jobs.values():
            self.running -= 1
            job.cancel_timers()
            if not job.done:
                job.done = True
                lost = f"Worker exited prematurely: {text} Job: {job.id}."
                if crasher is not None and job is not crasher:
                    error = WorkerLostError(
                        f"{lost} Task {crasher.label} took its process down", bystander=True
                    )
                else:
                    error = WorkerLostError(lost)
                _call(job.error_callback, error)
        child.jobs.clear()
        self.share()
        self.maintain()
        self._check_stopped()
        self._check_finished()
        self.dispatch()


def _report_room(fd: int) -> None:
    """Make the crash report's pipe hold a long report, and never block the crashing process
    (what does not fit is lost)."""
    os.set_blocking(fd, False)
    try:
        import fcntl

        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, 1 << 20)
    except (ImportError, AttributeError, OSError):
        pass  # the default size (64 KiB on Linux) holds the report of a few threads


def _read_report(fd: int, limit: int = 1 << 20) -> bytes:
    """What a dead process's faulthandler wrote (nothing for a process that did not crash)."""
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        try:
            data = os.read(fd, 1 << 16)
        except (BlockingIOError, OSError):
            break
        if not data:
            break
        chunks.append(data)
        size += len(data)
    return b"".join(chunks)


def _excerpt(report: bytes, lines: int = 40) -> str:
    """The report's first line and the crashing thread's stack (the other threads' are left out)."""
    text = report.decode("utf-8", "replace").rstrip().splitlines()
    current = next((index for index, line in enumerate(text) if line.startswith("Current thread")), None)
    if current is not None:
        end = next((index for index in range(current, len(text)) if not text[index].strip()), len(text))
        text = text[:1] + text[current:end]
    return "\n".join(text[:lines] + ([f"... ({len(text) - lines} more lines)"] if len(text) > lines else []))


def _call(callback: Callable[..., Any] | None, *args: Any) -> None:
    if callback is None:
        return
    try:
        callback(*args)
    except Exception:
        logger.exception("asyncio pool: callback %r raised; the pool carries on", callback)
