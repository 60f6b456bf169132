"""Hook implementations: the ``--otel`` option, and tracing set up in every executor.

With ``--otel``, the worker registers :class:`~.tracing.TaskTracing` and
:class:`~.tracing.PublishTracing` before its pool starts (prefork children inherit them), so each
task of this project's App runs in a ``run/<task>`` span continuing its message's trace context,
and what the task sends carries the trace on. A Celery app's tasks run through Celery's own
machinery, whose signals OpenTelemetry's Celery instrumentation already follows: each executor
turns that instrumentation on (``opentelemetry-instrumentation-celery``), unless the app did.

In each executor (a prefork child, a pool thread's process, the main process with solo) the
tracer provider is the app's own if it set one up, else one made from the ``OTEL_*`` variables
(:mod:`.providers`); it is flushed as the executor ends, and in the main process as the worker
stops. Without ``--otel`` nothing is registered: no hook is called per task for tracing.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING, Any

from worker_core import OptionSpec, hookimpl

if TYPE_CHECKING:
    from worker_core import Worker

__all__ = ["PUBLISH_TRACING_PLUGIN", "TASK_TRACING_PLUGIN"]

logger = logging.getLogger("worker.otel")

#: the names the tracing plugin objects are registered under with --otel
TASK_TRACING_PLUGIN = "otel-task-tracing"
PUBLISH_TRACING_PLUGIN = "otel-publish-tracing"

_state: dict[str, Any] = {"on": False, "service": "worker", "pid": None}


@hookimpl
def worker_options() -> list[OptionSpec]:
    return [
        OptionSpec("otel", ("--otel",), is_flag=True,
                   help="Trace every task with OpenTelemetry, continuing the trace context of its message "
                        "(the OTEL_* variables configure the SDK when the app does not)."),
    ]


@hookimpl
def worker_init(worker: Worker) -> None:
    if not worker.options.extra.get("otel"):
        return
    from .tracing import PublishTracing, TaskTracing

    _state.update(on=True, service=str(worker.app.main or "worker"))
    if not worker.plugins.has_plugin(TASK_TRACING_PLUGIN):
        worker.plugins.register(TaskTracing(), TASK_TRACING_PLUGIN)
        worker.plugins.register(PublishTracing(), PUBLISH_TRACING_PLUGIN)


@hookimpl(trylast=True)  # after the app's own worker_process_init, which may set a provider up
def worker_process_init(pid: int) -> None:
    if not _state["on"] or _state["pid"] == pid:
        return  # off, or this process was set up already (one call per thread in the threads pool)
    _state["pid"] = pid
    from .providers import configure_from_environment, has_provider

    if not has_provider():
        configure_from_environment(_state["service"])
    if "celery" in sys.modules:  # a Celery app: its tasks run through Celery's tracer and signals
        _instrument_celery()


def _instrument_celery() -> None:
    try:
        from opentelemetry.instrumentation.celery import CeleryInstrumentor
    except ImportError:
        logger.warning("--otel: the tasks of a Celery app are traced by OpenTelemetry's Celery "
                       "instrumentation, which is not installed: pip install "
                       "opentelemetry-instrumentation-celery (or ./plugins/otel[celery])")
        return
    instrumentor = CeleryInstrumentor()  # type: ignore[no-untyped-call]
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument()


@hookimpl
def worker_process_shutdown(pid: int) -> None:
    if _state["on"] and pid == os.getpid():
        from .providers import flush

        flush()


@hookimpl
def worker_stopped(worker: Worker) -> None:
    if _state["on"]:
        from .providers import flush

        flush()
