"""How the benchmark tasks report to the driver, the same way under every worker.

A no-op task only counts itself: each process and thread adds one to its own 8-byte counter in a
shared memory file in ``BENCH_COUNT_DIR`` (no system call per task), which the driver sums. The
latency and sleep tasks send one UDP datagram each (no round trip) to ``BENCH_SINK_PORT``.
"""

from __future__ import annotations

import mmap
import os
import socket
import threading
import time

_socket: socket.socket | None = None
_local = threading.local()


def _forget() -> None:  # a forked child has its own socket and counters
    global _socket, _local
    _socket = None
    _local = threading.local()


os.register_at_fork(after_in_child=_forget)


def _counter() -> memoryview:
    path = os.path.join(os.environ["BENCH_COUNT_DIR"], f"{os.getpid()}-{threading.get_ident()}")
    with open(path, "w+b") as file:
        file.write(bytes(8))
        file.flush()
        view = memoryview(mmap.mmap(file.fileno(), 8)).cast("Q")
    _local.count = view
    return view


def send(payload: bytes) -> None:
    global _socket
    if _socket is None:
        _socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    _socket.sendto(payload, ("127.0.0.1", int(os.environ["BENCH_SINK_PORT"])))


def noop() -> None:
    count = getattr(_local, "count", None) or _counter()
    count[0] += 1


#: what a real-body task works on: a small JSON document, as a task's arguments often are
_DOCUMENT = {"order": 1234,
             "lines": [{"sku": f"item-{n}", "quantity": n, "price": n * 1.25} for n in range(40)]}


def work() -> None:
    """A real body (one to two milliseconds of CPU on the benchmark machine: JSON, hashing),
    then counted as a no-op task is."""
    import hashlib
    import json

    text = json.dumps(_DOCUMENT)
    digest = b""
    for _ in range(5):
        digest = hashlib.sha256(text.encode() + digest).digest()
        json.loads(text)
    noop()


def latency(sent_at: float) -> None:
    # the task's start time; the driver knows when it sent the message
    send(b"l%.9f" % time.time())


def sleep(seconds: float) -> None:
    time.sleep(seconds)
    send(b"n")
