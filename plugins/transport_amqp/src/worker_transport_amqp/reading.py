"""Reading AMQP frames with fewer system calls.

py-amqp reads every frame with three ``recv`` calls of exactly the sizes it needs (header,
payload, frame end), and the readable-socket handler turns the socket non-blocking and back
around each frame: about sixteen system calls per message. Here a readable socket is read with
one ``recv(MSG_DONTWAIT)`` that takes everything that has arrived, and the frames are cut from
that buffer (a delivered message whole when it can be, see :mod:`.delivery`). The socket's
timeout is never touched, so a callback that makes a blocking call on the same connection
(py-amqp then waits for its reply) works as before: its reads take the buffered frames first,
in order. The transport itself, which holds py-amqp's buffer, is in :mod:`.internals`.
"""

from __future__ import annotations

from typing import Any

from .decoding import FrameHandler
from .delivery import next_delivery
from .internals import READ_SIZE, BufferedTCPTransport

__all__ = ["READ_SIZE", "BufferedTCPTransport", "dispatch_arrived", "dispatch_frames"]


def dispatch_frames(connection: Any, limit: int) -> int:
    """Hand the whole frames in the read buffer to ``connection`` (a py-amqp connection on a
    :class:`BufferedTCPTransport`), up to ``limit`` of them; returns how many it handed over.

    When the connection's frame handler is between messages and the connection takes whole
    deliveries (``takes_whole_deliveries``, to ``on_decoded_delivery``), a ``basic.deliver``
    whose frames have all arrived is taken whole (:func:`.delivery.next_delivery`) and counts as
    its frames; anything else goes to the frame handler one frame at a time."""
    transport = connection.transport
    handler = connection.on_inbound_frame
    deliver = (connection.on_decoded_delivery
               if connection.takes_whole_deliveries and isinstance(handler, FrameHandler) else None)
    handled = 0
    while handled < limit:
        if deliver is not None and not handler.receiving:
            delivery = transport.next_whole(next_delivery)
            if delivery is not None:
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
