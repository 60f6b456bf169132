"""Turning a freshly forked process into a pool child: parent-death signal, signals, descriptors.

Signals, decided so that **the parent decides** what happens to a running task:

- ``SIGINT`` and ``SIGQUIT`` are ignored. A Ctrl-C or Ctrl-\\ in the terminal goes to the whole
  process group; the worker's own handler turns it into a warm or cold shutdown, which either
  lets the task finish or terminates the child itself. Without this, Ctrl-C would kill every
  task mid-way before the parent chose warm shutdown.
- ``SIGTERM`` kills the child only when the parent sent it (for a hard time limit,
  ``terminate_job`` and ``terminate()``; the job then fails with ``WorkerLostError``): the parent
  marks the child's slot first (:meth:`SignalSlot.mean_term`), and the child then dies of the
  signal at once, as with its default action. Any other ``SIGTERM`` is logged and ignored: a
  service manager that signals every process of the service at once (systemd's default
  ``KillMode=control-group``) reaches the parent too, whose warm shutdown lets the running task
  finish instead of losing it. ``SIGKILL`` still kills a child at once.
- ``SIGUSR1`` raises ``SoftTimeLimitExceeded`` inside the task, but only if the parent aimed it
  at the job running now (see :class:`SignalSlot`): a signal that races with the end of a job
  never hits the next one.
- Every other signal the parent handled in Python (the worker's shutdown and reload handlers)
  goes back to its default action, and the parent's ``set_wakeup_fd`` is dropped, so a signal
  sent to the child never runs the parent's logic or wakes the parent's loop.
"""

from __future__ import annotations

import gc
import logging
import mmap
import os
import signal
import struct
import sys
from collections.abc import Iterable
from types import FrameType

import billiard.exceptions

from worker_core import exceptions

__all__ = ["SignalSlot", "prepare_child"]

logger = logging.getLogger("worker.pool")


class SoftTimeLimitExceeded(
    exceptions.SoftTimeLimitExceeded, billiard.exceptions.SoftTimeLimitExceeded,  # type: ignore[misc]
):
    """Raised inside a task past its soft time limit: the core's exception, and billiard's, which
    Celery's ``celery.exceptions.SoftTimeLimitExceeded`` is, so a Celery task's ``except`` of it
    catches it as under Celery's prefork pool. It travels (results, pickles) as billiard's."""


SoftTimeLimitExceeded.__module__ = "billiard.exceptions"


_SLOT = struct.Struct("=Qd")
_TERM = struct.Struct("=B")
_TERM_AT = _SLOT.size


class SignalSlot:
    """A few bytes of memory shared by the parent and one child (mapped before the fork), saying
    what the parent's signals to the child mean.

    For a soft time limit the parent writes the id of the job it means and the limit, then
    sends ``SIGUSR1``; the child raises only if that job is the one it is running, and reads the
    seconds for the exception's message. Before a ``SIGTERM`` the parent marks the slot, so the
    child tells the parent's ``SIGTERM`` from anyone else's. ``kill()`` cannot carry data, this
    can.
    """

    __slots__ = ("_map", "running")

    def __init__(self) -> None:
        self._map = mmap.mmap(-1, _TERM_AT + _TERM.size)
        #: The job the child runs now (child side; 0 when idle). Job ids start at 1.
        self.running = 0

    def aim(self, job_id: int, seconds: float) -> None:
        """Parent side: the next ``SIGUSR1`` is for ``job_id``."""
        _SLOT.pack_into(self._map, 0, job_id, seconds)

    def target(self) -> tuple[int, float]:
        job_id, seconds = _SLOT.unpack_from(self._map, 0)
        return int(job_id), float(seconds)

    def mean_term(self) -> None:
        """Parent side: the ``SIGTERM`` about to be sent is the parent's; the child dies of it."""
        _TERM.pack_into(self._map, _TERM_AT, 1)

    def term_meant(self) -> bool:
        return bool(_TERM.unpack_from(self._map, _TERM_AT)[0])

    def close(self) -> None:
        self._map.close()


def _set_parent_death_signal() -> None:
    if not sys.platform.startswith("linux"):
        return  # elsewhere the child exits on EOF of its job pipe when the parent is gone
    try:
        from billiard.util import set_pdeathsig

        set_pdeathsig(signal.SIGKILL)
    except OSError as exc:
        logger.warning("could not set the parent-death signal of pool child %s: %s", os.getpid(), exc)


def _reset_signals(slot: SignalSlot) -> None:
    try:
        signal.set_wakeup_fd(-1)
    except ValueError:
        pass  # not the main thread: there is no wakeup fd to drop
    for signum in signal.valid_signals():
        try:
            handler = signal.getsignal(signum)
        except (OSError, ValueError):
            continue
        if callable(handler):
            try:
                signal.signal(signum, signal.SIG_DFL)
            except (OSError, ValueError, RuntimeError):
                pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "SIGQUIT"):
        signal.signal(signal.SIGQUIT, signal.SIG_IGN)

    def on_term(signum: int, frame: FrameType | None) -> None:
        if slot.term_meant():
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)  # dies of it, as the parent expects
            return
        logger.warning("Pool child %s ignored a SIGTERM the worker did not send: the worker's own "
                       "shutdown stops it after its task (SIGKILL kills it now)", os.getpid())

    signal.signal(signal.SIGTERM, on_term)

    def on_soft_limit(signum: int, frame: FrameType | None) -> None:
        job_id, seconds = slot.target()
        if slot.running and slot.running == job_id:
            raise SoftTimeLimitExceeded(seconds)

    signal.signal(signal.SIGUSR1, on_soft_limit)


def _use_batch_scheduling() -> None:
    """SCHED_BATCH (see :mod:`.plugin`): woken by a job, this child does not preempt the
    process running on its CPU; it keeps its share of the CPU otherwise."""
    batch = getattr(os, "SCHED_BATCH", None)
    if batch is None:
        return
    try:
        os.sched_setscheduler(0, batch, os.sched_param(0))
    except OSError as exc:
        logger.debug("pool child %s keeps the normal CPU policy: %s", os.getpid(), exc)


def prepare_child(parent_pid: int, slot: SignalSlot, close_fds: Iterable[int], *, batch: bool) -> None:
    """Run first thing in the child, before the initializer."""
    _set_parent_death_signal()
    if os.getppid() != parent_pid:
        # The parent died between fork() and prctl(): the death signal will never come.
        os._exit(1)
    for fd in close_fds:
        # The parent's ends of every pipe, ours and our siblings': holding a sibling's job pipe
        # would hide that sibling's EOF, and holding our own would hide the parent's death.
        try:
            os.close(fd)
        except OSError:
            pass
    _reset_signals(slot)
    # What the child inherited is the parent's, shared page by page until written: frozen, the
    # child's own collections never write to it. The collector may have been off in the parent
    # while the worker started (children fork before it consumes); the child collects its own.
    gc.freeze()
    gc.enable()
    if batch:
        _use_batch_scheduling()
    try:
        # Let tasks start their own billiard processes (Celery's children are daemonic, and
        # "daemonic processes are not allowed to have children").
        from billiard import current_process

        current_process().daemon = False
    except (AssertionError, ImportError):
        pass
