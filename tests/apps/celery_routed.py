"""A Celery app that routes through a topic exchange with task_queues and task_routes (names from
the environment, so each test has its own)."""

from __future__ import annotations

import os

from celery import Celery
from kombu import Exchange, Queue

QUEUE = os.environ.get("ROUTED_QUEUE", "routed")
EXCHANGE = os.environ.get("ROUTED_EXCHANGE", "routed")

app = Celery("celery_routed", broker=os.environ.get("CELERY_BROKER_URL"),
             backend=os.environ.get("CELERY_RESULT_BACKEND"))
app.conf.update(
    broker_connection_retry_on_startup=True, worker_hijack_root_logger=False,
    task_queues=[Queue(QUEUE, Exchange(EXCHANGE, "topic"), "feed.#")],
    task_routes={"apps.celery_routed.*": {"exchange": EXCHANGE, "exchange_type": "topic",
                                          "routing_key": "feed.add"}},
)


@app.task
def add(x, y):
    return x + y
