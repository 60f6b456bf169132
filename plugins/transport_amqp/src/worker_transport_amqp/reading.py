"""Reading AMQP frames with fewer system calls.

py-amqp reads every frame with three ``recv`` calls of exactly the sizes it needs (header,
payload, frame end), and the readable-socket handler turns the socket non-blocking and back
around each frame: about sixteen system calls per message. Here a readable socket is read with
one ``recv(MSG_DONTWAIT)`` that takes everything that has arrived, and the frames are cut from
that buffer (a delivered message whole when it can be, see :mod:`.delivery`). The socket's
timeout is never touched, so a callback that makes a blocking call on the same connection
(py-amqp then waits for its reply) works as before: its reads take the buffered frames first,
in order.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

from amqp.exceptions import UnexpectedFrame
from amqp.transport import TCPTransport

from .decoding import FrameHandler
from .delivery import next_delivery

__all__ = ["READ_SIZE", "BufferedTCPTransport", "dispatch_arrived", "dispatch_frames"]

#: bytes asked of the socket per read; it returns what has arrived, up to this
READ_SIZE = 64 * 1024

_HEADER = struct.Struct(">BHI")
_FRAME_END = 0xCE


class BufferedTCPTransport(TCPTransport):  # type: ignore[misc]
    """py-amqp's TCP transport, reading ahead into its buffer."""

    _read_buffer: bytes  # py-amqp's: what has been read and not handed out yet

    def _setup_transport(self) -> None:
        super()._setup_transport()
        recv = self.sock.recv

        def read_ahead(size: int) -> bytes:
            # py-amqp asks for exactly what its frame needs and keeps any surplus in its buffer;
            # recv returns what has arrived, so asking for more costs nothing and saves the
            # next frames a system call each
            return recv(max(size, READ_SIZE))  # type: ignore[no-any-return]

        self._quick_recv = read_ahead

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


def dispatch_frames(connection: Any, limit: int) -> int:
    """Hand the whole frames in the read buffer to ``connection`` (a py-amqp connection on a
    :class:`BufferedTCPTransport`), up to ``limit`` of them; returns how many it handed over.

    When the connection's frame handler is between messages and the connection takes decoded
    deliveries (``on_decoded_delivery``), a ``basic.deliver`` whose frames have all arrived is
    taken whole (:func:`.delivery.next_delivery`) and counts as its frames; anything else goes
    to the frame handler one frame at a time."""
    transport = connection.transport
    handler = connection.on_inbound_frame
    deliver = (getattr(connection, "on_decoded_delivery", None)
               if isinstance(handler, FrameHandler) else None)
    handled = 0
    while handled < limit:
        if deliver is not None and not handler.receiving:
            buffer = transport._read_buffer
            delivery = next_delivery(buffer)
            if delivery is not None:
                # The rest goes back first: a blocking call made while the message is handled
                # reads the frames after it.
                transport._read_buffer = buffer[delivery[0]:]
                frames = delivery[10]
                connection.bytes_recv += frames  # traffic, for the heartbeat check
                handled += frames
                deliver(delivery)
                continue
        frame = transport.next_frame()
        if frame is None:
            break
        handler(frame)
        handled += 1
    return handled


def dispatch_arrived(connection: Any, limit: int) -> bool:
    """Hand up to ``limit`` frames that have arrived to ``connection`` (see
    :func:`dispatch_frames`), reading the socket only when the buffer holds no whole frame.
    False once everything that had arrived was handled; True if ``limit`` was reached.

    A read that returned less than it asked for took everything there was: the socket is not
    read again just to find it empty (anything arriving later makes the loop's poll report the
    socket readable again)."""
    transport = connection.transport
    left = limit
    drained = False
    while True:
        left -= dispatch_frames(connection, left)
        if left <= 0:
            return True
        if drained:
            return False
        got = transport.read_arrived()
        if not got:
            return False
        drained = got < READ_SIZE
