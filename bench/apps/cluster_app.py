"""The task of the cluster benchmark: counts each run of each number in a Redis hash (the ledger,
``CLUSTER_LEDGER``), so a lost task and a task run twice both show."""

from __future__ import annotations

import os
import time

import redis

from worker_core import App

app = App("cluster")
_ledger = redis.Redis.from_url(os.environ.get("CLUSTER_LEDGER", "redis://127.0.0.1:6379/0"))
KEY = os.environ.get("CLUSTER_LEDGER_KEY", "cluster-ledger")
SECONDS = float(os.environ.get("CLUSTER_TASK_SECONDS", "0"))


@app.task(name="cluster.work", acks_late=True)
def work(number: int) -> int:
    if SECONDS:
        time.sleep(SECONDS)
    _ledger.hincrby(KEY, str(number), 1)
    return number
