"""The async event loop on kombu's hub: one poller for the broker connection, the pool's pipes
and the timer, with no threads.

Heartbeats of AMQP connections are checked every ``heartbeat / rate`` seconds on the hub's
timer; a missed heartbeat is raised in the loop as a lost connection. Prefetch (QoS) changes are
sent between turns, so they are batched.
"""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING, Any, ClassVar

from ..slots import BuffersDeliveries, EventLoop, LoopContext

__all__ = ["AsyncLoop"]


def _quick_drain(connection: Any, timeout: float = 0.1) -> None:
    """Read whatever the broker sent right after consuming started, which the transport may hold
    in its own buffer (``BuffersDeliveries``)."""
    try:
        connection.drain_events(timeout=timeout)
    except Exception as exc:
        code = getattr(exc, "errno", None)
        if code is not None and code != errno.EAGAIN:
            raise


class AsyncLoop:
    """Drives the consumer with ``hub.create_loop()``."""

    uses_hub: ClassVar[bool] = True

    def run(self, context: LoopContext) -> None:
        hub = context.hub
        if hub is None:
            raise RuntimeError("the async loop needs the Hub step; run with --loop async")
        connection = context.connection
        hub.propagate_errors = tuple(connection.connection_errors) + tuple(connection.channel_errors)
        connection.transport.register_with_event_loop(connection.connection, hub)
        heartbeat_error: list[BaseException | None] = [None]
        checks = None
        heartbeat = getattr(connection, "heartbeat", None) or 0
        if heartbeat and connection.supports_heartbeats:
            rate = context.heartbeat_rate()

            def tick() -> None:
                try:
                    connection.heartbeat_check(rate)
                except Exception as exc:
                    heartbeat_error[0] = exc

            checks = hub.call_repeatedly(heartbeat / rate, tick)
        transport = context.transport
        if isinstance(transport, BuffersDeliveries) and transport.buffers_deliveries:
            hub.call_soon(_quick_drain, connection)
        context.on_ready()
        loop = hub.create_loop()
        try:
            while context.should_run():
                if heartbeat_error[0] is not None:
                    raise heartbeat_error[0]
                context.perform_pending_operations()
                context.update_qos()
                try:
                    next(loop)
                except StopIteration:
                    loop = hub.create_loop()
        finally:
            if checks is not None:
                checks.cancel()


if TYPE_CHECKING:
    # mypy proves the class satisfies its slot's Protocol and the capabilities it offers.
    _LOOP: type[EventLoop] = AsyncLoop
