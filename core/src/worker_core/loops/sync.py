"""The sync event loop: blocking ``drain_events`` with a timeout, for any transport.

Each turn fires due timers, runs callbacks queued by pool threads, sends a changed prefetch
count, then waits for broker events for at most the time until the next timer (capped at one
second, shorter while pool threads may report back).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from ..slots import EventLoop, LoopContext

__all__ = ["SyncLoop", "fire_timers"]

MAX_WAIT = 1.0


def fire_timers(timer: Any, scheduler: Any, max_timers: int = 32) -> float | None:
    """Run due timer entries; return seconds until the next one (``None``: no timers)."""
    for _ in range(max_timers):
        delay, entry = next(scheduler)
        if entry is None:
            return delay  # type: ignore[no-any-return]
        timer.apply_entry(entry)
    return 0.0


class SyncLoop:
    """Blocking loop around ``connection.drain_events(timeout=...)``."""

    uses_hub: ClassVar[bool] = False

    def run(self, context: LoopContext) -> None:
        connection = context.connection
        timer = context.timer
        scheduler = iter(timer)
        heartbeat = getattr(connection, "heartbeat", None) or 0
        checks = None
        if heartbeat and getattr(connection, "supports_heartbeats", False):
            rate = context.heartbeat_rate()
            checks = timer.call_repeatedly(heartbeat / rate, connection.heartbeat_check, (rate,))
        context.on_ready()
        try:
            while context.should_run():
                delay = fire_timers(timer, scheduler)
                context.perform_pending_operations()
                context.update_qos()
                wait = MAX_WAIT if delay is None else min(delay, MAX_WAIT)
                try:
                    connection.drain_events(timeout=context.drain_timeout(wait))
                except TimeoutError:
                    pass
        finally:
            if checks is not None:
                checks.cancel()


if TYPE_CHECKING:
    # mypy proves the class satisfies its slot's Protocol and the capabilities it offers.
    _LOOP: type[EventLoop] = SyncLoop
