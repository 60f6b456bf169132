"""Broker faults the tests control: a private redis-server on a free port, and (from
:mod:`worker_core.testing.proxy`) a TCP proxy in front of a shared broker that can cut, blackhole
and restore connections."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from worker_core.testing.proxy import TcpProxy

__all__ = ["RedisServer", "TcpProxy", "answers", "free_port"]


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

    def __init__(self, directory: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.directory = directory
        self.process: subprocess.Popen[bytes] | None = None
        if shutil.which("redis-server") is None:
            raise RuntimeError("redis-server is not installed")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.directory)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while not answers(self.port):
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError(f"redis-server on port {self.port} did not start")
            time.sleep(0.02)
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
