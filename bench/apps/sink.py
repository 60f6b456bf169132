"""A UDP side channel from tasks to the benchmark driver: one datagram per task, no round trip,
the same cost under both workers."""

from __future__ import annotations

import os
import socket
import time

_socket: socket.socket | None = None
_pid = 0


def _sink() -> tuple[str, int]:
    return ("127.0.0.1", int(os.environ["BENCH_SINK_PORT"]))


def send(payload: bytes) -> None:
    global _socket, _pid
    if _socket is None or _pid != os.getpid():  # one socket per process, also after fork
        _socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        _pid = os.getpid()
    _socket.sendto(payload, _sink())


def noop() -> None:
    send(b"n")


def latency(sent_at: float) -> None:
    # the task's start time; the driver knows when it sent the message
    send(b"l%.9f" % time.time())


def sleep(seconds: float) -> None:
    time.sleep(seconds)
    send(b"n")
