"""Whether the broker refuses work now: a state, not a lost connection (see
:class:`~worker_core.slots.ReportsRefusals`). One line when a refusal starts, one when it ends
with its duration; the state in ``inspect stats``, the metrics and
:meth:`Worker.broker_state <worker_core.worker.worker.Worker.broker_state>`, and readiness
(``broker-blocked``) while it refuses."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["BrokerState", "backoff_delay"]

logger = logging.getLogger("worker.consumer")

#: who saw the refusal: the transport (its channels) or the consumer's own start
TRANSPORT, START = "transport", "start"


def backoff_delay(attempt: int, first: float = 0.5, cap: float = 10.0) -> float:
    """A bounded, jittered delay before try ``attempt`` (0 for the first retry): ``first`` doubled
    each time up to ``cap``, drawn between half and all of it."""
    return min(cap, first * 2.0 ** min(attempt, 30)) * random.uniform(0.5, 1.0)


class BrokerState:
    """The broker's refusals as this worker saw them (a :class:`~worker_core.slots.BrokerStatus`).

    Thread-safe: transports report from any thread. ``notify(hook, **kwargs)`` is called once per
    change, from the reporting thread (the consumer hops it to the loop's thread).
    """

    def __init__(self, notify: Callable[..., None] | None = None) -> None:
        self._lock = threading.Lock()
        self._notify = notify
        #: the sources refusing now -> their reason
        self._refusing: dict[str, str] = {}
        self.reason: str | None = None
        self._since = 0.0
        self.episodes = 0
        self._past_seconds = 0.0

    # -- what transports call (BrokerStatus) --------------------------------------------------

    def refused(self, reason: str) -> None:
        self.refused_by(TRANSPORT, reason)

    def accepted(self) -> None:
        self.accepted_by(TRANSPORT)

    # -- the consumer's own -------------------------------------------------------------------

    def refused_by(self, source: str, reason: str) -> None:
        with self._lock:
            opens = not self._refusing
            self._refusing.setdefault(source, reason)
            if not opens:
                return
            self.reason = reason
            self._since = time.monotonic()
            self.episodes += 1
        logger.warning("%s. The worker keeps its connection and waits it out, not ready meanwhile; a "
                       "line says when it is over", reason)
        if self._notify is not None:
            self._notify("broker_refused", reason=reason)

    def accepted_by(self, source: str) -> None:
        with self._lock:
            if self._refusing.pop(source, None) is None or self._refusing:
                return
            reason, self.reason = self.reason, None
            seconds = time.monotonic() - self._since
            self._past_seconds += seconds
        logger.warning("The broker takes work again after %.1fs (was: %s)", seconds, reason)
        if self._notify is not None:
            self._notify("broker_accepted", reason=reason, seconds=seconds)

    # -- reading ---------------------------------------------------------------------------------

    @property
    def refusing(self) -> bool:
        return self.reason is not None

    def seconds_refused(self) -> float:
        """Seconds refused in all, the episode going on included."""
        with self._lock:
            now = time.monotonic() - self._since if self.reason is not None else 0.0
            return self._past_seconds + now

    def info(self) -> dict[str, Any]:
        """For ``inspect stats`` (``broker_state``)."""
        reason = self.reason
        return {
            "refusing": reason,
            "refusing_for": round(time.monotonic() - self._since, 3) if reason is not None else None,
            "refusals": self.episodes,
            "refused_seconds": round(self.seconds_refused(), 3),
        }
