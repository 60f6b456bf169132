"""The tracer provider of each executor's process, and getting its spans out before the process
ends.

A provider the app set up itself (at import, or in its own ``worker_process_init`` hook) is used
as it is. Without one, each process makes its own after the fork, as OpenTelemetry's SDK wants
(its batch processor's thread and the exporters' connections do not survive a fork): the SDK's
``TracerProvider`` with the resource of ``OTEL_SERVICE_NAME``/``OTEL_RESOURCE_ATTRIBUTES``, the
sampler of ``OTEL_TRACES_SAMPLER``, and a batch processor for each exporter ``OTEL_TRACES_EXPORTER``
names (``otlp`` by default), found through the SDK's ``opentelemetry_traces_exporter`` entry
points. Before a process stops taking tasks (a prefork child recycled, shrunk or stopping, a
pool thread ending, the worker stopping) its provider is flushed, so the spans its batch
processor still holds are exported rather than lost with the process.
"""

from __future__ import annotations

import logging
import os
from importlib import metadata
from typing import Any

from opentelemetry import trace

__all__ = ["configure_from_environment", "flush", "has_provider"]

logger = logging.getLogger("worker.otel")

#: milliseconds a process waits for its spans to be exported before it ends
FLUSH_TIMEOUT_MS = 5_000
EXPORTER_GROUP = "opentelemetry_traces_exporter"


def has_provider() -> bool:
    """Whether something set a tracer provider (the API's default is a proxy to none)."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def configure_from_environment(default_service: str) -> Any:
    """Set the SDK's tracer provider up from the ``OTEL_*`` variables, for this process, and
    return it; ``None`` (with one warning line) when the SDK or an exporter is not installed."""
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        logger.warning("--otel: no tracer provider is set up and opentelemetry-sdk is not installed, so "
                       "the spans go nowhere: pip install opentelemetry-sdk opentelemetry-exporter-otlp, "
                       "or set a provider up in the app")
        return None
    named = os.environ.get("OTEL_TRACES_EXPORTER", "otlp")
    names = [name.strip() for name in named.split(",") if name.strip()]
    exporters = []
    for name in names:
        if name == "none":
            continue
        found = metadata.entry_points(group=EXPORTER_GROUP, name=name)
        if not found:
            known = sorted(entry.name for entry in metadata.entry_points(group=EXPORTER_GROUP))
            logger.warning("--otel: OTEL_TRACES_EXPORTER names %r, which no installed package provides "
                           "(installed: %s); for otlp: pip install opentelemetry-exporter-otlp", name,
                           ", ".join(known) or "none")
            continue
        exporters.append(next(iter(found)).load()())
    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: default_service}
    provider = TracerProvider(resource=Resource.create(attributes))
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider


def flush() -> None:
    """Export what this process's provider still holds (an SDK provider: the API's has nothing
    to flush)."""
    provider = trace.get_tracer_provider()
    force_flush = getattr(provider, "force_flush", None)
    if force_flush is None:
        return
    try:
        if not force_flush(FLUSH_TIMEOUT_MS):
            logger.warning("--otel: the spans of process %d were not all exported within %d ms",
                           os.getpid(), FLUSH_TIMEOUT_MS)
    except Exception as exc:
        logger.warning("--otel: could not export the spans of process %d: %s", os.getpid(), exc)
