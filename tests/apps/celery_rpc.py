"""The tasks of ``apps.rpc`` for a real Celery worker (the broker and result backend come from
CELERY_BROKER_URL and CELERY_RESULT_BACKEND), with task_track_started on."""

from __future__ import annotations

import os
from pathlib import Path

from celery import Celery

from apps.rpc import Boom, wait_for_file

app = Celery("celery_rpc", broker=os.environ.get("CELERY_BROKER_URL"),
             backend=os.environ.get("CELERY_RESULT_BACKEND"))
app.conf.update(broker_connection_retry_on_startup=True, worker_hijack_root_logger=False,
                task_track_started=True,
                result_persistent=os.environ.get("CELERY_RESULT_PERSISTENT") == "true",
                # a test's own queue: where this worker sends the next steps of a workflow too
                task_default_queue=os.environ.get("CELERY_DEFAULT_QUEUE", "celery"))


@app.task(name="apps.rpc.add")
def add(x, y):
    return x + y


@app.task(name="apps.rpc.boom")
def boom(message, code):
    raise Boom(message, code)


@app.task(name="apps.rpc.flaky", bind=True, max_retries=3, default_retry_delay=0.05)
def flaky(self, failures):
    if self.request.retries < failures:
        raise self.retry(exc=RuntimeError(f"attempt {self.request.retries}"))
    return self.request.retries


@app.task(name="apps.rpc.stages", bind=True)
def stages(self, gates):
    wait_for_file(Path(gates) / "1")
    self.update_state(state="PROGRESS", meta={"step": 1})
    wait_for_file(Path(gates) / "2")
    return "done"
