"""py-amqp's own frame handling and kombu's own channel and message, as the transport runs them
when its fast paths are off, through public hooks only.

py-amqp raises on a content header it cannot decode (a publisher's text that is not UTF-8,
which RabbitMQ passes through): the error stops the connection, and the message comes back after
every reconnect. :func:`frame_handler` wraps py-amqp's: such a header of a ``basic.deliver`` is
handed to py-amqp again without its properties, and the message reaches kombu carrying the
reason (:class:`~.decoding.UnreadableProperties`), which :class:`Message` turns into a message
to reject.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from amqp import method_framing
from amqp.exceptions import UnexpectedFrame
from kombu.transport import pyamqp as _pyamqp

from worker_core.exceptions import ProtocolError

from .decoding import BASIC_DELIVER, UnreadableProperties

__all__ = ["Message", "StockChannel", "frame_handler"]

# kombu is not annotated: its module is typed as Any here, once.
pyamqp: Any = _pyamqp

_DELIVER = struct.pack(">HH", *BASIC_DELIVER)
#: a content header's class id, weight and body size, before its property flags
_HEADER_START = 12


def frame_handler(connection: Any, callback: Callable[..., Any]) -> Callable[[tuple[int, int, bytes]], Any]:
    """py-amqp's frame handler (``Connection(frame_handler=...)``), except that a delivered
    message whose properties cannot be decoded is delivered without them, with the reason."""
    unreadable: dict[int, str] = {}
    methods: dict[int, bytes] = {}

    def on_content(channel: int, method: Any, args: Any, content: Any) -> Any:
        reason = unreadable.pop(channel, None)
        if reason is not None and content is not None:
            content.properties = UnreadableProperties(reason)
        return callback(channel, method, args, content)

    handle = method_framing.frame_handler(connection, on_content)

    def on_frame(frame: tuple[int, int, bytes]) -> Any:
        kind, channel, buf = frame
        if kind == 1:
            methods[channel] = buf[:4]
        try:
            return handle(frame)
        except UnexpectedFrame:
            raise
        except Exception as exc:
            if kind != 2 or methods.get(channel) != _DELIVER or len(buf) < _HEADER_START:
                raise
            # py-amqp failed on the properties, after the sizes: its message waits for them
            unreadable[channel] = f"its properties cannot be decoded ({type(exc).__name__}: {exc})"
            return handle((2, channel, buf[:_HEADER_START] + b"\x00\x00"))

    return on_frame


class Message(pyamqp.Message):  # type: ignore[misc]
    """kombu's message for a py-amqp delivery; one whose properties could not be decoded carries
    the reason in ``errors`` (kombu's consumer hands it to the worker's decode-error callback)."""

    def __init__(self, msg: Any, channel: Any = None, **kwargs: Any) -> None:
        properties = getattr(msg, "properties", None)
        if isinstance(properties, UnreadableProperties):
            self.errors = [(ProtocolError, ProtocolError(properties.reason), None)]
        super().__init__(msg, channel, **kwargs)


class StockChannel(pyamqp.Channel):  # type: ignore[misc]
    """kombu's py-amqp channel, building :class:`Message`."""

    Message = Message
