"""Tasks of this project's App for the tracing tests: with ``--otel`` they run in ``run/<task>``
spans, and each opens a span of its own inside (through the OpenTelemetry API only: the worker
sets the SDK up from the OTEL_* variables)."""

from __future__ import annotations

import os

from opentelemetry import trace

from worker_core import App

app = App("otel_app", broker=os.environ.get("WORKER_BROKER_URL"),
          backend=os.environ.get("WORKER_RESULT_BACKEND"))
tracer = trace.get_tracer("apps.otel_app")


@app.task(name="apps.otel_app.add")
def add(x, y):
    with tracer.start_as_current_span("add-inside") as span:
        span.set_attribute("sum", x + y)
        return x + y


@app.task(name="apps.otel_app.tsum")
def tsum(numbers):
    return sum(numbers)


@app.task(name="apps.otel_app.boom")
def boom():
    raise ValueError("boom")


@app.task(name="apps.otel_app.flaky", bind=True, max_retries=2, default_retry_delay=0.05)
def flaky(self):
    if self.request.retries < 1:
        raise self.retry(exc=RuntimeError("once more"))
    return self.request.retries


@app.task(name="apps.otel_app.pid")
def pid():
    return os.getpid()
