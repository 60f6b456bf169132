"""A Celery app whose result backend is database 7 of the suite's Redis (result_extended on), for
the result backend contract run against worker-celery's backend."""

import os

from celery import Celery

REDIS = os.environ.get("WORKER_TEST_REDIS", "127.0.0.1:6379")

app = Celery("celery_results", broker="redis://127.0.0.1:1/0", backend=f"redis://{REDIS}/7")
app.conf.result_extended = True
