"""The worker under test: one ``workerctl worker`` process at a time, started again (a new generation)
after it is killed, with its pool children found through /proc."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from workers import children_of  # tests/workers.py

__all__ = ["Fleet"]

APPS = Path(__file__).resolve().parent.parent / "apps"


class Fleet:
    """Starts the worker, kills it (and its children) with SIGKILL, and notices when it exits
    without being told to (a crash)."""

    def __init__(self, args: Sequence[str], env: Mapping[str, str], logdir: Path) -> None:
        self.args = list(args)
        self.env = dict(env)
        self.logdir = logdir
        self.generation = 0
        self.process: subprocess.Popen[bytes] | None = None
        #: (generation, exit status) of every worker that exited on its own
        self.crashes: list[tuple[int, int]] = []

    def log_path(self, generation: int) -> Path:
        return self.logdir / f"worker-{generation}.log"

    def start(self) -> None:
        self.generation += 1
        env = dict(self.env, SOAK_GENERATION=str(self.generation), PYTHONUNBUFFERED="1",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(APPS), self.env.get("PYTHONPATH")])))
        with self.log_path(self.generation).open("wb") as log:
            self.process = subprocess.Popen([sys.executable, "-m", "worker_core", "worker", *self.args],
                                            cwd=APPS, env=env, stdout=log, stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def children(self) -> list[int]:
        return children_of(self.process.pid) if self.alive() and self.process is not None else []

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def check(self) -> bool:
        """Start the worker again if it exited by itself; True when that happened (a crash)."""
        if self.process is None or self.process.poll() is None:
            return False
        self.crashes.append((self.generation, self.process.returncode))
        self.start()
        return True

    def kill_child(self, pid: int) -> bool:
        try:
            os.kill(pid, signal.SIGKILL)
            return True
        except ProcessLookupError:
            return False

    def kill(self) -> None:
        """SIGKILL the worker and every child it has (no warm anything)."""
        if self.process is None:
            return
        for child in children_of(self.process.pid):
            self.kill_child(child)
        self.process.kill()
        self.process.wait()

    def stop(self, timeout: float = 60.0) -> int | None:
        """Warm shutdown (SIGTERM); the exit status, or None if it had to be killed."""
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process is not None else None
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGUSR1)  # soak_app dumps every thread's stack to the log
            time.sleep(1)
            self.kill()
            return None

    def logs(self) -> str:
        return "".join(self.log_path(g).read_text(errors="replace")
                       for g in range(1, self.generation + 1) if self.log_path(g).exists())
