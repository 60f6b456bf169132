"""Forking a loop process, and what the new process does first: its parent-death signal, its
signals and the descriptors it must not hold.

Signals, decided so that **the worker decides** what happens to running tasks: ``SIGINT`` and
``SIGQUIT`` (a Ctrl-C in the terminal reaches the whole process group) and ``SIGTERM`` (a service
manager signalling every process of the service at once) are ignored, the last one with a log
line: the worker's own warm or cold shutdown then stops the loop process through its pipe. The
worker never signals it except with ``SIGKILL`` (a process that does not stop in time). Every
other signal the worker handled in Python goes back to its default action.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterable
from types import FrameType

__all__ = ["fork", "human_status", "prepare_child"]

logger = logging.getLogger("worker.pool")

_PR_SET_PDEATHSIG = 1


def human_status(status: int | None) -> str:
    """``'signal 9 (SIGKILL)'`` or ``'exitcode 1'``, from a ``waitpid`` status."""
    if status is None:
        return "an unknown status (reaped elsewhere)"
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            return f"signal {number} ({signal.Signals(number).name})"
        except ValueError:
            return f"signal {number}"
    return f"exitcode {os.WEXITSTATUS(status) if os.WIFEXITED(status) else status}"


def exitcode(status: int | None) -> int | None:
    """The status as ``multiprocessing`` gives it: the exit code, or minus the signal."""
    if status is None:
        return None
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else None


def fork(main: Callable[[], int]) -> int:
    """Fork; the child runs ``main()`` and exits with what it returns, never returning here."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        code = main()
    except BaseException:  # the last resort: say why, and never run the worker's code after fork
        try:
            logger.exception("asyncio pool: a loop process failed")
        except BaseException:
            pass
    finally:
        os._exit(code)


def _set_parent_death_signal() -> None:
    if not sys.platform.startswith("linux"):
        return  # elsewhere the process exits on EOF of its job pipe once the worker is gone
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    except (OSError, AttributeError) as exc:
        logger.warning("could not set the parent-death signal of loop process %s: %s", os.getpid(), exc)


def _reset_signals() -> None:
    try:
        signal.set_wakeup_fd(-1)
    except ValueError:
        pass
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
        logger.warning(
            "Loop process %s ignored a SIGTERM the worker did not send: the worker's own "
            "shutdown stops it after its tasks (SIGKILL kills it now)",
            os.getpid(),
        )

    signal.signal(signal.SIGTERM, on_term)


def prepare_child(parent_pid: int, close_fds: Iterable[int], name: str) -> None:
    """Run first thing in the child, before the initializer."""
    _set_parent_death_signal()
    if os.getppid() != parent_pid:
        os._exit(1)  # the worker died between fork() and prctl(): the signal will never come
    for fd in close_fds:
        # The worker's ends of every pipe, ours and our siblings': holding them would hide the
        # worker's death, or a sibling's.
        try:
            os.close(fd)
        except OSError:
            pass
    _reset_signals()
    # The worker's pool thread forked us from inside its event loop: that loop is not ours.
    asyncio.events._set_running_loop(None)
    multiprocessing = sys.modules.get("multiprocessing")
    if multiprocessing is not None:
        multiprocessing.current_process().name = name  # the %(processName)s of log lines
    gc.freeze()
    gc.enable()
