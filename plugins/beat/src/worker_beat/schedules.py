"""When an entry runs: :class:`crontab` and :class:`every`, read as Celery reads its ``crontab`` and
``schedule`` (a crontab in the app's time zone, wall-clock fields; an interval in elapsed time), and
any schedule object of Celery's (``solar``, or a class of the user's) through its own
``remaining_estimate``.

Each schedule answers one question, :meth:`Schedule.next_after`: the first run strictly after a
given one. Every scheduler of a fleet asks it with the same last run (kept on the broker), so they
agree on each tick's due time to the microsecond, which is what the tick's key is made of.

**Daylight-saving changes**, as Celery's crontab has them: the fields are matched on the wall
clock of the zone; a time the spring change skips (02:30 in Europe/Berlin) runs at the instant its
old offset names (03:30, one hour later in wall time, at once after the change), and in the hour
the autumn change repeats a run falls in the occurrence that the last run's was in, so an hourly
entry runs once in the first 02:00-03:00 and not again in the second.
"""

from __future__ import annotations

import bisect
import copy
from collections.abc import Iterable
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any, Protocol, runtime_checkable

__all__ = ["Schedule", "crontab", "every", "from_celery", "schedule_of"]

UTC = timezone.utc

WEEKDAYS = {"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6}
MONTHS = {"jan": 1, "feb": 2, "mar": 3, "apr": 4, "may": 5, "jun": 6, "jul": 7, "aug": 8, "sep": 9, "oct": 10,
          "nov": 11, "dec": 12}
#: the longest days of the month each month can have (February's 29th happens)
DAYS_IN_MONTH = {1: 31, 2: 29, 3: 31, 4: 30, 5: 31, 6: 30, 7: 31, 8: 31, 9: 30, 10: 31, 11: 30, 12: 31}
#: years a crontab is searched ahead for its next run before it is called impossible
SEARCH_YEARS = 30


@runtime_checkable
class Schedule(Protocol):
    """A schedule of this plugin's: the first run strictly after ``last``, an aware datetime;
    ``zone`` is the app's time zone (``timezone``, ``enable_utc``)."""

    def next_after(self, last: datetime, zone: tzinfo) -> datetime:
        """The next run, an aware datetime strictly after ``last``."""

    def describe(self) -> str:
        """What ``workerctl beat --list`` shows: ``every 10s``, ``crontab */5 * * * *``."""

    def as_record(self) -> dict[str, Any] | None:
        """The schedule as the entries kept on the broker store it (``{"every": 10}``,
        ``{"crontab": "*/5 * * * *"}``), or None for one that cannot be kept there."""


# -- intervals --------------------------------------------------------------------------------------


def _seconds(value: Any, what: str) -> float:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value <= 0:
        raise ValueError(f"{what} must be a number of seconds or a timedelta greater than 0 (got {value!r})")
    return float(value)


class every:
    """Every ``seconds`` (a number, or a ``timedelta``), counted from the last run, as Celery's
    ``schedule(run_every)``; the first run comes one interval after the scheduler first saw the
    entry. With ``relative``, each run is rounded down to the interval's unit (the minute of an
    interval of minutes, the hour, the day) on the zone's wall clock, as Celery rounds it."""

    def __init__(self, seconds: float | timedelta, relative: bool = False) -> None:
        self.seconds = _seconds(seconds, "an interval")
        self.relative = bool(relative)

    def __repr__(self) -> str:
        return f"every({self.seconds:g}{', relative=True' if self.relative else ''})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, every) and (other.seconds, other.relative) == (self.seconds, self.relative)

    def __hash__(self) -> int:
        return hash((self.seconds, self.relative))

    def describe(self) -> str:
        text = f"every {_human(self.seconds)}"
        return f"{text}, rounded" if self.relative else text

    def as_record(self) -> dict[str, Any]:
        return {"every": self.seconds, **({"relative": True} if self.relative else {})}

    def next_after(self, last: datetime, zone: tzinfo) -> datetime:
        due = last.astimezone(UTC) + timedelta(seconds=self.seconds)
        if not self.relative:
            return due
        unit = next((size for size in (86400, 3600, 60) if self.seconds >= size), 0)
        if not unit:
            return due
        local = due.astimezone(zone)
        if unit == 86400:
            floor = local.replace(hour=0, minute=0, second=0, microsecond=0)
        elif unit == 3600:
            floor = local.replace(minute=0, second=0, microsecond=0)
        else:
            floor = local.replace(second=0, microsecond=0)
        rounded = floor.astimezone(UTC)
        # rounding never goes back to the last run or before it: the next unit then
        return rounded if rounded > last else rounded + timedelta(seconds=unit)


def _human(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


# -- crontab ----------------------------------------------------------------------------------------


def _value(text: str, names: dict[str, int], low: int, high: int, field: str) -> int:
    word = text.strip().lower()
    if word in names:
        return names[word]
    if len(word) > 3 and word[:3] in names:  # "monday", "january"
        return names[word[:3]]
    try:
        number = int(word)
    except ValueError:
        raise ValueError(f"the crontab field {field} has {text!r}, which is neither a number nor a "
                         f"name") from None
    if not low <= number <= high:
        raise ValueError(f"the crontab field {field} takes {low}-{high} (got {number})")
    return number


def _field(spec: Any, field: str, low: int, high: int, names: dict[str, int]) -> frozenset[int]:
    """The values a crontab field matches: an int, a set or list of ints, or text such as ``*``,
    ``*/15``, ``1,15``, ``9-17``, ``1-31/2``, ``mon-fri`` (names for the days of the week and the
    months)."""
    if isinstance(spec, bool):
        raise ValueError(f"the crontab field {field} takes a number, a set or text (got {spec!r})")
    if isinstance(spec, int):
        values = {spec}
    elif isinstance(spec, str):
        values = set()
        for part in spec.split(","):
            part = part.strip()
            base, _, step_text = part.partition("/")
            step = 1
            if step_text:
                try:
                    step = int(step_text)
                except ValueError:
                    raise ValueError(f"the crontab field {field} has the step {step_text!r}, not a "
                                     f"number") from None
                if step < 1:
                    raise ValueError(f"the crontab field {field} has the step {step}, which must be 1 "
                                     f"or more")
            if base in ("*", ""):
                if not base and not step_text:
                    raise ValueError(f"the crontab field {field} has an empty part in {spec!r}")
                start, stop = low, high
            elif "-" in base.lstrip("-"):
                first, _, second = base.partition("-")
                start, stop = _value(first, names, low, high, field), _value(second, names, low, high, field)
                if stop < start:  # a range over the end (fri-mon, 22-2): to the end, then from the start
                    values.update(range(start, high + 1, step))
                    start = low
            else:
                start = _value(base, names, low, high, field)
                stop = high if step_text else start
            values.update(range(start, stop + 1, step))
    elif isinstance(spec, Iterable):
        values = set()
        for item in spec:
            if isinstance(item, bool) or not isinstance(item, int):
                raise ValueError(f"the crontab field {field} takes whole numbers (got {item!r})")
            values.add(item)
    else:
        raise ValueError(f"the crontab field {field} takes a number, a set or text (got {spec!r})")
    if field == "day_of_week":
        values = {0 if value == 7 else value for value in values}  # Sunday is 0 and 7
    wrong = sorted(value for value in values if not low <= value <= high)
    if wrong:
        raise ValueError(f"the crontab field {field} takes {low}-{high} (got {wrong[0]})")
    if not values:
        raise ValueError(f"the crontab field {field} matches nothing (got {spec!r})")
    return frozenset(values)


class crontab:
    """A crontab, as Celery's ``crontab``: ``crontab(minute="*/15")``, ``crontab(0, 7,
    day_of_week="mon-fri")``, ``crontab.from_string("0 7 * * 1-5")``. Each field is a number, a
    set of numbers, or text (``*``, ``*/15``, ``1,15``, ``9-17``, ``1-31/2``, ``mon``). The day of
    the week counts from Sunday (0; 7 too). A day runs when its day of the month, month and day of
    the week all match (Celery's rule, not cron's either-or). Read in the app's time zone."""

    def __init__(self, minute: Any = "*", hour: Any = "*", day_of_week: Any = "*", day_of_month: Any = "*",
                 month_of_year: Any = "*") -> None:
        self.given = {"minute": minute, "hour": hour, "day_of_week": day_of_week,
                      "day_of_month": day_of_month, "month_of_year": month_of_year}
        self.minute = _field(minute, "minute", 0, 59, {})
        self.hour = _field(hour, "hour", 0, 23, {})
        self.day_of_week = _field(day_of_week, "day_of_week", 0, 7, WEEKDAYS)
        self.day_of_month = _field(day_of_month, "day_of_month", 1, 31, {})
        self.month_of_year = _field(month_of_year, "month_of_year", 1, 12, MONTHS)
        if not any(day <= DAYS_IN_MONTH[month] for month in self.month_of_year for day in self.day_of_month):
            raise ValueError(f"the crontab {self.expression()!r} names no day that exists (day_of_month "
                             f"{day_of_month!r} in month_of_year {month_of_year!r})")
        self._minutes = sorted(self.minute)
        self._hours = sorted(self.hour)

    @classmethod
    def from_string(cls, text: str) -> crontab:
        """``"minute hour day_of_month month_of_year day_of_week"``, as cron writes it."""
        parts = text.split()
        if len(parts) != 5:
            raise ValueError(f"a crontab has five fields, minute hour day-of-month month day-of-week (got "
                             f"{text!r})")
        minute, hour, day_of_month, month_of_year, day_of_week = parts
        return cls(minute, hour, day_of_week, day_of_month, month_of_year)

    def expression(self) -> str:
        full = {"minute": 60, "hour": 24, "day_of_week": 7, "day_of_month": 31, "month_of_year": 12}

        def text(name: str) -> str:
            given = self.given[name]
            if isinstance(given, (str, int)):
                return str(given)
            values = sorted(getattr(self, name))
            if len(values) == full[name]:
                return "*"
            runs: list[list[int]] = []
            for value in values:  # consecutive values as ranges: 1-5
                if runs and value == runs[-1][-1] + 1:
                    runs[-1].append(value)
                else:
                    runs.append([value])
            parts = (f"{run[0]}-{run[-1]}" if len(run) > 2 else ",".join(map(str, run)) for run in runs)
            return ",".join(parts)

        fields = ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")
        return " ".join(text(name) for name in fields)

    def __repr__(self) -> str:
        return f"crontab.from_string({self.expression()!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, crontab) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def _key(self) -> tuple[frozenset[int], ...]:
        return (self.minute, self.hour, self.day_of_week, self.day_of_month, self.month_of_year)

    def describe(self) -> str:
        return f"crontab {self.expression()}"

    def as_record(self) -> dict[str, Any]:
        return {"crontab": self.expression()}

    def _day_matches(self, day: datetime) -> bool:
        return (day.month in self.month_of_year and day.day in self.day_of_month
                and day.isoweekday() % 7 in self.day_of_week)

    def next_wall_time(self, after: datetime) -> datetime:
        """The first naive wall-clock time strictly after ``after`` (naive) that matches."""
        moment = after.replace(second=0, microsecond=0) + timedelta(minutes=1)
        limit = after.year + SEARCH_YEARS
        while moment.year <= limit:
            if not self._day_matches(moment):
                moment = moment.replace(hour=0, minute=0) + timedelta(days=1)
                continue
            if moment.hour not in self.hour:
                later = bisect.bisect_left(self._hours, moment.hour)
                if later == len(self._hours):
                    moment = moment.replace(hour=0, minute=0) + timedelta(days=1)
                    continue
                moment = moment.replace(hour=self._hours[later], minute=self._minutes[0])
                continue
            if moment.minute not in self.minute:
                later = bisect.bisect_left(self._minutes, moment.minute)
                if later == len(self._minutes):
                    moment = moment.replace(minute=0) + timedelta(hours=1)
                    continue
                moment = moment.replace(minute=self._minutes[later])
            return moment
        raise ValueError(f"the crontab {self.expression()!r} has no run within {SEARCH_YEARS} years")

    def next_after(self, last: datetime, zone: tzinfo) -> datetime:
        local = last.astimezone(zone)
        wall = local.replace(tzinfo=None)
        for _ in range(1000):
            wall = self.next_wall_time(wall)
            # the wall time in the zone, in the occurrence the last run was in (Celery's arithmetic)
            due = wall.replace(tzinfo=zone, fold=local.fold).astimezone(UTC)
            if due > last:
                return due
        raise ValueError(f"the crontab {self.expression()!r} has no run after {last.isoformat()} in {zone}")


# -- Celery's schedule objects --------------------------------------------------------------------


class from_celery:
    """Any schedule object of Celery's kind that is not a crontab or an interval (``solar``, a
    class of the user's): asked for its ``remaining_estimate`` from the last run, with its clock set
    to the last run, on a copy (the object given is never changed)."""

    def __init__(self, schedule: Any) -> None:
        if not callable(getattr(schedule, "remaining_estimate", None)):
            raise ValueError(f"{schedule!r} has no remaining_estimate(last_run_at): it is not a schedule")
        self.schedule = schedule

    def __repr__(self) -> str:
        return f"from_celery({self.schedule!r})"

    def describe(self) -> str:
        return repr(self.schedule)

    def as_record(self) -> None:
        return None

    def next_after(self, last: datetime, zone: tzinfo) -> datetime:
        probe = copy.copy(self.schedule)
        probe.nowfun = lambda: last
        remaining = probe.remaining_estimate(last)
        due = last + remaining
        return due if due > last else last + timedelta(seconds=1)


def schedule_of(value: Any, relative: bool = False) -> Schedule:
    """The schedule an entry's ``schedule`` names: a number of seconds or a ``timedelta``, a
    schedule of this plugin's, or one of Celery's (``crontab`` and ``schedule`` are read field by
    field; anything else with ``remaining_estimate``, such as ``solar``, is asked)."""
    if isinstance(value, (every, crontab, from_celery)):
        return value
    if isinstance(value, (int, float, timedelta)) and not isinstance(value, bool):
        return every(value, relative)
    kind = type(value)
    module = kind.__module__ or ""
    if module.startswith("celery.") and kind.__name__ == "crontab":
        return crontab(value.minute, value.hour, value.day_of_week, value.day_of_month, value.month_of_year)
    if module.startswith("celery.") and kind.__name__ == "schedule":
        return every(value.run_every, bool(getattr(value, "relative", False)) or relative)
    if callable(getattr(value, "remaining_estimate", None)):
        return from_celery(value)
    raise ValueError(f"the schedule {value!r} (a {kind.__name__}) is not one: give a number of seconds, a "
                     f"timedelta, a crontab, or a Celery schedule such as solar")
