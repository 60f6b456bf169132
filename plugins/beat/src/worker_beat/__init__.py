"""worker-beat: periodic tasks, ``workerctl beat`` and ``workerctl worker -B``, each tick sent once
across any number of schedulers (a lease on the broker, and a key per tick the broker takes once).

``crontab`` and ``every`` are the schedules an App's ``beat_schedule`` names (a Celery app's
``celery.schedules`` objects are read as they are)."""

from .schedules import crontab, every
from .service import BeatService
from .sources import ScheduleSource

__all__ = ["BeatService", "ScheduleSource", "crontab", "every"]
