"""The workers under test: ``size`` ``workerctl worker`` processes at a time, each started again (a new
generation, numbered across the fleet) after it is killed, with their pool children found through
/proc."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from faults import FakeClock  # tests/faults.py
from workers import children_of  # tests/workers.py

__all__ = ["Fleet"]

APPS = Path(__file__).resolve().parent.parent / "apps"


class Fleet:
    """Starts the workers, kills one (and its children) with SIGKILL, stops one warmly, and notices
    when one exits without being told to (a crash).

    :param args: the worker's arguments; ``name`` (``{slot}`` in it becomes the worker's slot
        number) is added as ``-n``.
    """

    def __init__(self, args: Sequence[str], env: Mapping[str, str], logdir: Path, *, name: str,
                 size: int = 1, clocks: bool = False) -> None:
        self.args = list(args)
        self.env = dict(env)
        self.logdir = logdir
        self.name = name
        #: per slot: a wall clock of the worker's own that :meth:`set_clock` steps (libfaketime)
        self.clocks: list[FakeClock] = []
        if clocks:
            for index in range(size):
                directory = logdir / f"clock-{index}"
                directory.mkdir(exist_ok=True)
                self.clocks.append(FakeClock(directory))
        self._offsets = [0.0] * size
        #: the last generation started, in the whole fleet
        self.generation = 0
        #: per slot: the worker process and its generation
        self.processes: list[subprocess.Popen[bytes] | None] = [None] * size
        self.generations = [0] * size
        #: (generation, exit status) of every worker that exited on its own
        self.crashes: list[tuple[int, int]] = []

    @property
    def size(self) -> int:
        return len(self.processes)

    def log_path(self, generation: int) -> Path:
        return self.logdir / f"worker-{generation}.log"

    def start(self, slot: int | None = None) -> None:
        """Start the worker of ``slot`` (every slot when None) as a new generation."""
        for index in range(self.size) if slot is None else (slot,):
            self.generation += 1
            self.generations[index] = self.generation
            env = dict(self.env, SOAK_GENERATION=str(self.generation), PYTHONUNBUFFERED="1",
                       PYTHONPATH=os.pathsep.join(filter(None, [str(APPS), self.env.get("PYTHONPATH")])))
            if self.clocks:
                env.update(self.clocks[index].env())
            args = [*self.args, "-n", self.name.format(slot=index)]
            with self.log_path(self.generation).open("wb") as log:
                self.processes[index] = subprocess.Popen(
                    [sys.executable, "-m", "worker_core", "worker", *args],
                    cwd=APPS, env=env, stdout=log, stderr=subprocess.STDOUT)

    def pid(self, slot: int) -> int | None:
        process = self.processes[slot]
        return process.pid if process is not None else None

    def children(self, slot: int | None = None) -> list[int]:
        """Pool children of the worker of ``slot`` (of every worker when None)."""
        found: list[int] = []
        for index in range(self.size) if slot is None else (slot,):
            process = self.processes[index]
            if process is not None and process.poll() is None:
                found.extend(children_of(process.pid))
        return found

    def alive(self, slot: int) -> bool:
        process = self.processes[slot]
        return process is not None and process.poll() is None

    def check(self) -> bool:
        """Start again every worker that exited by itself; True when one did (a crash)."""
        crashed = False
        for index, process in enumerate(self.processes):
            if process is None or process.poll() is None:
                continue
            self.crashes.append((self.generations[index], process.returncode))
            self.start(index)
            crashed = True
        return crashed

    def kill_child(self, pid: int) -> bool:
        try:
            os.kill(pid, signal.SIGKILL)
            return True
        except ProcessLookupError:
            return False

    def kill(self, slot: int | None = None) -> None:
        """SIGKILL the worker of ``slot`` (every worker when None) and its children: no warm
        anything."""
        for index in range(self.size) if slot is None else (slot,):
            process = self.processes[index]
            if process is None:
                continue
            for child in children_of(process.pid):
                self.kill_child(child)
            process.kill()
            process.wait()

    def stop_all(self, slot: int) -> bool:
        """SIGSTOP the worker of ``slot`` and all its processes, as a paused VM; False if it is gone."""
        process = self.processes[slot]
        if process is None or process.poll() is not None:
            return False
        self._stopped = [process.pid, *children_of(process.pid)]
        for pid in self._stopped:
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
        return True

    def resume_all(self, slot: int) -> None:
        """SIGCONT what :meth:`stop_all` stopped."""
        for pid in getattr(self, "_stopped", []):
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self._stopped = []

    def clock_offset(self, slot: int) -> float | None:
        """How far ahead of the real one the wall clock of ``slot`` is (None: the real one, no fake)."""
        return self._offsets[slot] if self.clocks else None

    def set_clock(self, slot: int, offset: float) -> None:
        """Step the wall clock of ``slot``'s worker to ``offset`` seconds from the real one."""
        self.clocks[slot].set(offset)
        self._offsets[slot] = offset

    def terminate(self, slot: int) -> None:
        """SIGTERM the worker of ``slot``: a warm shutdown begins."""
        process = self.processes[slot]
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 60.0) -> int | None:
        """Warm shutdown (SIGTERM) of every worker; the worst exit status, or None if one had to
        be killed."""
        for index in range(self.size):
            self.terminate(index)
        statuses: list[int | None] = []
        deadline = time.monotonic() + timeout
        for index, process in enumerate(self.processes):
            if process is None:
                continue
            try:
                statuses.append(process.wait(timeout=max(deadline - time.monotonic(), 0.1)))
            except subprocess.TimeoutExpired:
                process.send_signal(signal.SIGUSR1)  # soak_app dumps every thread's stack to the log
                time.sleep(1)
                self.kill(index)
                statuses.append(None)
        if None in statuses:
            return None
        return max((status for status in statuses if status is not None), key=abs, default=0)

    def logs(self) -> str:
        return "".join(self.log_path(g).read_text(errors="replace")
                       for g in range(1, self.generation + 1) if self.log_path(g).exists())
