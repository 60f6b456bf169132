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
