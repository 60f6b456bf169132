"""Every private name of py-amqp and kombu the AMQP transport uses, the checks that guard the
fast paths built on them, and the classes and functions through which the rest of the plugin
reaches them. Checked against py-amqp 5.4.2 and kombu 5.7.0 (the pins: ``amqp>=5.4.2,<5.5``,
``kombu>=5.7,<5.8``; py-amqp 5.3 decodes some headers otherwise than the decoders here).

==================================================  ==================================================
name                                                used for
==================================================  ==================================================
**the buffered reader** (``reader``)
``TCPTransport._setup_transport(self)``             overridden: ``recv`` asks for everything arrived
``TCPTransport._quick_recv``                        py-amqp's ``recv``, which ``_read`` calls
``TCPTransport._read_buffer``                       py-amqp's read-ahead buffer: whole frames are cut
                                                    from it, and its blocking reads take them first
``Connection.Transport(self, host, ...)``           overridden: the buffered transport over plain TCP
**the header decoder's reading of rarer types** (``decoder``)
``amqp.serialization._read_item(buf, offset)``      the rarer header types (decimals, timestamps,
                                                    floats, ...), read as py-amqp reads them
**direct delivery** (``delivery``)
``AbstractChannel._pending``                        a ``basic.deliver`` someone waits for (then py-amqp
                                                    dispatches it)
**taking whole deliveries** (``whole``)             only the names of ``reader`` and ``delivery``
**the acknowledgement batching** (``acks``)
``Channel._on_basic_deliver(self, consumer_tag,     overridden: notes each delivered tag (deliveries
delivery_tag, redelivered, exchange,                py-amqp dispatches)
routing_key, msg)``
**TLS** (no fast path: a failed check is an error)
``SSLTransport._wrap_socket_sni(self, sock, ...)``  its keywords are the SSL arguments the worker
                                                    passes (:mod:`.tls`)
==================================================  ==================================================

The public names each fast path overrides or feeds (``basic_ack``, ``basic_qos``, the
``frame_handler`` argument, kombu's ``Message``, ...) are checked with them, so a library that
changed them falls back as well; kombu's transport API every path overrides (``on_readable``,
``drain_events``, ``heartbeat_check``) has nothing to fall back to, and is bounded by the pins.
``decoder`` and ``whole`` work only with ``delivery``, ``whole`` only with ``reader`` too: the rest
falls back on its own.
"""

from __future__ import annotations

import logging
import socket
import struct
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import amqp as _amqp_package
import kombu as _kombu_package
from amqp import abstract_channel as _abstract_channel
from amqp import method_framing as _method_framing
from amqp import serialization as _serialization
from amqp import transport as _amqp_transport
from amqp.exceptions import UnexpectedFrame
from kombu import message as _kombu_message
from kombu.transport import pyamqp as _pyamqp

from worker_core.fastpaths import FastPath, FastPaths, Library, reads, signature

__all__ = ["AMQP", "KOMBU", "PATHS", "READ_SIZE", "BufferedTCPTransport", "DeliverHooks", "RareType",
           "awaited", "current", "forget", "read_item", "ssl_arguments_problem"]

logger = logging.getLogger(__name__)

# The libraries are not annotated: their classes are typed as Any here, once.
AmqpChannel: Any = _amqp_package.Channel
AmqpConnection: Any = _amqp_package.Connection
AbstractChannel: Any = _abstract_channel.AbstractChannel
GenericContent: Any = _serialization.GenericContent
TCPTransport: Any = _amqp_transport.TCPTransport
KombuChannel: Any = _pyamqp.Channel
KombuMessage: Any = _kombu_message.Message

KOMBU = Library(_kombu_package, "kombu", (5, 7), (5, 8))
AMQP = Library(_amqp_package, "amqp", (5, 4, 2), (5, 5))

#: bytes asked of the socket per read; it returns what has arrived, up to this
READ_SIZE = 64 * 1024

_HEADER = struct.Struct(">BHI")
_FRAME_END = 0xCE

PATHS: Mapping[str, FastPath] = {
    "reader": FastPath(
        "the buffered reader", "py-amqp reads every frame with its own three recv calls, and kombu handles "
        "one frame per readable event", (AMQP, KOMBU), (
            signature(TCPTransport, "_setup_transport", "(self)"),
            reads(TCPTransport, "_setup_transport", "_quick_recv", "_read_buffer"),
            reads(TCPTransport, "_read", "_quick_recv", "_read_buffer"),
            reads(_amqp_transport._AbstractTransport, "read_frame", "_read", "_read_buffer"),
            signature(AmqpConnection, "Transport", "(self, host, connect_timeout, ssl=False, "
                      "read_timeout=None, write_timeout=None, socket_settings=None, **kwargs)"),
            reads(AmqpConnection, "connect", "Transport", "frame_handler_cls", "on_inbound_frame"),
        )),
    "delivery": FastPath(
        "direct delivery", "py-amqp's frame handler builds its message, and kombu builds its own from it",
        (AMQP, KOMBU), (
            reads(AbstractChannel, "dispatch_method", "_pending", "is_closing", "auto_decode"),
            reads(AmqpChannel, "_on_basic_deliver", "callbacks", "basic_reject"),
            reads(AmqpChannel, "basic_consume", "no_ack_consumers"),
            reads(AmqpConnection, "connect", "frame_handler_cls", "on_inbound_method"),
            signature(GenericContent, "__init__", "(self, frame_method=None, frame_args=None, **props)"),
            reads(GenericContent, "inbound_body", "body_received", "body_size", "ready"),
            signature(KombuMessage, "__init__", "(self, body=None, delivery_tag=None, content_type=None, "
                      "content_encoding=None, delivery_info=None, properties=None, headers=None, "
                      "postencode=None, accept=None, channel=None, **kwargs)"),
            signature(KombuChannel, "message_to_python", "(self, raw_message)"),
        )),
    "decoder": FastPath(
        "the header decoder's reading of rarer types", "a header holding one (a decimal, a timestamp, a "
        "float, ...) is decoded whole by py-amqp's decode_properties_basic", (AMQP,), (
            signature(_serialization, "_read_item", "(buf, offset)"),
            signature(_serialization, "decode_properties_basic", "(buf, offset)"),
        ), needs=("delivery",)),
    "whole": FastPath(
        "taking whole deliveries from the read buffer", "a delivered message is taken frame by frame",
        (AMQP,), (), needs=("reader", "delivery")),
    "acks": FastPath(
        "the acknowledgement batching", "py-amqp writes one basic.ack frame per message", (AMQP, KOMBU), (
            signature(AmqpChannel, "basic_ack", "(self, delivery_tag, multiple=False, argsig='Lb')"),
            signature(AmqpChannel, "basic_reject", "(self, delivery_tag, requeue, argsig='Lb')"),
            signature(AmqpChannel, "basic_recover", "(self, requeue=False)"),
            signature(AmqpChannel, "basic_qos",
                      "(self, prefetch_size, prefetch_count, a_global, argsig='lBb')"),
            signature(AmqpChannel, "_on_basic_deliver",
                      "(self, consumer_tag, delivery_tag, redelivered, exchange, routing_key, msg)"),
            reads(_method_framing, "frame_writer", "bytes_sent", "write"),
        )),
}

_fast_paths = FastPaths(PATHS, "AMQP transport", logger)
#: which fast paths are on in this process: decided at the first call, said once in the log
current = _fast_paths.current
#: decide again at the next :func:`current` (after the environment or a library changed)
forget = _fast_paths.forget


# -- buffered reader ---------------------------------------------------------------------------------


class BufferedTCPTransport(TCPTransport):  # type: ignore[misc]
    """py-amqp's TCP transport, reading ahead into its buffer (see :mod:`.reading`)."""

    def _setup_transport(self) -> None:
        super()._setup_transport()
        recv = self.sock.recv

        def read_ahead(size: int) -> bytes:
            # py-amqp asks for exactly what its frame needs and keeps any surplus in its buffer;
            # recv returns what has arrived, so asking for more costs nothing and saves the
            # next frames a system call each
            return recv(max(size, READ_SIZE))  # type: ignore[no-any-return]

        self._quick_recv = read_ahead

    @property
    def buffered(self) -> bytes:
        """What has been read and not handed out yet (py-amqp's own reads take it first)."""
        return self._read_buffer

    @buffered.setter
    def buffered(self, data: bytes) -> None:
        self._read_buffer = data

    def next_frame(self) -> tuple[int, int, bytes] | None:
        """The next frame if the buffer holds all of it, else None (nothing is read)."""
        buffer = self._read_buffer
        if len(buffer) < 8:
            return None
        frame_type, channel, size = _HEADER.unpack_from(buffer)
        end = 7 + size
        if len(buffer) <= end:
            return None
        if buffer[end] != _FRAME_END:
            raise UnexpectedFrame(f"Received frame_end {buffer[end]:#04x} while expecting 0xce")
        # The rest goes back before the frame is handled: a blocking call made while handling
        # it reads the frames after it.
        self._read_buffer = buffer[end + 1:]
        return frame_type, channel, buffer[7:end]

    def next_whole(self, take: Callable[[bytes], Any]) -> Any:
        """``take(buffer)`` (a whole delivery at its start, or None); what it took leaves the
        buffer before it is handled, so a blocking call made meanwhile reads what follows."""
        buffer = self._read_buffer
        delivery = take(buffer)
        if delivery is not None:
            self._read_buffer = buffer[delivery[0]:]
        return delivery

    def read_arrived(self) -> int:
        """Add what has arrived on the socket to the buffer without waiting; returns how many
        bytes that was (0 if nothing had). A closed connection raises, as py-amqp's own read does."""
        try:
            data = self.sock.recv(READ_SIZE, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError:
            self.connected = False
            raise
        if not data:
            self.connected = False
            raise OSError("Server unexpectedly closed connection")
        self._read_buffer += data
        return len(data)


# -- content-header decoder --------------------------------------------------------------------------


class RareType(Exception):
    """A header item of a type read only by py-amqp's own reader, which is not to be used."""


def read_item(buf: bytes, offset: int) -> tuple[Any, int]:
    """One table or array item of a rarer type, read by py-amqp's item reader."""
    if "decoder" not in current():
        raise RareType()
    return _serialization._read_item(buf, offset)  # type: ignore[no-any-return]


# -- direct delivery ---------------------------------------------------------------------------------


def awaited(channel: Any, method: tuple[int, int]) -> bool:
    """Whether a caller on ``channel`` waits for ``method`` (py-amqp then dispatches it)."""
    return method in channel._pending


# -- batched acknowledgements ------------------------------------------------------------------------


class DeliverHooks:
    """py-amqp's handler of a dispatched ``basic.deliver``, noting the delivery first."""

    def _on_basic_deliver(self, consumer_tag: str, delivery_tag: int, redelivered: bool, exchange: str,
                          routing_key: str, msg: Any) -> None:
        self.note_delivery(consumer_tag, delivery_tag)  # type: ignore[attr-defined]
        super()._on_basic_deliver(  # type: ignore[misc]
            consumer_tag, delivery_tag, redelivered, exchange, routing_key, msg)


# -- TLS ---------------------------------------------------------------------------------------------


def ssl_arguments_problem(names: Iterable[str]) -> str | None:
    """Why py-amqp would refuse SSL arguments named ``names``, or None."""
    wrap = getattr(_amqp_transport.SSLTransport, "_wrap_socket_sni", None)
    try:
        import inspect

        accepted = set(inspect.signature(wrap).parameters) if wrap is not None else set()
    except (TypeError, ValueError):
        accepted = set()
    refused = sorted(set(names) - accepted)
    if not refused:
        return None
    return (f"py-amqp {AMQP.version} no longer takes the SSL argument(s) {', '.join(map(repr, refused))} "
            f"(checked: {AMQP.checked()})")
