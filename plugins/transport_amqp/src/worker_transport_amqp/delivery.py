"""A delivered message taken from the read buffer in one call, instead of frame by frame.

:func:`next_delivery` is the C extension's (``_speedups``, about ten times faster) when it was
built and ``WORKER_NO_EXTENSIONS`` is not set, else :func:`next_delivery_python`: the same
results from the decoders the frame handler uses (:mod:`.decoding`), except that the C version
also leaves to the frame handler headers holding a 'D' (decimal) or 'T' (timestamp) item, or
tables and arrays nested deeper than :data:`MAX_DEPTH`.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from typing import Any

from amqp.spec import Basic

from .decoding import BASIC_DELIVER, decode_basic_properties, deliver_arguments

__all__ = ["MAX_DEPTH", "Delivery", "next_delivery", "next_delivery_python"]

#: ``(end, channel_id, method_payload, consumer_tag, delivery_tag, redelivered, exchange,
#: routing_key, properties, body, frame_count)``: ``end`` is the offset just past the message's
#: last frame, ``body`` is bytes, or ``""`` for an empty one (py-amqp's)
Delivery = tuple[int, int, bytes, str, int, bool, str, str, dict[str, Any], Any, int]

#: tables and arrays nested deeper than this are left to Python by the C version
MAX_DEPTH = 64

_FRAME = struct.Struct(">BHI").unpack_from
_METHOD = struct.Struct(">HH").unpack_from
_CONTENT_HEADER = struct.Struct(">HxxQ").unpack_from  # class id, (weight), body size
_FRAME_END = 0xCE


def _arguments_end(payload: bytes) -> int:
    """Where ``basic.deliver``'s arguments end (consumer tag, tag and bit, exchange, routing key)."""
    exchange = 14 + payload[4]
    routing_key = exchange + 1 + payload[exchange]
    return routing_key + 1 + payload[routing_key]


def next_delivery_python(buffer: bytes) -> Delivery | None:
    """The ``basic.deliver`` at the start of ``buffer``, method, content header and body frames
    (see :data:`Delivery`); None unless all of them are there and well formed, the header is of
    the ``basic`` class, the body frames add up to its size, and every frame's payload is read
    to its last byte. None leaves the frames to the frame handler, one at a time."""
    size = len(buffer)
    if size < 8:
        return None
    kind, channel, length = _FRAME(buffer, 0)
    end = 7 + length
    if kind != 1 or length < 4 or end >= size or buffer[end] != _FRAME_END:
        return None
    payload = buffer[7:end]
    if _METHOD(payload, 0) != BASIC_DELIVER:
        return None
    start = end + 1
    if size - start < 8:
        return None
    kind, header_channel, length = _FRAME(buffer, start)
    end = start + 7 + length
    if kind != 2 or header_channel != channel or length < 12 or end >= size or buffer[end] != _FRAME_END:
        return None
    header = buffer[start + 7:end]
    class_id, body_size = _CONTENT_HEADER(header, 0)
    if class_id != Basic.CLASS_ID:
        return None
    frames = 2
    chunks = []
    received = 0
    while received < body_size:
        start = end + 1
        if size - start < 8:
            return None
        kind, body_channel, length = _FRAME(buffer, start)
        end = start + 7 + length
        if kind != 3 or body_channel != channel or end >= size or buffer[end] != _FRAME_END:
            return None
        chunks.append(buffer[start + 7:end])
        received += length
        frames += 1
    if received != body_size:
        return None
    try:
        if _arguments_end(payload) != len(payload):
            return None
        arguments = deliver_arguments(payload)
        properties, offset = decode_basic_properties(header, 12)
    except Exception:  # py-amqp's error, raised again when the frame handler takes the frames
        return None
    if offset != len(header):
        return None
    body: Any = "" if not body_size else chunks[0] if len(chunks) == 1 else b"".join(chunks)
    return (end + 1, channel, payload, *arguments, properties, body, frames)


next_delivery: Callable[[bytes], Delivery | None] = next_delivery_python
if os.environ.get("WORKER_NO_EXTENSIONS", "") in ("", "0"):
    try:
        from ._speedups import next_delivery
    except ImportError:  # built without a compiler: the Python version
        pass
