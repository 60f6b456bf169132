"""The task of the Redis Cluster tests: counts each run of each number in a Redis hash (the
ledger, ``CLUSTER_LEDGER`` / ``CLUSTER_LEDGER_KEY``, on the suite's plain Redis), so a lost task
and a task run twice both show; the broker comes from WORKER_BROKER_URL."""

from __future__ import annotations

import os
import time

import redis

from worker_core import App

app = App("redis-cluster-tests")
_ledger = redis.Redis.from_url(os.environ.get("CLUSTER_LEDGER", "redis://127.0.0.1:6379/0"))
KEY = os.environ.get("CLUSTER_LEDGER_KEY", "cluster-ledger")
SECONDS = float(os.environ.get("CLUSTER_TASK_SECONDS", "0"))


@app.task(name="rc.work", acks_late=True)
def work(number: int) -> int:
    if SECONDS:
        time.sleep(SECONDS)  # the pause is the work: tasks are running when a node dies
    _ledger.hincrby(KEY, str(number), 1)
    return number


@app.task(name="rc.add")
def add(x: int, y: int) -> int:
    return x + y


@app.task(name="rc.where", bind=True)
def where(self) -> dict:
    return {
        "queue": self.request.delivery_info.get("routing_key"),
        "redelivered": bool(self.request.delivery_info.get("redelivered")),
    }
