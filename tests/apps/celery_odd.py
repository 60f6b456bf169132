"""A Celery app that celery worker starts and that this worker once refused whole: one task's
soft time limit is past its hard one, and one setting's name is misspelt."""

from __future__ import annotations

import os
import time

from celery import Celery
from celery.exceptions import SoftTimeLimitExceeded

app = Celery("celery_odd", broker=os.environ.get("CELERY_BROKER_URL"),
             backend=os.environ.get("CELERY_RESULT_BACKEND"))
app.conf.update(broker_connection_retry_on_startup=True, worker_hijack_root_logger=False,
                worker_concurency=2)  # misspelt: Celery ignores it silently


@app.task(name="odd.limits", soft_time_limit=2, time_limit=1)
def limits(seconds):
    try:
        time.sleep(seconds)
    except SoftTimeLimitExceeded:
        time.sleep(5)  # the hard limit comes right after the soft one: this never ends
        return "caught the soft limit"
    return "slept"


@app.task(name="odd.add")
def add(x, y):
    return x + y
