"""Broker faults the tests control: a private redis-server on a free port, (from
:mod:`worker_core.testing.proxy`) a TCP proxy in front of a shared broker that can cut, blackhole
and restore connections, and a wall clock of a worker's own that a test steps (libfaketime)."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path

from workers import wait_for

from worker_core.testing.proxy import TcpProxy

__all__ = ["FakeClock", "RedisServer", "TcpProxy", "answers", "free_port"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def answers(port: int, host: str = "127.0.0.1") -> bool:
    try:
        socket.create_connection((host, port), 0.5).close()
        return True
    except OSError:
        return False


class RedisServer:
    """A redis-server of our own (never the shared one), stopped by its PID."""

    def __init__(self, directory: Path, port: int | None = None, *, password: str | None = None) -> None:
        self.port = port or free_port()
        self.directory = directory
        #: ``requirepass``: clients must give it (none by default)
        self.password = password
        self.process: subprocess.Popen[bytes] | None = None
        if shutil.which("redis-server") is None:
            raise RuntimeError("redis-server is not installed")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.directory),
             *(["--requirepass", self.password] if self.password else [])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

        def started() -> bool:
            if self.process is None or self.process.poll() is not None:  # the port was taken meanwhile
                raise RuntimeError(f"redis-server on port {self.port} exited at start")
            return answers(self.port)

        wait_for(started, message=f"redis-server on port {self.port} to start")
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None


#: libfaketime 0.9.10 with FAKETIME_DONT_FAKE_MONOTONIC fails every clock_nanosleep on the
#: monotonic clock with EINVAL (Python's time.sleep): this one, preloaded first, makes those the
#: plain system call (the monotonic clock is not faked anyway) and leaves the others to libfaketime.
_SLEEP_SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int clock_nanosleep(clockid_t clock, int flags, const struct timespec *request, struct timespec *remain) {
    if (clock == CLOCK_MONOTONIC)
        return syscall(SYS_clock_nanosleep, clock, flags, request, remain) == 0 ? 0 : errno;
    int (*next)(clockid_t, int, const struct timespec *, struct timespec *) =
        dlsym(RTLD_NEXT, "clock_nanosleep");
    return next(clock, flags, request, remain);
}
"""


def _missing(what: str) -> None:
    import pytest  # (here: the soak in bench/ uses this module too)

    if os.environ.get("CI"):
        pytest.fail(f"{what} and CI is set")
    pytest.skip(what)


class FakeClock:
    """A wall clock for the processes given :meth:`env` (libfaketime, Debian's ``faketime``): as
    far ahead of the real one as :meth:`set` says, from the moment it says so. Their monotonic
    clock is the real one. Skips without libfaketime or a C compiler, except in CI where that is a
    failure."""

    def __init__(self, directory: Path, offset: float = 0) -> None:
        found = sorted(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1"))
        if not found:
            _missing("libfaketime is not installed (apt-get install faketime)")
        compiler = shutil.which("cc") or shutil.which("gcc")
        if compiler is None:
            _missing("no C compiler (cc) to build the sleep shim libfaketime needs")
        self.library = found[0]
        source, self.shim = directory / "sleep_shim.c", directory / "sleep_shim.so"
        source.write_text(_SLEEP_SHIM)
        subprocess.run([str(compiler), "-shared", "-fPIC", "-O2", "-o", str(self.shim), str(source), "-ldl"],
                       check=True, capture_output=True, timeout=120)
        self.path = directory / "faketime"
        self.set(offset)

    def set(self, offset: float) -> None:
        """From now on the clock is ``offset`` seconds ahead of the real one (behind when negative)."""
        temporary = self.path.with_suffix(".new")
        temporary.write_text(f"{offset:+.0f}\n")
        temporary.replace(self.path)  # (read whole by the processes, never half written)

    def env(self) -> dict[str, str]:
        return {"LD_PRELOAD": f"{self.shim} {self.library}", "FAKETIME_TIMESTAMP_FILE": str(self.path),
                "FAKETIME_NO_CACHE": "1", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
