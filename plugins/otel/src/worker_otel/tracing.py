"""The spans: :class:`TaskTracing` around each task of this project's App, where it runs (the
executor's process and thread), and :class:`PublishTracing` around each task message sent (in the
client, and in the worker for what a task sends: the next step of a chain, a chord's body, a
retry). Both are hook implementations (:mod:`worker_core.hookspecs`); the worker registers them
with ``--otel``, a client with :func:`worker_otel.instrument`.

The run span continues the trace context of the message's headers (W3C ``traceparent``, as
Celery's instrumentation injects it), and is the current span while the task runs and while what
follows it is sent, so a span the task opens is its child and the next step's publish carries it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagate import extract, inject
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace import SpanKind, Status, StatusCode

from worker_core import hookimpl

from . import attributes
from .attributes import ACTION, MESSAGE_ID, PUBLISH, RETRY_REASON, RUN, TASK_NAME, request_attributes

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

__all__ = ["PublishTracing", "TaskTracing", "tracer"]

#: the instrumentation scope of this plugin's spans
SCOPE = "worker_otel"
SCHEMA = "https://opentelemetry.io/schemas/1.11.0"


def tracer(provider: Any = None) -> Tracer:
    from . import __version__

    return trace.get_tracer(SCOPE, __version__, provider, schema_url=SCHEMA)


_FIELDS: dict[type, frozenset[str]] = {}


def reader(request: Any) -> Callable[[str], Any]:
    """``request.get`` (a :class:`~worker_core.app.context.TaskContext`: an attribute, else one
    of the message's own headers, else None), without raising and catching an AttributeError for
    every name the request does not have (most of what the span's attributes ask for)."""
    kind = type(request)
    fields = _FIELDS.get(kind)
    if fields is None:
        fields = _FIELDS[kind] = frozenset(request.as_dict())
    headers = request.headers or {}

    def get(key: str) -> Any:
        return getattr(request, key) if key in fields else headers.get(key)

    return get


class _RequestGetter(Getter[Any]):
    """Reads a propagator's field from a task's request: the message's own headers are its
    attributes (``request.traceparent``), as in Celery."""

    def get(self, carrier: Any, key: str) -> list[str] | None:
        value = reader(carrier)(key)
        if value is None:
            return None
        if isinstance(value, str):
            return [value]
        if isinstance(value, Iterable):
            return [item if isinstance(item, str) else str(item) for item in value]
        return [str(value)]

    def keys(self, carrier: Any) -> list[str]:
        return list(carrier.headers or ())


_GETTER = _RequestGetter()


#: spans kept open at most: a publish that raised never reaches ``after_task_publish``
OPEN_KEPT = 10_000


class _Open:
    """The spans open now, by (task id, publishing), with what ends them: a task that retries
    publishes a message of its own id while its run span is open."""

    def __init__(self) -> None:
        self._spans: dict[tuple[str, bool], tuple[Span, Any, Any]] = {}
        self._lock = threading.Lock()

    def put(self, key: tuple[str, bool], span: Span, activation: Any, token: Any) -> None:
        with self._lock:
            if len(self._spans) >= OPEN_KEPT:
                del self._spans[next(iter(self._spans))]
            self._spans[key] = (span, activation, token)

    def get(self, key: tuple[str, bool]) -> tuple[Span, Any, Any] | None:
        return self._spans.get(key)

    def pop(self, key: tuple[str, bool]) -> tuple[Span, Any, Any] | None:
        with self._lock:
            return self._spans.pop(key, None)


class _Tracing:
    """A tracer from ``provider`` (the global one by default), got when first used, and the
    spans open now."""

    def __init__(self, provider: Any = None) -> None:
        self._provider = provider
        self._tracer: Tracer | None = None
        self._open = _Open()

    def _get_tracer(self) -> Tracer:
        if self._tracer is None:
            self._tracer = tracer(self._provider)
        return self._tracer


class TaskTracing(_Tracing):
    """``run/<task>`` spans around the tasks of this project's App, in the executor."""

    @hookimpl
    def task_prerun(self, task_id: str, task: Any, request: Any) -> None:
        parent = extract(request, getter=_GETTER) or None
        token = otel_context.attach(parent) if parent is not None else None
        span = self._get_tracer().start_span(f"{RUN}/{task.name}", context=parent, kind=SpanKind.CONSUMER)
        activation = trace.use_span(span, end_on_exit=True)
        activation.__enter__()
        self._open.put((task_id, False), span, activation, token)

    @hookimpl
    def task_failure(self, task: Any, task_id: str, exception: BaseException) -> None:
        found = self._open.get((task_id, False))
        if found is None or not found[0].is_recording():
            return
        throws = getattr(task, "throws", ()) or ()
        if throws and isinstance(exception, tuple(throws)):
            return  # an expected error, as Celery's instrumentation leaves it
        span = found[0]
        span.record_exception(exception)
        span.set_status(Status(StatusCode.ERROR, str(exception)))

    @hookimpl
    def task_retry(self, task_id: str, reason: BaseException) -> None:
        found = self._open.get((task_id, False))
        if found is not None and found[0].is_recording():
            found[0].set_attribute(RETRY_REASON, str(reason))

    @hookimpl
    def task_postrun(self, task_id: str, task: Any, state: str, request: Any) -> None:
        found = self._open.pop((task_id, False))
        if found is None:
            return
        span, activation, token = found
        if span.is_recording():
            span.set_attribute(ACTION, RUN)
            span.set_attribute("celery.state", state)
            span.set_attributes(request_attributes(reader(request)))
            span.set_attribute(TASK_NAME, task.name)
        activation.__exit__(None, None, None)
        if token is not None:
            otel_context.detach(token)


class PublishTracing(_Tracing):
    """``apply_async/<task>`` spans around each task message sent, whose context goes in the
    message's headers (``traceparent``). The span is not made the current one: a publish that
    raises (and so never reaches ``after_task_publish``) leaves the caller's context as it was."""

    @hookimpl
    def before_task_publish(self, name: str, exchange: str, routing_key: str, headers: dict[str, Any],
                            declare: list[Any]) -> None:
        task_id = headers.get("id")
        if not task_id:
            return
        span = self._get_tracer().start_span(f"{PUBLISH}/{name}", kind=SpanKind.PRODUCER)
        if span.is_recording():
            span.set_attribute(ACTION, PUBLISH)
            span.set_attribute(MESSAGE_ID, str(task_id))
            span.set_attribute(TASK_NAME, name)
            published: Mapping[str, Any] = {"exchange": exchange, "routing_key": routing_key,
                                            "declare": declare}
            span.set_attributes(attributes.request_attributes(published.get))
        self._open.put((str(task_id), True), span, None, None)
        inject(headers, context=trace.set_span_in_context(span))

    @hookimpl
    def after_task_publish(self, headers: Mapping[str, Any]) -> None:
        task_id = headers.get("id")
        found = self._open.pop((str(task_id), True)) if task_id else None
        if found is not None:
            found[0].end()
