"""How the sleep benchmark's tasks report to the driver, the same way under every worker: one
byte appended to ``BENCH_MARK_DIR/started`` as a task starts and one to ``.../done`` as it ends
(``O_APPEND`` writes of one byte: atomic, whichever process or thread writes); the driver reads
the files' sizes."""

from __future__ import annotations

import os

_fds: dict[str, int] = {}


def _fd(name: str) -> int:
    fd = _fds.get(name)
    if fd is None:
        fd = _fds[name] = os.open(os.path.join(os.environ["BENCH_MARK_DIR"], name),
                                  os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    return fd


def started() -> None:
    os.write(_fd("started"), b"s")


def done() -> None:
    os.write(_fd("done"), b"d")


os.register_at_fork(after_in_child=_fds.clear)
