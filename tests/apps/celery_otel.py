"""A Celery app traced with opentelemetry-instrumentation-celery, set up as its documentation
says: in ``worker_process_init``, with the SDK's in-memory exporter; a task reports the spans the
process has finished."""

from __future__ import annotations

import os

from celery import Celery
from celery.signals import worker_process_init
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

app = Celery("celery_otel", broker=os.environ.get("CELERY_BROKER_URL"),
             backend=os.environ.get("CELERY_RESULT_BACKEND"))
app.conf.broker_connection_retry_on_startup = True

exporter = InMemorySpanExporter()


@worker_process_init.connect(weak=False)
def init_tracing(*args, **kwargs):
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    CeleryInstrumentor().instrument(tracer_provider=provider)


@app.task(name="apps.celery_otel.add")
def add(x, y):
    return x + y


@app.task(name="apps.celery_otel.finished_spans")
def finished_spans():
    return [{"name": span.name, "kind": span.kind.name, "trace_id": format(span.context.trace_id, "032x"),
             "span_id": format(span.context.span_id, "016x"),
             "parent_id": format(span.parent.span_id, "016x") if span.parent else None,
             "attributes": {key: str(value) for key, value in (span.attributes or {}).items()}}
            for span in exporter.get_finished_spans()]
