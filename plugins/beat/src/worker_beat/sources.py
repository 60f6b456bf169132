"""Where entries come from: a slot of this plugin's (entry-point group ``worker.beat_sources``).
The app's ``beat_schedule`` setting is always read (:class:`SettingsSource`); ``--scheduler``
names one more, :class:`StoreSource` (``store``, the default where the broker keeps records):
entries added, changed, disabled and removed at run time (``workerctl beat add``), kept in a
record table on the broker, so every scheduler sees the same ones without a restart.

A third-party source is a class with the members of :class:`ScheduleSource`, registered under
``worker.beat_sources`` by name, and named with ``--scheduler NAME``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any, ClassVar, Protocol, runtime_checkable

from worker_core.exceptions import ConfigurationError
from worker_core.options import did_you_mean
from worker_core.slots import KeepsRecords, RecordTable

from .entries import Entry, entry_from_record, entry_from_settings

__all__ = ["GROUP", "TABLE", "ScheduleSource", "SettingsSource", "StoreSource", "load_source", "source_names"]

logger = logging.getLogger("worker.beat")

#: the entry-point group of the schedule sources
GROUP = "worker.beat_sources"
#: the record table the store source keeps its entries in
TABLE = "beat.entries"
#: Celery's scheduler classes, and what ``--scheduler`` means for each here
CELERY_SCHEDULERS = {
    "celery.beat:PersistentScheduler": None, "celery.beat.PersistentScheduler": None,
    "celery.beat:Scheduler": None, "celery.beat.Scheduler": None,
}


@runtime_checkable
class ScheduleSource(Protocol):
    """Gives entries to the scheduler. Built as ``Source(app, transport)`` (the app's
    :class:`~worker_core.Settings` are ``app.settings``; ``transport`` is the broker's transport
    object, to ask for a record table); used from one thread at a time (the scheduler's)."""

    #: the name ``--scheduler`` takes
    name: ClassVar[str]

    def __init__(self, app: Any, transport: Any) -> None:
        """Check what the source needs (a broker that keeps records, say) without reading yet;
        raise ``ConfigurationError`` saying what is missing."""

    def entries(self) -> dict[str, Entry]:
        """The entries now, by name. Raise ``ConfigurationError`` for entries that cannot run
        (the scheduler does not start with them); a source that changes at run time logs a bad
        entry and leaves it out instead."""

    def changed(self) -> bool:
        """Whether :meth:`entries` may give something new since it was last called (cheap: it is
        asked about once a second)."""

    def close(self) -> None:
        """Release what the source holds (connections)."""


class SettingsSource:
    """The app's ``beat_schedule`` (a Celery app's, unchanged)."""

    name: ClassVar[str] = "settings"

    def __init__(self, app: Any, transport: Any = None) -> None:
        self.app = app
        self._read = False

    def entries(self) -> dict[str, Entry]:
        self._read = True
        schedule = self.app.settings.beat_schedule
        return {name: entry_from_settings(name, given) for name, given in schedule.items()}

    def changed(self) -> bool:
        return not self._read

    def close(self) -> None:
        pass


def _store_of(transport: Any) -> RecordTable:
    if not isinstance(transport, KeepsRecords):
        raise ConfigurationError(
            f"the store of schedule entries needs a broker that keeps records (Redis, or the embedded "
            f"transport); {type(transport).__name__} does not: use --scheduler settings (beat_schedule "
            f"only), or a Redis or embedded broker")
    return transport.record_table(TABLE)


class StoreSource:
    """Entries kept on the broker (a record table), changed at run time with ``workerctl beat
    add/remove/enable/disable``. A record without a task is an override of a settings entry of
    the same name: it disables or enables that entry."""

    name: ClassVar[str] = "store"

    def __init__(self, app: Any, transport: Any) -> None:
        self.table = _store_of(transport)
        self._version: int | None = None
        self._warned: set[str] = set()

    def changed(self) -> bool:
        return self.table.version() != self._version

    def entries(self) -> dict[str, Entry]:
        version = self.table.version()
        found: dict[str, Entry] = {}
        for name, text in self.table.read().items():
            if _is_override(text):
                continue
            try:
                entry = entry_from_record(name, text)
            except ConfigurationError as exc:
                if text not in self._warned:
                    self._warned.add(text)
                    logger.error("Stored schedule entry %r left out: %s", name, exc)
                continue
            found[name] = entry
        self._version = version
        return found

    def overrides(self) -> dict[str, tuple[bool, float | None]]:
        """The settings entries disabled or enabled here: name to ``(enabled, since)``."""
        found = {}
        for name, text in self.table.read().items():
            if _is_override(text):
                record = json.loads(text)
                since = record.get("since")
                found[name] = (record.get("enabled", True) is not False,
                               float(since) if isinstance(since, (int, float)) else None)
        return found

    # -- changes ---------------------------------------------------------------------------------

    def add(self, name: str, record: Mapping[str, Any]) -> None:
        """Add or replace a stored entry (checked as the scheduler reads it)."""
        text = json.dumps({**record, "since": time.time()}, sort_keys=True)
        entry_from_record(name, text)  # raises ConfigurationError naming what is wrong
        self.table.put(name, text)

    def remove(self, name: str) -> bool:
        return self.table.delete(name)

    def switch(self, name: str, enabled: bool, *, in_settings: bool) -> bool:
        """Enable or disable a stored entry, or a settings entry (``in_settings``: an override is
        kept); False when there is no such entry."""
        text = self.table.read().get(name)
        if text is None:
            if not in_settings:
                return False
            record: dict[str, Any] = {}
        else:
            record = json.loads(text)
        record.update(enabled=enabled, since=time.time())
        self.table.put(name, json.dumps(record, sort_keys=True))
        return True

    def close(self) -> None:
        self.table.close()


def _is_override(text: str) -> bool:
    """Whether a stored record only enables or disables an entry of ``beat_schedule``."""
    try:
        record = json.loads(text)
    except ValueError:
        return False
    return isinstance(record, dict) and "task" not in record


def source_names() -> dict[str, str]:
    """The installed sources: name to ``module:Class``."""
    return {point.name: point.value for point in entry_points(group=GROUP)}


def load_source(name: str | None, transport: Any) -> type[ScheduleSource] | None:
    """The source ``--scheduler`` (or ``beat_scheduler``) names, None for the settings alone.
    None chooses ``store`` where the broker keeps records; Celery's default scheduler classes
    mean the same; Celery's other scheduler classes are refused, saying what to use."""
    if name is None or name in CELERY_SCHEDULERS:
        return StoreSource if isinstance(transport, KeepsRecords) else None
    if name == SettingsSource.name:
        return None
    installed = source_names()
    if name not in installed:
        if "." in name or ":" in name:
            raise ConfigurationError(
                f"--scheduler {name!r} is a Celery scheduler class, which runs under celery beat only; this "
                f"scheduler reads beat_schedule and one source of entries of its own: "
                f"{', '.join(sorted(installed))} (entries added at run time: workerctl beat add)")
        raise ConfigurationError(f"--scheduler {name!r} names no schedule source."
                                 f"{did_you_mean(name, installed)} "
                                 f"Installed: {', '.join(sorted(installed))}")
    (point,) = [point for point in entry_points(group=GROUP) if point.name == name]
    found = point.load()
    members = ("name", "entries", "changed", "close")
    if not isinstance(found, type) or not all(hasattr(found, member) for member in members):
        raise ConfigurationError(f"the schedule source {name!r} ({point.value}) is not a class with "
                                 f"name, entries(), changed() and close()")
    return found
