"""Decoding the content header of every delivered message, with fewer Python calls.

A Celery message carries about twenty headers in its ``application_headers`` table. py-amqp
decodes a table item by item through a generic reader that converts each type letter and each
string with a helper call: 15 us per message, an eighth of the worker's main process time on
RabbitMQ. Here the types a task message uses (long strings, void, booleans, 32-bit integers,
tables, arrays) are read inline (8 us) and every other type goes to py-amqp's own item reader
(:func:`.internals.read_item`), so the values are exactly py-amqp's. Text that is not UTF-8, a
header that fails to decode here, or one holding a rarer type while py-amqp's item reader is not
to be used, is decoded again by py-amqp from the start: its bytes, and its errors for malformed
frames, are kept.

:class:`FrameHandler` is py-amqp's frame dispatcher (``Connection(frame_handler=...)``) using
this decoder for the content header of ``basic`` class messages, and handing a delivered message
to the connection whole, without py-amqp's message object in between (see :mod:`.channel`).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from amqp.basic_message import Message
from amqp.exceptions import UnexpectedFrame
from amqp.serialization import PROPERTY_CLASSES, decode_properties_basic
from amqp.spec import Basic

from .internals import read_item

__all__ = ["BASIC_DELIVER", "Content", "FrameHandler", "UnreadableProperties", "content_of",
           "decode_basic_properties", "decode_properties", "deliver_arguments"]

_UINT = struct.Struct(">I").unpack_from
_INT = struct.Struct(">i").unpack_from
_METHOD = struct.Struct(">HH").unpack_from
_FLAGS = struct.Struct(">H").unpack_from
_ULONGLONG = struct.Struct(">Q").unpack_from
_CONTENT_HEADER = struct.Struct(">HxxQ").unpack_from  # class id, (weight), body size

_LONG_STRING, _VOID, _BOOL, _INT32, _TABLE, _ARRAY = b"SVtIFA"

BASIC_DELIVER: tuple[int, int] = Basic.Deliver

#: Methods followed by a content header and body (as py-amqp lists them).
CONTENT_METHODS = frozenset({Basic.Return, Basic.Deliver, Basic.GetOk})


def _value(buf: bytes, offset: int) -> tuple[Any, int]:
    """One table or array item; text that is not UTF-8 raises (py-amqp then decodes it)."""
    kind = buf[offset]
    if kind == _LONG_STRING:
        start = offset + 5
        end = start + _UINT(buf, offset + 1)[0]
        return buf[start:end].decode("utf-8", "surrogatepass"), end
    if kind == _VOID:
        return None, offset + 1
    if kind == _TABLE:
        return _table(buf, offset + 1)
    if kind == _BOOL:
        return buf[offset + 1] != 0, offset + 2
    if kind == _INT32:
        return _INT(buf, offset + 1)[0], offset + 5
    if kind == _ARRAY:
        end = offset + 5 + _UINT(buf, offset + 1)[0]
        offset += 5
        items = []
        while offset < end:
            item, offset = _value(buf, offset)
            items.append(item)
        return items, offset
    return read_item(buf, offset)  # other types: py-amqp's reader (else its decoder, from the start)


def _table(buf: bytes, offset: int) -> tuple[dict[Any, Any], int]:
    end = offset + 4 + _UINT(buf, offset)[0]
    offset += 4
    table: dict[Any, Any] = {}
    while offset < end:
        start = offset + 1
        offset = start + buf[offset]
        key = buf[start:offset].decode("utf-8", "surrogatepass")
        kind = buf[offset]
        # the common kinds inline, the rest through _value
        if kind == _LONG_STRING:
            start = offset + 5
            offset = start + _UINT(buf, offset + 1)[0]
            table[key] = buf[start:offset].decode("utf-8", "surrogatepass")
        elif kind == _VOID:
            table[key] = None
            offset += 1
        else:
            table[key], offset = _value(buf, offset)
    return table, offset


#: The ``basic`` class's short-string properties, by flag bit, in the three runs the other
#: properties (headers, delivery mode and priority; timestamp) separate.
_FIRST_STRINGS = ((0x8000, "content_type"), (0x4000, "content_encoding"))
_SHORT_STRINGS = ((0x0400, "correlation_id"), (0x0200, "reply_to"), (0x0100, "expiration"),
                  (0x0080, "message_id"))
_LAST_STRINGS = ((0x0020, "type"), (0x0010, "user_id"), (0x0008, "app_id"), (0x0004, "cluster_id"))


def _short_strings(buf: bytes, offset: int, flags: int, names: tuple[tuple[int, str], ...],
                   properties: dict[str, Any]) -> int:
    for bit, name in names:
        if flags & bit:
            start = offset + 1
            offset = start + buf[offset]
            properties[name] = buf[start:offset].decode("utf-8", "surrogatepass")
    return offset


def _properties(buf: bytes, offset: int) -> tuple[dict[str, Any], int]:
    flags = _FLAGS(buf, offset)[0]
    offset += 2
    properties: dict[str, Any] = {}
    offset = _short_strings(buf, offset, flags, _FIRST_STRINGS, properties)
    if flags & 0x2000:
        properties["application_headers"], offset = _table(buf, offset)
    if flags & 0x1000:
        properties["delivery_mode"] = buf[offset]
        offset += 1
    if flags & 0x0800:
        properties["priority"] = buf[offset]
        offset += 1
    offset = _short_strings(buf, offset, flags, _SHORT_STRINGS, properties)
    if flags & 0x0040:
        properties["timestamp"] = _ULONGLONG(buf, offset)[0]
        offset += 8
    offset = _short_strings(buf, offset, flags, _LAST_STRINGS, properties)
    return properties, offset


def decode_basic_properties(buf: bytes, offset: int) -> tuple[dict[str, Any], int]:
    """The ``basic`` class properties at ``offset``, exactly as py-amqp decodes them."""
    try:
        return _properties(buf, offset)
    except Exception:
        return decode_properties_basic(buf, offset)  # type: ignore[no-any-return]


class UnreadableProperties(dict[str, Any]):
    """The properties of a delivered message whose content header could not be decoded: none,
    and why (the channel hands the message to the consumer as one to reject)."""

    def __init__(self, reason: str) -> None:
        super().__init__()
        self.reason = reason


class Content(Message):  # type: ignore[misc]
    """py-amqp's message, for the methods py-amqp's own code handles (see :class:`FrameHandler`)."""


def content_of(method: tuple[int, int], args: bytes, properties: dict[str, Any], body: Any) -> Content:
    """py-amqp's message for a content-carrying method, its decoded properties and its body."""
    content = Content(frame_method=method, frame_args=args)
    content.properties = properties
    content.body = body
    content.body_size = content.body_received = len(body)
    content.ready = True
    return content


def decode_properties(class_id: int, buf: bytes, offset: int) -> dict[str, Any]:
    """A content header's properties: ``basic`` ones here, any other class as py-amqp does."""
    if class_id == Basic.CLASS_ID:
        return decode_basic_properties(buf, offset)[0]
    return PROPERTY_CLASSES[class_id](buf, offset)[0]  # type: ignore[no-any-return]  # (KeyError as py-amqp)


def deliver_arguments(payload: bytes) -> tuple[str, int, bool, str, str]:
    """``basic.deliver``'s arguments (consumer tag, delivery tag, redelivered, exchange, routing
    key) read straight from the method frame, as py-amqp's generic reader reads them."""
    size = payload[4]
    offset = 5 + size
    consumer_tag = payload[5:offset].decode("utf-8", "surrogatepass")
    delivery_tag = _ULONGLONG(payload, offset)[0]
    redelivered = payload[offset + 8] & 1 == 1
    offset += 9
    size = payload[offset]
    offset += 1
    exchange = payload[offset:offset + size].decode("utf-8", "surrogatepass")
    offset += size
    size = payload[offset]
    offset += 1
    routing_key = payload[offset:offset + size].decode("utf-8", "surrogatepass")
    return consumer_tag, delivery_tag, redelivered, exchange, routing_key


class _Arriving:
    """A content-carrying method whose header and body frames are still arriving."""

    __slots__ = ("args", "chunks", "method", "properties", "received", "size")

    def __init__(self, method: tuple[int, int], args: bytes) -> None:
        self.method = method
        self.args = args
        self.properties: dict[str, Any] = {}
        self.size = self.received = 0
        self.chunks: list[bytes] = []


class FrameHandler:
    """py-amqp's frame dispatcher (``Connection(frame_handler=FrameHandler)``), gathering
    content-carrying methods with their header and body.

    A method frame is handed to ``callback`` at once unless a content header and body follow;
    those are gathered per channel and handed over whole: a ``basic.deliver`` to
    ``connection.on_delivery(channel, arguments, properties, body)`` if the connection has one
    (the message is built once, by whoever consumes it), anything else to ``callback`` with
    py-amqp's message (:func:`content_of`). Heartbeats only count as traffic.
    """

    __slots__ = ("_arriving", "_callback", "_connection", "_deliver", "_expected")

    def __init__(self, connection: Any, callback: Callable[..., Any]) -> None:
        self._connection = connection
        self._callback = callback
        self._deliver = getattr(connection, "on_delivery", None)
        self._expected: dict[int, int] = {}
        self._arriving: dict[int, _Arriving] = {}

    @property
    def receiving(self) -> bool:
        """True while a channel has a method whose content header or body frames are still to
        come (the next frame on that channel must be one of them)."""
        return bool(self._arriving)

    def __call__(self, frame: tuple[int, int, bytes]) -> bool:
        """Handle one frame; True if it completed a method (with its content, if any)."""
        kind, channel, buf = frame
        self._connection.bytes_recv += 1
        if kind == 8:
            return False
        expected = self._expected
        want = expected.get(channel, 1)
        if kind != want:
            raise UnexpectedFrame(f"Received frame {kind} while expecting type: {want}")
        if kind == 1:
            method = _METHOD(buf, 0)
            if method in CONTENT_METHODS:
                self._arriving[channel] = _Arriving(method, buf)
                expected[channel] = 2
                return False
            self._callback(channel, method, buf, None)
            return True
        content = self._arriving[channel]
        body: Any
        if kind == 2:
            class_id, size = _CONTENT_HEADER(buf, 0)
            try:
                content.properties = decode_properties(class_id, buf, 12)
            except Exception as exc:
                if content.method != BASIC_DELIVER:
                    raise
                # A publisher's malformed properties (RabbitMQ passes text that is not UTF-8
                # through): the delivery goes on, to be rejected with the reason, instead of the
                # error stopping the connection and the message coming back after every restart.
                content.properties = UnreadableProperties(
                    f"its properties cannot be decoded ({type(exc).__name__}: {exc})")
            if size:
                content.size = size
                expected[channel] = 3
                return False
            body = ""  # py-amqp's body for a message without one
        else:
            content.received += len(buf)
            if content.received < content.size:
                content.chunks.append(buf)
                return False
            body = b"".join((*content.chunks, buf)) if content.chunks else buf
        expected[channel] = 1
        del self._arriving[channel]
        if self._deliver is not None and content.method == BASIC_DELIVER:
            self._deliver(channel, content.args, content.properties, body)
        else:
            self._callback(channel, content.method, content.args,
                           content_of(content.method, content.args, content.properties, body))
        return True
