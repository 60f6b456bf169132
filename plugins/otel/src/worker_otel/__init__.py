"""worker-otel: OpenTelemetry traces for worker (``--otel``), on the OpenTelemetry API.

A task continues the W3C trace context that ``opentelemetry-instrumentation-celery`` puts in
Celery's message headers, with that instrumentation's span names and attributes, and what it
sends carries the trace on; :func:`instrument` does the sending side for a client of this
project's App::

    import worker_otel
    worker_otel.instrument(app)       # every task this process sends: apply_async/<task> spans
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from worker_core import App

    from .tracing import PublishTracing, TaskTracing

__version__ = "0.1.0"

__all__ = ["PublishTracing", "TaskTracing", "instrument", "uninstrument"]

#: the name :func:`instrument` registers the client's hooks under
CLIENT_PLUGIN = "otel-client-tracing"


def instrument(app: App, tracer_provider: Any = None) -> None:
    """Trace every task message ``app`` sends in this process (``apply_async/<task>`` spans) and
    put their context in the messages' headers, as Celery's instrumentation does for a Celery
    client. ``tracer_provider`` defaults to the global one. Calling it again does nothing."""
    from .tracing import PublishTracing

    if not app.plugins.has_plugin(CLIENT_PLUGIN):
        app.register_hooks(PublishTracing(tracer_provider), CLIENT_PLUGIN)


def uninstrument(app: App) -> None:
    """Stop what :func:`instrument` started."""
    if app.plugins.has_plugin(CLIENT_PLUGIN):
        app.unregister_hooks(CLIENT_PLUGIN)


def __getattr__(name: str) -> Any:
    # the tracing classes import OpenTelemetry: only when asked for (the plugin module loads in
    # every workerctl, with --otel or without)
    if name in ("PublishTracing", "TaskTracing"):
        from . import tracing

        return getattr(tracing, name)
    raise AttributeError(f"module 'worker_otel' has no attribute {name!r}")
