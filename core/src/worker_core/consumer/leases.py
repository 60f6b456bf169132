"""The one warning for a countdown longer than the broker lends a message: on a transport that
lends each delivered message for a visibility timeout and does not renew the lease
(:class:`~worker_core.slots.LeasesMessages` with ``renews_leases = False``), a task held for its
ETA past that timeout is delivered again meanwhile, and may run twice."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..options import scheme_of
from ..slots import LeasesMessages

if TYPE_CHECKING:
    from ..app.settings import Settings
    from ..plugins.manager import PluginManager
    from ..request import Request
    from .connection import BrokerConnection

__all__ = ["LeaseCheck"]

logger = logging.getLogger("worker.consumer")


class LeaseCheck:
    """Warns once per worker about the first ETA wait longer than an unrenewed lease."""

    def __init__(self, broker: BrokerConnection, plugins: PluginManager, settings: Settings) -> None:
        self.broker = broker
        self.plugins = plugins
        self.settings = settings
        self.warned = False
        #: broker URL -> the lease that is not renewed there (seconds), or None
        self._unrenewed: dict[str, float | None] = {}

    def check(self, request: Request, delay: float) -> None:
        """Called when ``request`` starts waiting ``delay`` seconds for its ETA."""
        if self.warned:
            return
        url = self.broker.current
        if url is None:
            return
        timeout = self._unrenewed_lease(url)
        if timeout is None or delay <= timeout:
            return
        self.warned = True
        logger.warning(
            "Task %s waits %.0fs for its ETA or countdown, longer than the visibility timeout of "
            "the %s transport (%gs), which does not renew the leases of the messages the worker "
            "holds: the broker delivers its message again meanwhile, and the task may run twice. "
            "Raise broker_transport_options={'visibility_timeout': ...} above the longest "
            "countdown or ETA you use (said once per worker)",
            request.label, delay, scheme_of(url), timeout)

    def _unrenewed_lease(self, url: str) -> float | None:
        if url not in self._unrenewed:
            transport: object = self.plugins.slot("transport", scheme_of(url))
            lease = None
            if isinstance(transport, LeasesMessages) and not transport.renews_leases:
                lease = transport.lease_timeout(self.settings)
            self._unrenewed[url] = lease
        return self._unrenewed[url]
