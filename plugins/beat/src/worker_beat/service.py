"""One scheduler of a fleet, as the worker's Beat step and ``workerctl beat`` run it: its entries
checked, a lease named ``beat`` on the app's broker, and an election whose duty is the
scheduler's (:mod:`.scheduler`), on a thread of its own."""

from __future__ import annotations

import logging
import os
import time
import zoneinfo
from datetime import timedelta, timezone, tzinfo
from typing import Any

from worker_core.election import Election
from worker_core.exceptions import ConfigurationError
from worker_core.slots import ElectsLeaders, SendsOnce

from .scheduler import Scheduler, Tick
from .sources import ScheduleSource, SettingsSource, load_source

__all__ = ["LEASE", "BeatService", "zone_of"]

logger = logging.getLogger("worker.beat")

#: the lease the schedulers of one broker (one Redis database, one RabbitMQ virtual host, one
#: embedded file) compete for
LEASE = "beat"


def zone_of(settings: Any) -> tzinfo:
    """The zone crontabs are read in: ``timezone``, else UTC with ``enable_utc`` (the default),
    else the machine's local zone, as in Celery."""
    if settings.timezone:
        return zoneinfo.ZoneInfo(settings.timezone)
    if settings.enable_utc:
        return timezone.utc
    name = os.environ.get("TZ", "").lstrip(":")
    try:
        if name:
            return zoneinfo.ZoneInfo(name)
        with open("/etc/localtime", "rb") as file:
            return zoneinfo.ZoneInfo.from_file(file, key="localtime")
    except (OSError, ValueError, zoneinfo.ZoneInfoNotFoundError):
        local = time.localtime()
        return timezone(timedelta(seconds=local.tm_gmtoff), local.tm_zone)


class BeatService:
    """The scheduler and its election for ``app``.

    :param holder: this scheduler's name (the node name) as others see it, with a suffix
    :param scheduler: ``--scheduler``/``beat_scheduler``: the dynamic source, or None
    :raise ConfigurationError: an entry, the ``--scheduler`` or the broker cannot serve
    """

    def __init__(self, app: Any, holder: str, *, scheduler: str | None = None,
                 schedule_file: str | None = None, on_tick: Any = None) -> None:
        settings = app.settings
        transport = app.transport
        if not isinstance(transport, ElectsLeaders):
            raise ConfigurationError(
                f"the broker {type(transport).__name__} cannot hold the scheduler's lease (its transport "
                f"offers no leases): run the scheduler on a Redis, RabbitMQ or embedded broker")
        name = scheduler if scheduler is not None else settings.beat_scheduler
        dynamic = load_source(name, transport)
        sources: list[ScheduleSource] = [SettingsSource(app, transport)]
        if dynamic is not None:
            sources.append(dynamic(app, transport))
        schedule_file = schedule_file or settings.beat_schedule_filename
        if schedule_file:
            logger.info("The schedule's state is kept on the broker, with its lease: -s %s is not used",
                        schedule_file)
        self.app = app
        self.sources = sources
        self.scheduler = Scheduler(app, sources, zone_of(settings), catch_up=settings.beat_catch_up_window,
                                   cron_deadline=settings.beat_cron_starting_deadline,
                                   max_interval=settings.beat_max_loop_interval, on_tick=on_tick)
        self.scheduler.check()
        self.lease = transport.lease(LEASE, holder, ttl=settings.beat_lease_timeout)
        if not isinstance(self.lease, SendsOnce):
            raise ConfigurationError(f"the broker's leases ({type(self.lease).__name__}) cannot send a "
                                     f"message once: the scheduler needs them to")
        self.election = Election(self.lease, duty=self.scheduler.duty, on_change=self._changed, name="beat")

    def _changed(self, leading: bool) -> None:
        if leading:
            logger.info("beat: %s sends the periodic tasks now", self.lease.holder)
        else:
            self.scheduler.stopped_leading()
            logger.info("beat: %s no longer sends the periodic tasks", self.lease.holder)

    def start(self) -> None:
        entries = len(self.scheduler.check())
        logger.info("beat: %d entries; %s waits for the lease %r (takeover within %.1fs)", entries,
                    self.lease.holder, LEASE, self.lease.bound + self.election.retry)
        self.election.start()

    def stop(self) -> None:
        self.election.stop()
        for source in self.sources:
            try:
                source.close()
            except Exception as exc:
                logger.debug("closing the schedule source %r: %s", source, exc)

    def info(self) -> dict[str, Any]:
        """What ``inspect beat`` answers: whether this scheduler sends, its lease, each entry."""
        leading = self.election.leading
        return {
            "leading": leading,
            "holder": self.lease.holder,
            "token": self.election.token,
            "terms": self.election.terms,
            "bound": self.lease.bound + self.election.retry,
            "error": self.election.last_error,
            "sent": self.scheduler.sent,
            "entries": self.scheduler.snapshot(),
        }


def log_tick(tick: Tick) -> None:
    """Log a tick that was not sent as planned (the sends are logged by the scheduler)."""
    if tick.outcome == "sent-already":
        logger.info("beat: %s due %s was sent already (by another scheduler)", tick.name,
                    tick.due.isoformat())
