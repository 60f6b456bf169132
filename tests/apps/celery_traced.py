"""A Celery app with no tracing code of its own: under ``workerctl worker --otel`` the worker
turns OpenTelemetry's Celery instrumentation on in each executor and sets the SDK up from the
OTEL_* variables; its task opens a span through the OpenTelemetry API."""

from __future__ import annotations

import os

from celery import Celery
from opentelemetry import trace

app = Celery("celery_traced", broker=os.environ.get("CELERY_BROKER_URL"),
             backend=os.environ.get("CELERY_RESULT_BACKEND"))
app.conf.broker_connection_retry_on_startup = True
tracer = trace.get_tracer("apps.celery_traced")


@app.task(name="apps.celery_traced.add")
def add(x, y):
    with tracer.start_as_current_span("add-inside"):
        return x + y
