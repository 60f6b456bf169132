"""OpenTelemetry for ``compare.py --otel``: the SDK's tracer provider with its batch processor
and an exporter that drops the batches (no collector to send them to: what is measured is what
tracing costs the worker, up to the exporter). Set up in each process that runs tasks, after
the fork, as the SDK and Celery's instrumentation ask (:func:`set_up` once per process)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult


class DroppingExporter(SpanExporter):
    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


_done: set[int] = set()


def set_up() -> bool:
    """Set the provider up in this process; False when it was already."""
    if os.getpid() in _done:
        return False
    _done.add(os.getpid())
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(DroppingExporter()))
    trace.set_tracer_provider(provider)
    return True
