"""The wire between the worker and a loop process: pickled messages, length-prefixed, over pipes.

A message is ``(kind, job_id, payload)``; what is read is parsed incrementally (a reader keeps a
partial message for the next read), and what is written goes out in batches: many messages in
one ``write``.
"""

from __future__ import annotations

import pickle
import struct
from typing import Any

__all__ = [
    "ACCEPTED",
    "CANCEL",
    "ERROR",
    "INIT_FAILED",
    "JOB",
    "READY",
    "RESULT",
    "STALLED",
    "STOP",
    "STUCK",
    "TERMINATE",
    "TIMEOUT",
    "FrameReader",
    "Message",
    "encode",
]

_LENGTH = struct.Struct(">I")

# worker -> loop process
JOB = 1  #: payload: ``(target, args, kwargs, soft, hard)``
CANCEL = 2  #: payload: the signal number (None: SIGTERM); stop the running job
STOP = 3  #: take no more jobs; exit once every running job has finished
TERMINATE = 4  #: cancel every running job and exit now

# loop process -> worker
READY = 10  #: the initializer ran; the process takes jobs
ACCEPTED = 11  #: payload: the process's ``time.monotonic()`` when the job started
RESULT = 12  #: payload: the target's return value
ERROR = 13  #: payload: the exception the target raised (or that ended it)
TIMEOUT = 14  #: payload: ``(soft, seconds)``: a time limit of the job passed
STUCK = 15  #: payload: seconds since the job was cancelled, still running (it ignores cancellation)
STALLED = 16  #: payload: ``(task label or None, seconds, over)``: the loop did not turn (a blocking call)
INIT_FAILED = 17  #: payload: the initializer's traceback; the process exits

#: ``(kind, job_id, payload)``
Message = tuple[int, int, Any]


def encode(kind: int, job_id: int = 0, payload: Any = None) -> bytes:
    """One message, ready to write (raises what pickling raises)."""
    data = pickle.dumps((kind, job_id, payload), protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(data)) + data


class FrameReader:
    """Turns bytes read from a pipe, in chunks of any size, back into messages."""

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, data: bytes) -> list[Message]:
        if self._pending:
            data = self._pending + data
        messages: list[Message] = []
        pos, end, size = 0, len(data), _LENGTH.size
        loads, unpack = pickle.loads, _LENGTH.unpack_from
        while end - pos >= size:
            (length,) = unpack(data, pos)
            stop = pos + size + length
            if stop > end:
                break
            messages.append(loads(data[pos + size : stop]))
            pos = stop
        self._pending = data[pos:] if pos < end else b""
        return messages
