"""The wire format between the parent and a child: length-prefixed frames over a pipe.

A frame is a 13-byte header ``(payload length: u32, kind: u8, job id: u64)``, big-endian, then
the payload. The header is fixed-size so a reader can parse a stream incrementally, reading
whatever the pipe has and keeping a partial frame for the next read; the job id travels in the
header so control frames (ready, ack, stop) need no pickling at all.
"""

from __future__ import annotations

import struct

__all__ = [
    "ACK",
    "ACK_TIME",
    "ERROR",
    "HEADER",
    "INIT_FAILED",
    "JOB",
    "KIND_NAMES",
    "READY",
    "RESULT",
    "RETIRE",
    "STOP",
    "Frame",
    "FrameReader",
    "encode",
]

HEADER = struct.Struct(">IBQ")
#: Payload of an ACK frame: the child's ``time.monotonic()`` when the job started.
ACK_TIME = struct.Struct(">d")

# parent -> child
JOB = 1  #: payload: pickled ``(target, args, kwargs-or-None)``; run unless taken back (see claims)
STOP = 2  #: finish what was sent before, then exit cleanly

# child -> parent
READY = 10  #: the initializer ran; the child takes jobs
ACK = 11  #: the job in the header started running (payload: ACK_TIME)
RESULT = 12  #: payload: the pickled return value
ERROR = 13  #: payload: the pickled exception the target raised
RETIRE = 14  #: the child exits after this (payload: the reason, UTF-8); later jobs were not read
INIT_FAILED = 15  #: the initializer raised (payload: the traceback, UTF-8); the child exits

KIND_NAMES = {
    JOB: "JOB", STOP: "STOP", READY: "READY", ACK: "ACK", RESULT: "RESULT", ERROR: "ERROR",
    RETIRE: "RETIRE", INIT_FAILED: "INIT_FAILED",
}

#: ``(kind, job_id, payload)``
Frame = tuple[int, int, bytes]

_MAX_PAYLOAD = 0xFFFFFFFF


def encode(kind: int, job_id: int = 0, payload: bytes = b"") -> bytes:
    """One frame, ready to write."""
    if len(payload) > _MAX_PAYLOAD:
        raise ValueError(
            f"a prefork frame holds at most 4 GiB; got {len(payload)} bytes for "
            f"{KIND_NAMES.get(kind, kind)} frame of job {job_id}: send smaller arguments or results"
        )
    return HEADER.pack(len(payload), kind, job_id) + payload


class FrameReader:
    """Turns the bytes read from a pipe, in chunks of any size, back into frames."""

    __slots__ = ("_need", "_pending")

    def __init__(self) -> None:
        # Bytes of an incomplete frame, and how many bytes we need before parsing again: a big
        # frame arriving in 64 KiB reads is appended, not re-parsed (or re-copied) every time.
        self._pending = bytearray()
        self._need = 0

    @property
    def pending(self) -> int:
        """Bytes held of a frame not complete yet."""
        return len(self._pending)

    def feed(self, data: bytes) -> list[Frame]:
        """Complete frames found in what was read so far, in order."""
        if self._pending:
            self._pending += data
            if len(self._pending) < self._need:
                return []
            data = bytes(self._pending)
            self._pending = bytearray()
        frames: list[Frame] = []
        unpack = HEADER.unpack_from
        size_header = HEADER.size
        pos = 0
        end = len(data)
        while end - pos >= size_header:
            size, kind, job_id = unpack(data, pos)
            start = pos + size_header
            stop = start + size
            if stop > end:
                self._need = stop - pos
                break
            frames.append((kind, job_id, data[start:stop]))
            pos = stop
        else:
            self._need = size_header
        if pos < end:
            self._pending = bytearray(data[pos:]) if pos else bytearray(data)
        return frames
