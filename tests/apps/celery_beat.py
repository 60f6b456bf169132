"""A Celery app whose beat_schedule uses Celery's own schedule objects and options, for the
scheduler's interop tests: its task appends each run (the tick's id and due time) to a file."""

from __future__ import annotations

import os
from datetime import timedelta

from celery import Celery
from celery.schedules import crontab, schedule

app = Celery("celery_beat", broker=os.environ.get("CELERY_BROKER_URL"))
app.conf.update(
    broker_connection_retry_on_startup=True, worker_hijack_root_logger=False, timezone="Europe/Berlin",
    beat_schedule={
        "second": {"task": "celery_beat.record", "schedule": schedule(timedelta(seconds=1)),
                   "args": ("second",), "options": {"expires": 30, "priority": 3}},
        "weekday-mornings": {"task": "celery_beat.record", "schedule": crontab(minute=0, hour=7,
                                                                                day_of_week="mon-fri"),
                             "kwargs": {"what": "morning"}},
        "hourly": {"task": "celery_beat.record", "schedule": timedelta(hours=1), "args": ("hourly",)},
    },
)


@app.task(name="celery_beat.record", bind=True)
def record(self, what="?"):
    with open(os.environ["BEAT_RUNS"], "a") as runs:
        runs.write(f"{what} {self.request.id} {self.request.get('periodic_task_due')}\n")
    return what
