"""An entry of the schedule: a task, when it runs, and what it is sent with; read from Celery's
``beat_schedule`` format (``{"task", "schedule", "args", "kwargs", "options", "relative"}``) and
from the records the dynamic source keeps on the broker, each checked with an error that names the
entry and what is wrong."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from worker_core.exceptions import ConfigurationError
from worker_core.options import did_you_mean

from .schedules import Schedule, schedule_of

__all__ = ["ENTRY_KEYS", "SEND_OPTIONS", "Entry", "entry_from_record", "entry_from_settings"]

#: the keys of an entry in ``beat_schedule``, as Celery's ``ScheduleEntry`` takes them
ENTRY_KEYS = ("task", "schedule", "args", "kwargs", "options", "relative")
#: what ``options`` may hold: ``apply_async``'s options, as Celery's beat passes them on
SEND_OPTIONS = frozenset({
    "queue", "exchange", "routing_key", "priority", "expires", "headers", "countdown", "eta",
    "time_limit", "soft_time_limit", "serializer", "shadow", "ignore_result", "link", "link_error",
    "reply_to", "argsrepr", "kwargsrepr", "retry", "retry_policy", "exchange_type", "delivery_mode",
})
#: this scheduler's own entry options, kept out of what is sent: a run missed while no
#: scheduler held the lease (a takeover, every scheduler down) is skipped rather than sent late
OWN_OPTIONS = frozenset({"skip_missed"})


@attrs.frozen
class Entry:
    """One periodic task."""

    name: str
    task: str
    schedule: Schedule = attrs.field(eq=False)
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = attrs.field(factory=dict)
    #: what the task is sent with (``send_task``'s options)
    options: Mapping[str, Any] = attrs.field(factory=dict)
    #: skip a run missed while no scheduler held the lease, rather than send it late
    skip_missed: bool = False
    #: where it comes from: ``settings`` or ``store``
    source: str = "settings"
    enabled: bool = True
    #: seconds since the epoch when the entry was last enabled (runs before it are not owed)
    since: float | None = None

    def same_as(self, other: Entry) -> bool:
        """Whether it is sent as ``other`` is, on the same schedule (a changed entry is
        scheduled again)."""
        return (self == other and self.schedule.describe() == other.schedule.describe()
                and type(self.schedule) is type(other.schedule))


def _check_options(where: str, options: Any) -> tuple[dict[str, Any], bool]:
    if options is None:
        return {}, False
    if not isinstance(options, Mapping):
        raise ConfigurationError(f"{where}: options must be a mapping of apply_async options "
                                 f"(got {options!r})")
    unknown = sorted(set(options) - SEND_OPTIONS - OWN_OPTIONS)
    if unknown:
        known = sorted(SEND_OPTIONS | OWN_OPTIONS)
        raise ConfigurationError(f"{where}: unknown option {unknown[0]!r}.{did_you_mean(unknown[0], known)} "
                                 f"The options are apply_async's: {', '.join(known)}")
    skip = options.get("skip_missed", False)
    if not isinstance(skip, bool):
        raise ConfigurationError(f"{where}: skip_missed must be True or False (got {skip!r})")
    priority = options.get("priority")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)
                                 or not 0 <= priority <= 255):
        raise ConfigurationError(f"{where}: priority must be a whole number from 0 to 255 (got {priority!r})")
    headers = options.get("headers")
    if headers is not None and not isinstance(headers, Mapping):
        raise ConfigurationError(f"{where}: headers must be a mapping (got {headers!r})")
    expires = options.get("expires")
    if expires is not None and not hasattr(expires, "isoformat") and (
            isinstance(expires, bool) or not isinstance(expires, (int, float))):
        raise ConfigurationError(f"{where}: expires must be seconds after the send or a datetime "
                                 f"(got {expires!r})")
    return {key: value for key, value in options.items() if key not in OWN_OPTIONS}, skip


def entry_from_settings(name: Any, given: Any, source: str = "settings") -> Entry:
    """An entry of ``beat_schedule`` (``name: {"task", "schedule", ...}``)."""
    where = f"beat_schedule entry {name!r}"
    if not isinstance(name, str) or not name.strip():
        raise ConfigurationError(f"beat_schedule names an entry {name!r}: each entry is named by a non-empty "
                                 f"string")
    if not isinstance(given, Mapping):
        raise ConfigurationError(f"{where} must be a mapping such as {{'task': 'proj.tasks.report', "
                                 f"'schedule': 30.0}} (got {given!r})")
    unknown = sorted(set(given) - set(ENTRY_KEYS))
    if unknown:
        raise ConfigurationError(f"{where} has the key {unknown[0]!r}.{did_you_mean(unknown[0], ENTRY_KEYS)} "
                                 f"An entry takes {', '.join(ENTRY_KEYS)}")
    task = given.get("task")
    if not isinstance(task, str) or not task:
        raise ConfigurationError(f"{where} needs 'task': the name of the task to send (got {task!r})")
    if "schedule" not in given:
        raise ConfigurationError(f"{where} needs 'schedule': seconds, a timedelta, a crontab or a solar")
    try:
        schedule = schedule_of(given["schedule"], bool(given.get("relative", False)))
    except ValueError as exc:
        raise ConfigurationError(f"{where}: {exc}") from None
    args = given.get("args") or ()
    if isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
        raise ConfigurationError(f"{where}: args must be a list or a tuple (got {args!r})")
    kwargs = given.get("kwargs") or {}
    if not isinstance(kwargs, Mapping) or not all(isinstance(key, str) for key in kwargs):
        raise ConfigurationError(f"{where}: kwargs must be a mapping of names to values (got {kwargs!r})")
    options, skip = _check_options(where, given.get("options"))
    return Entry(name, task, schedule, tuple(args), dict(kwargs), options, skip, source)


def entry_from_record(name: str, text: str) -> Entry:
    """An entry the dynamic source keeps: ``{"task", "schedule": {"every": 10} or {"crontab":
    "*/5 * * * *"}, "args", "kwargs", "options", "enabled", "since"}`` in JSON."""
    where = f"the stored entry {name!r}"
    try:
        record = json.loads(text)
    except ValueError as exc:
        raise ConfigurationError(f"{where} is not JSON ({exc}); remove it with workerctl beat "
                                 f"remove") from None
    if not isinstance(record, dict):
        raise ConfigurationError(f"{where} is not a JSON object; remove it with workerctl beat remove")
    schedule = record.get("schedule")
    from .schedules import crontab, every

    try:
        if isinstance(schedule, dict) and "every" in schedule:
            built: Any = every(schedule["every"], bool(schedule.get("relative", False)))
        elif isinstance(schedule, dict) and "crontab" in schedule:
            built = crontab.from_string(str(schedule["crontab"]))
        else:
            raise ValueError(f"its schedule is {schedule!r}, neither {{'every': seconds}} nor "
                             f"{{'crontab': text}}")
    except ValueError as exc:
        raise ConfigurationError(f"{where}: {exc}") from None
    given = {"task": record.get("task"), "schedule": built, "args": record.get("args"),
             "kwargs": record.get("kwargs"), "options": record.get("options")}
    entry = entry_from_settings(name, given, source="store")
    since = record.get("since")
    return attrs.evolve(entry, enabled=record.get("enabled", True) is not False,
                        since=float(since) if isinstance(since, (int, float)) else None)
