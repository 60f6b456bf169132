"""kombu's py-amqp channel and connection with deliveries handed over whole
(:class:`DeliveringChannel`) and acknowledgements written in batches (:class:`Channel`).

A delivered message the frame handler gathered (:mod:`.decoding`) or the reader took whole
(:mod:`.delivery`) becomes kombu's message in one step, without py-amqp's message in between.

Acknowledging every message with its own ``basic.ack`` frame costs a socket write each (and
RabbitMQ a wakeup). This channel keeps the delivery tags in delivery order, remembers which were
acknowledged, and sends one ``basic.ack(multiple=True)`` for the acknowledged prefix and single
acks for the rest. A tag is never covered by a multiple ack unless it was acknowledged itself, so
unacknowledged messages (``acks_late`` tasks still running, prefetched ones not started) stay
unacknowledged.

When they go out: once half the prefetch window is acknowledged, before the next delivered
message is handled or when the event-loop turn ends, whichever comes first (the broker refills
that half while the rest is worked on; a worker running tasks inline acknowledges two messages
of a window of four, and the broker sends two more while it runs the next two); when the turn
ends with the window full (the broker sends nothing more until it hears of one); under an event
loop, at the latest :data:`ACK_HOLD` seconds after the first one was held (a timer the loop arms
through :attr:`Connection.on_ack_held`: the queue ran dry); and at once before a drain, a
reject, a QoS change or a close.

Holding an acknowledgement while the window still has room costs nothing: the broker sends the
messages that fill it without waiting, and their acknowledgements go out together. Sending them
whenever every delivered message is acknowledged would have the broker answer each lone
acknowledgement with one message: one socket read and one loop turn per message.
"""

from __future__ import annotations

import logging
import struct
import sys
from collections import deque
from collections.abc import Callable
from typing import Any

from amqp.exceptions import RecoverableConnectionError
from kombu import message as kombu_message
from kombu.transport import pyamqp as _pyamqp

from worker_core.exceptions import ProtocolError

from . import internals, stock
from .decoding import BASIC_DELIVER, FrameHandler, UnreadableProperties, content_of, deliver_arguments
from .delivery import Delivery
from .reading import BufferedTCPTransport, dispatch_frames

__all__ = ["ACK_HOLD", "Channel", "Connection", "DeliveredMessage", "DeliveringChannel", "ReadingConnection",
           "StockConnection", "channel_class", "connection_class"]

#: a ``basic.ack`` method frame: type 1, channel, size 13, class 60, method 80, delivery tag,
#: the ``multiple`` bit, frame end
_ACK_FRAME = struct.Struct(">BHIHHQBB").pack

#: the longest an acknowledgement waits for others to go out with it (seconds)
ACK_HOLD = 0.05

pyamqp: Any = _pyamqp

logger = logging.getLogger(__name__)

LOST = ("Could not acknowledge %d message(s): %s; RabbitMQ delivers them again (tasks that "
        "already ran may run twice)")


class DeliveredMessage(pyamqp.Message):  # type: ignore[misc]
    """kombu's message for a delivery, made from its decoded parts (see :meth:`Channel.deliver`)."""

    def __init__(self, channel: Any, body: Any, properties: dict[str, Any],
                 delivery_info: dict[str, Any]) -> None:
        if isinstance(properties, UnreadableProperties):
            # kombu's consumer hands it to the worker's decode-error callback, which rejects it
            self.errors = [(ProtocolError, ProtocolError(properties.reason), None)]
        kombu_message.Message.__init__(
            self, body=body, channel=channel, delivery_tag=delivery_info["delivery_tag"],
            content_type=properties.get("content_type"), content_encoding=properties.get("content_encoding"),
            delivery_info=delivery_info, properties=properties,
            headers=properties.get("application_headers") or {},
        )


class DeliveringChannel(stock.StockChannel):
    """kombu's py-amqp channel, taking deliveries whole (see the module docstring)."""

    #: whether deliveries are noted for batched acknowledgements (see :class:`Channel`)
    notes_deliveries = False

    def on_delivery(self, payload: bytes, properties: dict[str, Any], body: Any) -> Any:
        """A ``basic.deliver`` and its message, from the frame handler: :meth:`deliver` with
        the method's arguments read from its payload."""
        try:
            consumer_tag, delivery_tag, redelivered, exchange, routing_key = deliver_arguments(payload)
        except (IndexError, struct.error):
            return dispatch_as_py_amqp(self, payload, properties, body)  # raises py-amqp's error
        return self.deliver(payload, consumer_tag, delivery_tag, redelivered, exchange, routing_key,
                            properties, body)

    def deliver(self, payload: bytes, consumer_tag: str, delivery_tag: int, redelivered: bool, exchange: str,
                routing_key: str, properties: dict[str, Any], body: Any) -> Any:
        """A ``basic.deliver`` (its method payload and its arguments) and its message, decoded:
        kombu's message is built from them and handed to the consumer's callback (py-amqp's
        generic dispatch builds its own message first, then kombu copies it into one of its
        own). Anything unusual takes py-amqp's path."""
        if self.is_closing or internals.awaited(self, BASIC_DELIVER):
            return dispatch_as_py_amqp(self, payload, properties, body)
        callback = self.callbacks.get(consumer_tag)
        if callback is None:  # py-amqp warns and gives it back
            return dispatch_as_py_amqp(self, payload, properties, body)
        if self.notes_deliveries:
            if len(self._acked) >= self._ack_batch:
                self.flush_acks()  # before this message is worked on (see the module's docstring)
            if consumer_tag not in self.no_ack_consumers:
                self._delivered.append(delivery_tag)
        if self.auto_decode and "content_encoding" in properties:
            try:
                body = body.decode(properties["content_encoding"])
            except Exception:
                pass  # as py-amqp: the body stays bytes
        delivery_info = {"consumer_tag": consumer_tag, "delivery_tag": delivery_tag,
                         "redelivered": redelivered, "exchange": exchange, "routing_key": routing_key}
        callback(DeliveredMessage(self, body, properties, delivery_info))
        return None

    def message_to_python(self, raw_message: Any) -> Any:
        """kombu's message: the one :meth:`deliver` built, or one made from py-amqp's."""
        if isinstance(raw_message, DeliveredMessage):
            return raw_message
        return super().message_to_python(raw_message)


class Channel(internals.DeliverHooks, DeliveringChannel):
    """The same, acknowledging in batches (see the module docstring)."""

    notes_deliveries = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._delivered: deque[int] = deque()
        self._acked: set[int] = set()
        self._ack_batch = 1  # how many make a batch: half the prefetch window (see basic_qos)
        self._window = 1  # the prefetch window: unacknowledged messages the broker sends at most

    def note_delivery(self, consumer_tag: str, delivery_tag: int) -> None:
        """A delivery py-amqp dispatches (:class:`~.internals.DeliverHooks`)."""
        if consumer_tag not in self.no_ack_consumers:
            self._delivered.append(delivery_tag)

    def basic_ack(self, delivery_tag: int, multiple: bool = False, argsig: str = "Lb") -> Any:
        if multiple or delivery_tag not in self._delivered or self.connection is None:
            # (on a channel that is gone, py-amqp raises and the caller reports it)
            self.flush_acks()
            return super().basic_ack(delivery_tag, multiple)
        acked = self._acked
        if not acked and self.connection.on_ack_held is not None:
            self.connection.on_ack_held()
        acked.add(delivery_tag)
        return None

    def flush_acks_due(self) -> None:
        """Send the gathered acknowledgements if a batch is complete (see the module's docstring)."""
        acked = self._acked
        if acked and (len(acked) >= self._ack_batch or len(self._delivered) >= self._window):
            self.flush_acks()

    def flush_acks(self) -> None:
        """Send the acknowledgements gathered since the last flush."""
        acked = self._acked
        if not acked:
            return
        delivered = self._delivered
        count = len(acked)
        top: int | None = None
        if count == len(delivered):  # all acknowledged (acked <= delivered): one multiple ack
            top = delivered[-1]
            delivered.clear()
            acked.clear()
        while delivered and delivered[0] in acked:
            top = delivered.popleft()
            acked.discard(top)
        try:
            if top is not None:
                self._write_ack(top, True)
            for tag in sorted(acked):
                delivered.remove(tag)
                self._write_ack(tag, False)
        except Exception as exc:
            logger.error(LOST, count, f"sending the acknowledgements failed ({exc!r})")
            raise
        finally:
            acked.clear()

    def _write_ack(self, delivery_tag: int, multiple: bool) -> None:
        """``basic.ack`` packed in one call and written (py-amqp's generic method writer takes
        about 3 us per frame, this 0.1 us)."""
        connection = self.connection
        transport = connection.transport if connection is not None else None
        if transport is None:
            raise RecoverableConnectionError("connection already closed")
        transport.write(_ACK_FRAME(1, self.channel_id, 13, 60, 80, delivery_tag, multiple, 0xCE))
        connection.bytes_sent += 1

    def abandon_acks(self) -> int:
        """Forget the acknowledgements not sent yet (the connection is gone). Returns how many."""
        count = len(self._acked)
        self._acked.clear()
        self._delivered.clear()
        return count

    def _forget(self, delivery_tag: int) -> None:
        self.flush_acks()
        try:
            self._delivered.remove(delivery_tag)
        except ValueError:
            pass

    def basic_reject(self, delivery_tag: int, requeue: bool = True, argsig: str = "Lb") -> Any:
        self._forget(delivery_tag)
        return super().basic_reject(delivery_tag, requeue)

    def basic_recover(self, requeue: bool = False) -> Any:
        self.flush_acks()
        self._delivered.clear()
        return super().basic_recover(requeue)

    def basic_qos(self, prefetch_size: int, prefetch_count: int, a_global: bool, argsig: str = "lBb") -> Any:
        self.flush_acks()
        # no limit: the broker never waits for acknowledgements, a batch can be larger
        self._ack_batch = max(1, prefetch_count // 2) if prefetch_count else 64
        self._window = prefetch_count or sys.maxsize
        return super().basic_qos(prefetch_size, prefetch_count, a_global)

    def close(self, *args: Any, **kwargs: Any) -> Any:
        if self.is_open and self.connection is not None and self.connection.connected:
            try:
                self.flush_acks()
            except Exception:
                pass  # reported by flush_acks; the connection is going
        return super().close(*args, **kwargs)


def dispatch_as_py_amqp(channel: Any, payload: bytes, properties: dict[str, Any], body: Any) -> Any:
    """Hand a delivery to py-amqp's generic dispatch, with py-amqp's message."""
    content = content_of(BASIC_DELIVER, payload, properties, body)
    return channel.dispatch_method(BASIC_DELIVER, payload, content)


def _open_channels(connection: Any) -> list[Channel]:
    # After collect() (a dropped connection) there are no channels left.
    return [channel for channel in (connection.channels or {}).values()
            if isinstance(channel, Channel) and channel.is_open]


def channel_class() -> type[stock.StockChannel]:
    """The channel the fast paths on in this process allow."""
    decision = internals.current()
    if "acks" in decision:
        return Channel
    return DeliveringChannel if "delivery" in decision else stock.StockChannel


class StockConnection(pyamqp.Connection):  # type: ignore[misc]
    """kombu's py-amqp connection, on py-amqp's frame handler (:func:`.stock.frame_handler`)."""

    Channel = stock.StockChannel

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("frame_handler", self.chosen_frame_handler())
        super().__init__(*args, **kwargs)
        self.Channel = channel_class()

    def chosen_frame_handler(self) -> Any:
        return stock.frame_handler


class Connection(StockConnection):
    """The same, feeding the fast paths that are on (:mod:`.internals`)."""

    #: called when a channel starts holding acknowledgements (none were held): an event loop
    #: arms a timer that sends them within :data:`ACK_HOLD` seconds
    on_ack_held: Callable[[], None] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: whether a delivery whose frames have all arrived is taken whole (:mod:`.reading`)
        self.takes_whole_deliveries = "whole" in internals.current()

    def chosen_frame_handler(self) -> Any:
        # faster content headers and whole messages (:mod:`.decoding`)
        return FrameHandler if "delivery" in internals.current() else stock.frame_handler

    def on_delivery(self, channel_id: int, payload: bytes, properties: dict[str, Any], body: Any) -> None:
        """A whole delivered message from the frame handler (:class:`.decoding.FrameHandler`)."""
        if self.channels is None:
            raise RecoverableConnectionError("Connection already closed")
        channel = self.channels[channel_id]
        if isinstance(channel, DeliveringChannel):
            channel.on_delivery(payload, properties, body)
        else:
            dispatch_as_py_amqp(channel, payload, properties, body)

    def on_decoded_delivery(self, delivery: Delivery) -> None:
        """A delivered message taken whole from the read buffer (:func:`.delivery.next_delivery`)."""
        (_, channel_id, payload, consumer_tag, delivery_tag, redelivered, exchange, routing_key, properties,
         body, _) = delivery
        if self.channels is None:
            raise RecoverableConnectionError("Connection already closed")
        channel = self.channels[channel_id]
        if isinstance(channel, DeliveringChannel):
            channel.deliver(payload, consumer_tag, delivery_tag, redelivered, exchange, routing_key,
                            properties, body)
        else:
            dispatch_as_py_amqp(channel, payload, properties, body)

    def dispatch_buffered(self) -> None:
        """Handle the whole frames left in the read buffer by a blocking read (py-amqp waiting
        for a reply reads ahead too), which the event loop would not report as readable."""
        transport = self.transport
        if not isinstance(transport, BufferedTCPTransport) or not transport.buffered:
            return
        dispatch_frames(self, sys.maxsize)

    def flush_acks(self) -> None:
        for channel in _open_channels(self):
            channel.flush_acks()

    def flush_acks_due(self) -> None:
        for channel in _open_channels(self):
            channel.flush_acks_due()

    def collect(self) -> None:
        """Drop a lost connection, saying how many acknowledgements it could not send."""
        lost = sum(channel.abandon_acks() for channel in list((self.channels or {}).values())
                   if isinstance(channel, Channel))
        if lost:
            logger.error(LOST, lost, "the connection was lost before they were sent")
        super().collect()


class ReadingConnection(Connection):
    """The same over the buffered reader (:mod:`.reading`) on plain TCP."""

    def Transport(self, host: str, connect_timeout: float | None, ssl: Any = False,
                  read_timeout: float | None = None, write_timeout: float | None = None,
                  socket_settings: Any = None, **kwargs: Any) -> Any:
        """py-amqp's transport; over plain TCP, one that reads ahead (:mod:`.reading`)."""
        if ssl:
            return super().Transport(host, connect_timeout, ssl, read_timeout, write_timeout,
                                     socket_settings, **kwargs)
        return BufferedTCPTransport(host, connect_timeout=connect_timeout, read_timeout=read_timeout,
                                    write_timeout=write_timeout, socket_settings=socket_settings, **kwargs)


def connection_class() -> type[StockConnection]:
    """The connection the fast paths on in this process allow."""
    decision = internals.current()
    if "reader" in decision:
        return ReadingConnection
    if "delivery" in decision or "acks" in decision:
        return Connection
    return StockConnection
