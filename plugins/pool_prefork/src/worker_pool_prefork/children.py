"""A child process as the parent sees it, and forking one."""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Sequence
from time import monotonic
from typing import TYPE_CHECKING, Any

from worker_core.exceptions import PoolError

from .child_setup import SignalSlot
from .claims import Claims
from .frames import FrameReader
from .worker_loop import ChildConfig, child_main

if TYPE_CHECKING:
    from .drivers import TimerHandle
    from .jobs import Job

__all__ = ["Child", "fork_child"]


class Child:
    """One ``ForkPoolWorker-N``: its pipes, the jobs written to it (oldest first), its state."""

    __slots__ = (
        "claims",
        "controlled",
        "doomed",
        "eof",
        "exitcode",
        "forked_at",
        "forker",
        "idle_listed",
        "init_failed",
        "job_fd",
        "jobs",
        "kill_at",
        "kill_timer",
        "name",
        "outbuf",
        "pid",
        "process",
        "reader",
        "ready",
        "reap_timer",
        "reap_tries",
        "reaped",
        "result_fd",
        "retiring",
        "sent",
        "slot",
        "stop_sent",
        "writes",
    )

    def __init__(self, name: str, process: Any, job_fd: int, result_fd: int, slot: SignalSlot,
                 claims: Claims) -> None:
        self.name = name
        self.process = process
        self.pid: int = process.pid
        self.job_fd = job_fd  # parent's write end, non-blocking
        self.result_fd = result_fd  # parent's read end, non-blocking
        self.reader = FrameReader()
        self.slot = slot
        self.claims = claims
        #: Jobs written (or being written) to this child and not finished; jobs[0] runs first.
        self.jobs: deque[Job] = deque()
        #: Bytes of frames the pipe did not take yet.
        self.outbuf = bytearray()
        self.ready = False  # sent READY: its initializer ran
        self.retiring = False  # said it exits (max tasks/memory) or was asked to (shrink)
        self.doomed = False  # being killed (hard time limit, terminate_job, terminate)
        self.stop_sent = False  # got a STOP frame (warm stop or shrink)
        self.eof = False  # its result pipe reached EOF: it exited or is exiting
        self.reaped = False
        self.controlled = False  # we killed it on purpose: its death is not an error
        self.init_failed = False
        self.sent = 0  # jobs written, for the max-tasks budget
        self.writes = 0
        self.forked_at = monotonic()
        #: The thread that forked it: on Linux the child gets SIGKILL when that thread ends.
        self.forker = threading.get_ident()
        self.idle_listed = False
        self.reap_timer: TimerHandle | None = None
        self.kill_timer: TimerHandle | None = None
        self.kill_at: float | None = None
        self.reap_tries = 0
        self.exitcode: int | None = None

    def takes_jobs(self, max_tasks: int | None) -> bool:
        return (self.ready and not (self.retiring or self.doomed or self.stop_sent or self.eof)
                and (max_tasks is None or self.sent < max_tasks))

    @property
    def live(self) -> bool:
        """Counts toward the pool's size: not on its way out."""
        return not (self.retiring or self.doomed or self.stop_sent or self.eof)

    def __repr__(self) -> str:
        return f"<Child {self.name} pid:{self.pid} jobs={len(self.jobs)}{' ready' if self.ready else ''}>"


def fork_child(context: Any, number: int, *, inherited: Sequence[int], initializer: Callable[[], None] | None,
               max_tasks: int | None, max_memory_kib: int | None, batch: bool,
               finalizer: Callable[[int], None] | None = None) -> Child:
    """Fork ``ForkPoolWorker-<number>`` with its own job and result pipes.

    ``inherited`` are the parent-side fds of the other children, which the new child closes.
    """
    job_r, job_w = os.pipe()
    result_r, result_w = os.pipe()
    slot = SignalSlot()
    claims = Claims()
    name = f"ForkPoolWorker-{number}"
    try:
        # The parent never blocks on a child: both of its ends are non-blocking. The child's ends
        # stay blocking (set per open file description, so the two sides do not share the flag).
        os.set_blocking(job_w, False)
        os.set_blocking(result_r, False)
        config = ChildConfig(name, os.getpid(), job_r, result_w, [*inherited, job_w, result_r], slot,
                             claims, initializer, max_tasks, max_memory_kib, batch, finalizer)
        process = context.Process(target=child_main, args=(config,), name=name)
        process.daemon = True
        process.start()
    except BaseException as exc:
        for fd in (job_r, job_w, result_r, result_w):
            os.close(fd)
        slot.close()
        claims.close()
        if isinstance(exc, OSError):
            raise PoolError(f"prefork pool: cannot fork {name}: {exc}; check the process and memory "
                            "limits (ulimit -u, available memory)") from exc
        raise
    os.close(job_r)
    os.close(result_w)
    return Child(name, process, job_w, result_r, slot, claims)
