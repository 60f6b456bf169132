"""worker-beat's schedules give the due times Celery's give: crontabs across the daylight-saving
changes of Europe/Berlin (spring and autumn) checked against Celery's own ``crontab``, intervals,
Celery's schedule objects read unchanged, and entries of ``beat_schedule`` checked with errors
that name the entry and what is wrong."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from celery import Celery
from celery import schedules as celery_schedules
from worker_beat.entries import entry_from_settings
from worker_beat.schedules import crontab, every, from_celery, schedule_of

from worker_core.exceptions import ConfigurationError

BERLIN = ZoneInfo("Europe/Berlin")
UTC = timezone.utc
#: the days of 2026 Europe/Berlin moves its clocks: forward at 02:00 CET, back at 03:00 CEST
CHANGES = {"spring": "2026-03-29", "autumn": "2026-10-25"}
SPECS = [
    ("*/15",),
    ("30",),
    ("0",),
    ("30", "2"),
    ("0", "2-3"),
    ("*/20", "1-4"),
    ("45", "1"),
    ("0", "*/2"),
    ("*",),
    ("30", "2", "sun"),
    ("15", "3", "*", "25-31", "3,10"),
]


def celery_runs(spec: tuple[str, ...], start: datetime, count: int) -> list[datetime]:
    """The runs Celery's crontab gives after ``start``, each from the one before: its
    ``remaining_estimate`` with its clock at the last run (as its beat asks it when the run is due)."""
    app = Celery("dst", set_as_current=False)
    app.conf.timezone = "Europe/Berlin"
    schedule = celery_schedules.crontab(*spec, app=app)
    runs, last = [], start
    for _ in range(count):
        schedule.nowfun = lambda last=last: last
        last = (last + schedule.remaining_estimate(last)).astimezone(UTC)
        runs.append(last)
    return runs


def our_runs(schedule: crontab, start: datetime, count: int) -> list[datetime]:
    runs, last = [], start
    for _ in range(count):
        last = schedule.next_after(last, BERLIN)
        runs.append(last)
    return runs


@pytest.mark.parametrize("change", sorted(CHANGES))
@pytest.mark.parametrize("spec", SPECS, ids=" ".join)
def test_a_crontab_runs_when_celerys_runs_across_a_daylight_saving_change(
    change: str, spec: tuple[str, ...]
) -> None:
    start = datetime.fromisoformat(f"{CHANGES[change]}T00:00:00+00:00") - timedelta(hours=3)
    expected = celery_runs(spec, start, 48)
    assert our_runs(crontab(*spec), start, 48) == expected
    # read from a Celery app's beat_schedule, its crontab gives the same
    assert our_runs(schedule_of(celery_schedules.crontab(*spec)), start, 48) == expected  # type: ignore[arg-type]


def test_the_skipped_and_the_repeated_hour_as_celery_has_them() -> None:
    """Spring: 02:30 does not exist, it runs at 03:30 CEST; autumn: 02:30 runs in the first
    occurrence only; an hourly entry runs once in the repeated hour."""
    daily = crontab(minute=30, hour=2)
    spring = our_runs(daily, datetime(2026, 3, 28, 12, tzinfo=UTC), 2)
    assert [run.astimezone(BERLIN).isoformat() for run in spring] == [
        "2026-03-29T03:30:00+02:00",
        "2026-03-30T02:30:00+02:00",
    ]
    autumn = our_runs(daily, datetime(2026, 10, 24, 12, tzinfo=UTC), 2)
    assert [run.astimezone(BERLIN).isoformat() for run in autumn] == [
        "2026-10-25T02:30:00+02:00",
        "2026-10-26T02:30:00+01:00",
    ]
    hourly = our_runs(crontab(minute=0), datetime(2026, 10, 24, 23, 30, tzinfo=UTC), 4)
    assert [run.astimezone(BERLIN).isoformat() for run in hourly] == [
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T03:00:00+01:00",
        "2026-10-25T04:00:00+01:00",
        "2026-10-25T05:00:00+01:00",
    ]


@pytest.mark.parametrize(
    "text", ["*/5 * * * *", "0 7 * * mon-fri", "15 3 1,15 * *", "0 0 29 2 *", "5-10/2 22-2 * * *"]
)
def test_crontab_fields_match_celerys_on_an_ordinary_week(text: str) -> None:
    start = datetime(2026, 1, 10, 10, 7, 13, tzinfo=UTC)
    minute, hour, day_of_month, month, day_of_week = text.split()
    if "22-2" in text:  # Celery's parser refuses a range over midnight; this one takes it
        hours = {22, 23, 0, 1, 2}
        assert crontab.from_string(text).hour == hours
        return
    expected = celery_runs((minute, hour, day_of_week, day_of_month, month), start, 20)
    assert our_runs(crontab.from_string(text), start, 20) == expected


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({"minute": "61"}, "takes 0-59"),
        ({"hour": "*/0"}, "step 0"),
        ({"day_of_week": "funday"}, "funday"),
        ({"day_of_month": 30, "month_of_year": 2}, "no day that exists"),
        ({"minute": True}, "takes a number"),
    ],
)
def test_a_bad_crontab_field_is_refused_naming_it(spec: dict[str, object], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        crontab(**spec)  # type: ignore[arg-type]


def test_an_interval_counts_elapsed_time_and_a_relative_one_rounds_to_its_unit() -> None:
    last = datetime(2026, 3, 29, 0, 59, 20, tzinfo=UTC)  # an hour before the spring change
    assert every(30).next_after(last, BERLIN) == last + timedelta(seconds=30)
    assert every(timedelta(hours=1)).next_after(last, BERLIN) == last + timedelta(hours=1)
    assert every(300, relative=True).next_after(last, BERLIN) == datetime(2026, 3, 29, 1, 4, tzinfo=UTC)
    celery = celery_schedules.schedule(
        timedelta(seconds=300), relative=True, app=Celery(set_as_current=False)
    )
    celery.nowfun = lambda: last
    assert last + celery.remaining_estimate(last) == every(300, relative=True).next_after(last, BERLIN)
    with pytest.raises(ValueError, match="greater than 0"):
        every(0)


def test_celerys_schedule_objects_are_read_unchanged() -> None:
    assert schedule_of(celery_schedules.schedule(timedelta(seconds=45))) == every(45)
    assert schedule_of(12.5) == every(12.5) and schedule_of(timedelta(minutes=2)) == every(120)

    class Fortnightly:  # any object with Celery's remaining_estimate (as solar has it)
        nowfun = None

        def remaining_estimate(self, last_run_at: datetime) -> timedelta:
            return last_run_at + timedelta(days=14) - self.nowfun()

    given = Fortnightly()
    foreign = schedule_of(given)
    assert isinstance(foreign, from_celery)
    last = datetime(2026, 1, 1, tzinfo=UTC)
    assert foreign.next_after(last, BERLIN) == last + timedelta(days=14)
    assert given.nowfun is None  # asked on a copy


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        ({"schedule": 10}, "needs 'task'"),
        ({"task": "t"}, "needs 'schedule'"),
        ({"task": "t", "schedule": "often"}, "is not one"),
        ({"task": "t", "schedule": 10, "option": {}}, "has the key 'option'. Did you mean 'options'"),
        (
            {"task": "t", "schedule": 10, "options": {"queues": "q"}},
            "unknown option 'queues'. Did you mean 'queue'",
        ),
        ({"task": "t", "schedule": 10, "options": {"priority": 300}}, "priority must be"),
        ({"task": "t", "schedule": 10, "args": "ab"}, "args must be a list"),
    ],
)
def test_a_bad_entry_is_refused_naming_the_entry_and_what_is_wrong(
    given: dict[str, object], problem: str
) -> None:
    with pytest.raises(ConfigurationError, match=rf"beat_schedule entry 'report'.*{problem}"):
        entry_from_settings("report", given)


def test_an_entry_keeps_its_send_options_and_its_own_apart() -> None:
    entry = entry_from_settings(
        "report",
        {
            "task": "proj.report",
            "schedule": celery_schedules.crontab(minute=0),
            "args": (1,),
            "kwargs": {"a": 2},
            "options": {
                "queue": "reports",
                "priority": 5,
                "expires": 30,
                "headers": {"x": "1"},
                "skip_missed": True,
            },
        },
    )
    assert entry.options == {"queue": "reports", "priority": 5, "expires": 30, "headers": {"x": "1"}}
    assert entry.skip_missed and entry.args == (1,) and entry.kwargs == {"a": 2}
    assert entry.schedule == crontab(minute=0)
