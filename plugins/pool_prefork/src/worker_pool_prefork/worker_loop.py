"""What a pool child runs: read job frames, run each, write back ACK and RESULT/ERROR frames.

Each job is claimed before it starts (:mod:`.claims`): one the parent took back meanwhile, to
give it to an idle child, is skipped. The child's pipes are blocking (only the parent must never
block): it sleeps in ``read()`` until the parent sends a job, and a full result pipe simply holds
it until the parent reads.
"""

from __future__ import annotations

import logging
import os
import pickle
import traceback
from collections.abc import Callable, Sequence
from time import monotonic

from worker_core.exceptions import PoolError

from . import frames
from .child_setup import SignalSlot, prepare_child
from .claims import Claims
from .memory import ResidentMemory

logger = logging.getLogger("worker.pool")

__all__ = ["EX_INIT_FAILED", "EX_PARENT_GONE", "ChildConfig", "child_main"]

#: Exit status of a child whose initializer raised.
EX_INIT_FAILED = 3
#: Exit status of a child that found its parent gone (broken result pipe).
EX_PARENT_GONE = 4

_READ_SIZE = 1 << 16
_dumps = pickle.dumps
_loads = pickle.loads
_PROTOCOL = pickle.HIGHEST_PROTOCOL
_ACK_HEADER = frames.HEADER.pack
_ACK_SIZE = frames.ACK_TIME.size
_ACK = frames.ACK
_ACK_TIME = frames.ACK_TIME.pack


class ChildConfig:
    """Everything a child needs, handed over by fork (nothing here is pickled)."""

    __slots__ = (
        "batch",
        "claims",
        "close_fds",
        "finalizer",
        "initializer",
        "job_fd",
        "max_memory_kib",
        "max_tasks",
        "name",
        "parent_pid",
        "result_fd",
        "slot",
    )

    def __init__(self, name: str, parent_pid: int, job_fd: int, result_fd: int, close_fds: Sequence[int],
                 slot: SignalSlot, claims: Claims, initializer: Callable[[], None] | None,
                 max_tasks: int | None, max_memory_kib: int | None, batch: bool,
                 finalizer: Callable[[int], None] | None = None) -> None:
        self.name = name
        self.parent_pid = parent_pid
        self.job_fd = job_fd
        self.result_fd = result_fd
        self.close_fds = close_fds
        self.slot = slot
        self.claims = claims
        self.initializer = initializer
        self.finalizer = finalizer
        self.max_tasks = max_tasks
        self.max_memory_kib = max_memory_kib
        #: run under SCHED_BATCH (``--child-scheduler``)
        self.batch = batch


def child_main(config: ChildConfig) -> None:
    """The billiard ``Process`` target of every pool child."""
    prepare_child(config.parent_pid, config.slot, config.close_fds, batch=config.batch)
    _WorkLoop(config).run()
    finalizer = config.finalizer
    if finalizer is not None:
        # The child ends as it should (retired, shrunk, the pool stopping): no process killed
        # by a signal or a time limit gets here.
        try:
            finalizer(0)
        except Exception:
            logger.exception("prefork pool: the pool finalizer raised in %s pid:%s", config.name, os.getpid())


class _WorkLoop:
    def __init__(self, config: ChildConfig) -> None:
        self.config = config
        self.slot = config.slot
        self.claims = config.claims
        self.result_fd = config.result_fd
        self.done = 0
        self.memory = ResidentMemory() if config.max_memory_kib else None

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view:
                # Blocking pipe: a short count only happens when a signal interrupts a large write.
                view = view[os.write(self.result_fd, view):]
        except BrokenPipeError:
            raise SystemExit(EX_PARENT_GONE) from None

    def run(self) -> None:
        initializer = self.config.initializer
        if initializer is not None:
            try:
                initializer()
            except BaseException:
                trace = traceback.format_exc().encode("utf-8", "replace")
                self.send(frames.encode(frames.INIT_FAILED, 0, trace))
                raise SystemExit(EX_INIT_FAILED) from None
        self.send(frames.encode(frames.READY))
        reader = frames.FrameReader()
        read = os.read
        fd = self.config.job_fd
        claim = self.claims.claim
        while True:
            data = read(fd, _READ_SIZE)
            if not data:
                return  # the parent closed our job pipe (or died): nothing more will come
            for kind, job_id, payload in reader.feed(data):
                if kind == frames.JOB:
                    # a job the parent took back (to another child) is skipped without a word
                    if claim(job_id) and self.run_job(job_id, payload):
                        return
                elif kind == frames.STOP:
                    return

    def run_job(self, job_id: int, payload: bytes) -> bool:
        """Run one job and report it; True when this child must now retire."""
        slot = self.slot
        self.send(_ACK_HEADER(_ACK_SIZE, _ACK, job_id) + _ACK_TIME(monotonic()))
        try:
            try:
                slot.running = job_id
                target, args, kwargs = _loads(payload)
                retval = target(*args, **kwargs) if kwargs else target(*args)
            finally:
                # The soft-limit handler only raises while this is set; a SIGUSR1 landing inside
                # this finally is caught by the outer handler like any other task error.
                slot.running = 0
                self.claims.finished()
        except Exception as exc:
            out = self.error_frame(job_id, exc)
        else:
            try:
                out = frames.encode(frames.RESULT, job_id, _dumps(retval, _PROTOCOL))
            except Exception as exc:
                out = self.error_frame(job_id, PoolError(
                    f"the result of job {job_id} in {self.config.name} (pid {os.getpid()}) cannot be "
                    f"pickled back to the worker: {exc!r} (result type {type(retval).__name__}); "
                    "return plain data (str, int, float, list, dict, ...)"
                ))
        self.done += 1
        reason = self.retire_reason()
        if reason is not None:
            # One write for both frames, so the parent learns of the retirement with the result.
            out += frames.encode(frames.RETIRE, job_id, reason.encode())
        self.send(out)
        return reason is not None

    def retire_reason(self) -> str | None:
        config = self.config
        if config.max_tasks is not None and self.done >= config.max_tasks:
            return f"max-tasks-per-child reached ({self.done} tasks)"
        if self.memory is not None and config.max_memory_kib is not None:
            used = self.memory.kib()
            if used > config.max_memory_kib:
                return f"max-memory-per-child exceeded ({used} KiB resident > {config.max_memory_kib} KiB)"
        return None

    def error_frame(self, job_id: int, exc: BaseException) -> bytes:
        note = f"(raised in pool child {self.config.name}, pid {os.getpid()})\n{traceback.format_exc()}"
        add_note = getattr(exc, "add_note", None)
        if add_note is not None:
            add_note(note)
        try:
            return frames.encode(frames.ERROR, job_id, _dumps(exc, _PROTOCOL))
        except Exception as pickling_error:
            substitute = PoolError(
                f"job {job_id} in {self.config.name} (pid {os.getpid()}) raised {exc!r}, which cannot be "
                f"pickled back to the worker ({pickling_error!r}); raise picklable exceptions\n{note}"
            )
            return frames.encode(frames.ERROR, job_id, _dumps(substitute, _PROTOCOL))
