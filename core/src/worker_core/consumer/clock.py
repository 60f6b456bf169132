"""The one clock tasks are held by: the broker's when its transport tells it
(:class:`~worker_core.slots.TellsTime`), else this worker's wall clock, read through the monotonic
clock, so that a step of the wall clock moves no deadline before it is seen.

Held countdowns and ETAs wait on the monotonic clock (:meth:`Clock.deadline`). A jump of the
wall clock (the difference between it and the monotonic clock moving by more than
:data:`JUMP_SECONDS`) is logged once with its size, the broker's clock is read again, and the
held tasks are re-armed at once: by the broker's clock they keep their time; with no broker clock
they follow the wall clock as it now reads. A worker whose clock differs from the broker's by more
than :data:`SKEW_SECONDS` says so when it connects, and ``inspect stats`` shows the difference.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from ..options import scheme_of
from ..redaction import redact_url
from ..slots import TellsTime

if TYPE_CHECKING:
    from ..plugins.manager import PluginManager

__all__ = ["JUMP_SECONDS", "SKEW_SECONDS", "Clock"]

logger = logging.getLogger("worker.consumer")

#: a step of the wall clock larger than this is a jump (logged; held tasks re-armed)
JUMP_SECONDS = 2.0
#: a difference from the broker's clock larger than this is logged
SKEW_SECONDS = 2.0
#: how often (seconds) the wall clock is compared with the monotonic clock
CHECK_INTERVAL = 1.0


class Clock:
    """Seconds since the epoch as the broker counts them, with deadlines on the monotonic clock."""

    def __init__(self, plugins: PluginManager) -> None:
        self.plugins = plugins
        #: the wall clock minus the monotonic clock, as last seen
        self._offset = time.time() - time.monotonic()
        #: the broker's clock minus this worker's wall clock; 0 while the broker has not told its time
        self.skew = 0.0
        self.broker_clock = False
        self._logged_skew: float | None = None
        self.jumps = 0
        self.last_jump: float | None = None
        #: called after a jump was seen (the held tasks are re-armed)
        self.on_jump: list[Callable[[], None]] = []

    # -- reading ---------------------------------------------------------------------------------

    def now(self) -> float:
        """Seconds since the epoch by the broker's clock (this worker's when the broker tells none)."""
        return time.monotonic() + self._offset + self.skew

    def utcnow(self) -> datetime:
        return datetime.fromtimestamp(self.now(), timezone.utc)

    def deadline(self, when: float) -> float:
        """The monotonic time at which it is ``when`` (seconds since the epoch) by :meth:`now`."""
        return when - self._offset - self.skew

    # -- the broker's clock ----------------------------------------------------------------------

    def measure(self, connection: Any, url: str) -> None:
        """Read the broker's clock through ``connection`` (when its transport tells it) and log a
        difference from this worker's beyond :data:`SKEW_SECONDS` (at start, and when it changed)."""
        transport: object = self.plugins.slot("transport", scheme_of(url))
        if not isinstance(transport, TellsTime):
            return
        try:
            broker = transport.broker_time(connection)
            after = time.monotonic()
        except Exception as exc:
            logger.debug("could not read the broker's clock: %r", exc)
            return
        self._offset = time.time() - time.monotonic()
        # The broker read its clock during the call: at ``after`` its clock read at least
        # ``broker``. Counting it as exactly that is the estimate that is never ahead of the
        # broker's clock, so a held task never starts before its time by it (it may start up to
        # the call's round trip late); the call's midpoint could be half a round trip ahead.
        self.skew = broker - (after + self._offset)
        self.broker_clock = True
        if abs(self.skew) <= SKEW_SECONDS:
            if self._logged_skew is not None:
                logger.warning("This worker's clock agrees with the broker's again (%+.1fs)", self.skew)
                self._logged_skew = None
            return
        if self._logged_skew is not None and abs(self.skew - self._logged_skew) <= SKEW_SECONDS:
            return
        self._logged_skew = self.skew
        logger.warning(
            "This worker's clock is %.1fs %s the broker's (%s): tasks held for their countdown or ETA "
            "wait by the broker's clock, and leases are judged by it; fix the worker's clock (NTP) so "
            "that its logs and task times agree with the fleet", abs(self.skew),
            "behind" if self.skew > 0 else "ahead of", redact_url(url))

    # -- jumps -----------------------------------------------------------------------------------

    def check(self, connection: Any, url: str | None, held: int) -> bool:
        """Compare the wall clock with the monotonic clock; True (and re-armed) after a jump.
        ``connection`` (None while there is none) is the consumer's, to ``url``; ``held`` says
        how many tasks wait for their ETA, for the log line."""
        offset = time.time() - time.monotonic()
        jump = offset - self._offset
        if abs(jump) <= JUMP_SECONDS:
            return False
        self._offset = offset
        self.jumps += 1
        self.last_jump = jump
        if self.broker_clock:
            self.skew -= jump  # the broker's clock did not jump: held tasks keep their time
            if connection is not None and url is not None:
                self.measure(connection, url)
            follows = f"they keep the broker's time (its clock is now {abs(self.skew):.1f}s " \
                      f"{'ahead of' if self.skew > 0 else 'behind'} this worker's)"
        else:
            follows = "they follow the wall clock as it reads now (the broker tells no time)"
        logger.warning("The wall clock jumped %s by %.1fs (seen against the monotonic clock): %d task(s) "
                       "held for their countdown or ETA re-armed at once; %s",
                       "forward" if jump > 0 else "back", abs(jump), held, follows)
        for callback in self.on_jump:
            callback()
        return True

    def info(self) -> dict[str, Any]:
        """For ``inspect stats`` (``wall_clock``; Celery's ``clock`` is its logical clock)."""
        return {
            "broker_skew": round(self.skew, 3) if self.broker_clock else None,
            "wall_jumps": self.jumps,
            "last_jump": round(self.last_jump, 3) if self.last_jump is not None else None,
        }
