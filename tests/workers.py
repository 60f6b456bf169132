"""Helpers for tests that drive real workers: starting and stopping ``workerctl worker``
processes, waiting for a condition, and asking a worker a remote-control question."""

from __future__ import annotations

import os
import signal as signals
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from worker_core.control.client import broadcast

if TYPE_CHECKING:
    from worker_core import App

TESTS = Path(__file__).resolve().parent

T = TypeVar("T")


def wait_for(condition: Callable[[], T], timeout: float = 10.0, interval: float = 0.02,
             message: str | Callable[[], str] = "condition",
             ignoring: tuple[type[BaseException], ...] = ()) -> T:
    """Call ``condition`` every ``interval`` seconds until it returns something true, and return
    that. After ``timeout`` seconds fail with ``message`` (what was awaited; a callable is asked
    then, to tell what it saw) and the last value seen. An exception of a type in ``ignoring``
    counts as "not yet" (and is the one shown on timeout); any other exception propagates at
    once, so a condition can give up early."""
    deadline = time.monotonic() + timeout
    while True:
        error: BaseException | None = None
        try:
            value = condition()
        except ignoring as raised:
            error = raised
            last = f"it last raised {raised!r}"
        else:
            if value:
                return value
            last = f"it last returned {_short(value)}"
        if time.monotonic() > deadline:
            awaited = message() if callable(message) else message
            raise AssertionError(f"timed out after {timeout}s waiting for {awaited}; {last}") from error
        time.sleep(interval)  # the polling interval, between two looks at the condition


def _short(value: object, limit: int = 1000) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def ask(app: App, command: str, /, *, worker: str | None = None, sender: str | None = None,
        timeout: float = 5.0, **arguments: Any) -> Any:
    """Send the remote-control ``command`` with ``arguments`` and return the one answer: that of
    the worker named ``worker`` (its ``-n``), or of the first worker to answer. ``sender`` is who
    the worker is told asked (by default this process). Fails when no answer comes in ``timeout``
    seconds."""
    replies = broadcast(app, command, arguments, destination=[worker] if worker else None,
                        timeout=timeout, limit=1, sender=sender)
    assert len(replies) == 1, f"{command!r}: no answer within {timeout}s"
    [reply] = replies
    if worker is not None:
        assert worker in reply, f"{command!r}: answered by {list(reply)}, not {worker!r}"
        return reply[worker]
    [answer] = reply.values()
    return answer


class WorkerProcess:
    """A ``workerctl worker`` subprocess whose output goes to a log file."""

    program = ("-m", "worker_core", "worker")

    def __init__(self, args: Sequence[str], env: dict[str, str], log_path: Path, cwd: Path = TESTS) -> None:
        self.args = list(args)
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - stays open for the process's life; closed later
        self.process = subprocess.Popen(
            [sys.executable, *self.program, *self.args],
            cwd=cwd, env=env, stdout=self._log, stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def name(self) -> str:
        """The node name it was started with (``-n``)."""
        return str(self.args[self.args.index("-n") + 1])

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 20.0) -> WorkerProcess:
        def ready() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"worker exited with {self.process.returncode}:\n{self.log()}")
            return " ready." in self.log()

        wait_for(ready, timeout, message="the worker to be ready")
        return self

    def wait_log(self, text: str, timeout: float = 10.0) -> None:
        try:
            wait_for(lambda: text in self.log(), timeout, message=repr(text))
        except AssertionError:
            raise AssertionError(f"{text!r} not in the worker's log:\n{self.log()}") from None

    def signal(self, signum: int) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signum)

    def stop(self, signum: int = signals.SIGTERM, timeout: float = 30.0) -> int:
        self.signal(signum)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker did not stop within {timeout}s:\n{self.log()}") from None

    def crash(self) -> None:
        """SIGKILL the worker and its pool's processes at once, as a crash or a container's end
        does (its log stays readable)."""
        for pid in [*children_of(self.process.pid), self.process.pid]:
            try:
                os.kill(pid, signals.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait(timeout=10)

    def kill(self) -> None:
        """Make sure the worker and anything it started are gone (teardown)."""
        if self.process.poll() is None:
            for child in children_of(self.process.pid):
                try:
                    os.kill(child, signals.SIGKILL)
                except ProcessLookupError:
                    pass
            self.process.kill()
            self.process.wait(timeout=10)
        self._log.close()


class CeleryWorkerProcess(WorkerProcess):
    """A real ``celery worker`` (the celery package is a test dependency only)."""

    program = ("-m", "celery")


def drain(connection: Any, until: Callable[[], bool], timeout: float = 10.0,
          message: str | Callable[[], str] = "the events awaited") -> None:
    """Drain ``connection``'s events until ``until()`` holds; fail after ``timeout`` seconds."""
    def drained() -> bool:
        if until():
            return True
        try:
            connection.drain_events(timeout=0.2)
        except TimeoutError:
            pass
        return until()

    wait_for(drained, timeout, interval=0, message=message)


def children_of(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux /proc)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found.extend(int(child) for child in (task / "children").read_text().split())
        except OSError:
            continue
    return found
