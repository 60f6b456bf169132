"""A Celery app whose configuration says how its worker runs: queues, concurrency, prefetch, and a
worker setting this worker does not support."""

from __future__ import annotations

import os

from celery import Celery
from kombu import Queue

app = Celery("celery_configured", broker=os.environ.get("CELERY_BROKER_URL"),
             backend=os.environ.get("CELERY_BROKER_URL"))
app.conf.update(
    broker_connection_retry_on_startup=True,
    task_queues=[Queue("high"), Queue("low")],
    worker_concurrency=3,
    worker_prefetch_multiplier=2,
    worker_direct=True,
)


@app.task(bind=True, name="apps.celery_configured.where")
def where(self):
    return self.request.delivery_info["routing_key"]


app.conf.update(task_acks_late=True, task_reject_on_worker_lost=True)


@app.task(name="apps.celery_configured.dies_once")
def dies_once(marker):
    """Kills its own process the first time (acks_late and reject_on_worker_lost from the app's
    configuration send it again), returns the second."""
    if not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), 9)
    return "second run"
