"""The poison cap (``worker_redelivery_limit``): how often a task was started without an outcome
before this delivery, counted where the count outlives the process that died with it, and
checked before the task starts, so a task that kills its process stops coming back in every pool.

Sources, one rule: the prefork pool's count of its lost children (``x-worker-lost``, carried by
the copy it sends again) plus the count of this message's own earlier deliveries, which is the
larger of the broker's (a quorum queue's ``x-delivery-count``) and a counter kept on the broker
or in the result backend (:class:`~worker_core.slots.CountsDeliveries`,
:class:`~worker_core.slots.BackendCountsDeliveries`). The counter is touched only for a message
the broker delivered again, just before it goes to the pool, so a first delivery costs nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from ..app.broker import transport_for
from ..exceptions import WorkerLostError
from ..protocol.headers import DELIVERY_COUNT, LOST_HEADER, carried_count
from ..slots import BackendCountsDeliveries, CountsDeliveries

if TYPE_CHECKING:
    from ..app.base import App
    from ..plugins.manager import PluginManager
    from ..request import Request
    from .connection import BrokerConnection

__all__ = ["COUNTER_EXPIRES", "PoisonCap"]

logger = logging.getLogger("worker.consumer")

#: a delivery counter is forgotten this long after its last count (a week)
COUNTER_EXPIRES = 7 * 24 * 3600.0


def _count(value: Any) -> int:
    return value if type(value) is int and value > 0 else 0


def _sources(headers: Mapping[str, Any], counted: int | None, where: str) -> str:
    said = [f"{name} {value}" for name in (LOST_HEADER, DELIVERY_COUNT)
            if (value := _count(headers.get(name)))]
    if counted:
        said.append(f"{counted} counted {where}")
    return ", ".join(said)


class PoisonCap:
    """The cap for one consumer: checked on arrival (what the message carries) and, for a message
    delivered again, just before it starts (the counter)."""

    def __init__(self, app: App, plugins: PluginManager, broker: BrokerConnection, *,
                 done: Callable[[Request], None]) -> None:
        self.app = app
        self.plugins = plugins
        self.broker = broker
        #: ends a request failed as a poison message before it started
        self.done = done
        self.limit: int | None = app.settings.worker_redelivery_limit
        self._transports: dict[str, object] = {}
        self._warned_uncapped = False

    # -- on arrival ------------------------------------------------------------------------------

    def on_arrival(self, request: Request) -> WorkerLostError | None:
        """For a message delivered again or carrying a count: note what it carries on the
        request, and whether it is counted before it starts. Returns the error to fail the task
        with when what it carries is over the cap, else None."""
        headers = request.envelope.headers
        request.deliveries = earlier = carried_count(headers)
        limit = self.limit
        if limit is not None and earlier > limit:
            return self.error(earlier, _sources(headers, None, ""))
        info = request.message.delivery_info
        # a quorum queue's own count is enough; a counter in the result backend would repeat it
        request.count_at_start = bool(info and info.get("redelivered")) and (
            DELIVERY_COUNT not in headers or isinstance(self._transport(), CountsDeliveries))
        return None

    def error(self, earlier: int, sources: str) -> WorkerLostError:
        return WorkerLostError(
            f"{earlier} earlier deliveries ended without an outcome ({sources}), its worker or process "
            f"dying each time: taken for a poison message, not run again "
            f"(worker_redelivery_limit={self.limit})")

    # -- before it starts ----------------------------------------------------------------------

    def may_start(self, request: Request) -> bool:
        """Count this start of a message delivered again; when that puts it over the cap, fail
        the task as a poison message (stored, followed, dead-lettered) and return False."""
        counted, where = self._count_start(request)
        if counted is None:
            return True
        headers = request.envelope.headers
        # the first delivery is taken to have started too (a counter only sees deliveries again)
        earlier = _count(headers.get(LOST_HEADER)) + counted
        request.deliveries = max(request.deliveries, earlier)
        limit = self.limit
        if limit is None or request.deliveries <= limit:
            return True
        request.fail_as_poison(self.error(request.deliveries, _sources(headers, counted, where)))
        self.done(request)
        return False

    def _count_start(self, request: Request) -> tuple[int | None, str]:
        envelope = request.envelope
        # the message's identity across its deliveries: its task, its retry and its prefork copy
        copy = _count(envelope.headers.get(LOST_HEADER))
        key = f"worker-deliveries-{envelope.id}-{envelope.retries}-{copy}"
        transport = self._transport()
        try:
            backend = self.app.backend
            if isinstance(transport, CountsDeliveries):
                connection = self.broker.connection
                if connection is not None:
                    return transport.count_delivery(connection, key, COUNTER_EXPIRES), "on the broker"
                if not isinstance(backend, BackendCountsDeliveries):
                    logger.warning("Could not count the delivery of %s (the broker connection is down): "
                                   "it runs without the poison cap this time", request.label)
                    return None, ""
            if isinstance(backend, BackendCountsDeliveries):
                return backend.count_delivery(key, COUNTER_EXPIRES), "in the result backend"
        except Exception as exc:
            logger.warning("Could not count the delivery of %s (%s: %s): it runs without the poison "
                           "cap this time", request.label, type(exc).__name__, exc)
        return None, ""

    def _transport(self) -> object:
        url = self.broker.current
        if url is None:
            return None
        transport = self._transports.get(url)
        if transport is None:
            transport = self._transports[url] = transport_for(self.plugins, url, self.app.settings)
        return transport

    # -- at start --------------------------------------------------------------------------------

    def warn_uncapped(self, classic: list[str]) -> None:
        """Say once, at start, when a task that takes its whole worker down is not capped on the
        ``classic`` queues (names of consumed queues the broker counts no deliveries for)."""
        if self.limit is None or not classic or self._warned_uncapped:
            return
        if isinstance(self._transport(), CountsDeliveries) or isinstance(self.app.backend,
                                                                          BackendCountsDeliveries):
            return
        self._warned_uncapped = True
        # one line; a warning only when the limit was changed from its default (Celery has no such
        # setting: a Celery deployment on classic queues would read it on every start)
        default = attrs.fields(type(self.app.settings)).worker_redelivery_limit.default
        level = logging.WARNING if self.limit != default else logging.INFO
        logger.log(level, "worker_redelivery_limit=%d cannot hold on queue%s %s for a task that takes its "
                   "whole worker down (nothing counts deliveries there): make %s quorum queue%s "
                   "(queue_type='quorum') or use a redis:// result backend",
                   self.limit, "s" if len(classic) > 1 else "", ", ".join(classic),
                   "them" if len(classic) > 1 else "it a", "s" if len(classic) > 1 else "")
