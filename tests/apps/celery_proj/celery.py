"""The Celery app of the project, configured from the environment by the tests."""

from __future__ import annotations

import os

from celery import Celery

app = Celery("celery_proj", broker=os.environ.get("CELERY_BROKER_URL"),
             backend=os.environ.get("CELERY_RESULT_BACKEND"), include=["apps.celery_proj.tasks"])
app.conf.update(
    broker_connection_retry_on_startup=True,
    task_default_queue=os.environ.get("CELERY_PROJ_QUEUE", "celery"),
    result_extended=True,
)
