"""The metrics themselves: the task series fed by the task hooks, and the gauges read when
Prometheus scrapes. Imported when the Metrics step starts, so a worker without
``--metrics-listen`` does not load prometheus_client."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from worker_core import hookimpl
from worker_core.election import ELECTIONS

from .queues import election_families

if TYPE_CHECKING:
    from worker_core import Request

__all__ = ["TaskMetrics", "WorkerGauges"]

logger = logging.getLogger("worker.metrics")

#: the label of a task name this worker does not have (names come from messages: unbounded)
UNKNOWN = "unknown"
#: the label of a queue past the first :data:`QUEUE_LABELS` seen (routing keys come from messages)
OTHER = "other"
QUEUE_LABELS = 100
#: (task name, routing key) pairs whose series are kept at hand
SERIES_KEPT = 10_000
#: arrivals remembered for the wait histogram; past it the oldest are forgotten (never started)
ARRIVALS_KEPT = 100_000
#: seconds, from a millisecond no-op to an hour-long report
BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
           900.0, 3600.0, float("inf"))
TASK_LABELS = ("name", "hostname", "queue_name")


def hostname_of(worker: Any) -> str | None:
    """The ``hostname`` label's value, or ``None`` with ``--metrics-without-hostname``."""
    return None if worker.options.extra.get("metrics_without_hostname") else str(worker.hostname)


class TaskMetrics:
    """The task counters and histograms, fed by the task hooks (main process, loop thread)."""

    def __init__(self, worker: Any, registry: CollectorRegistry) -> None:
        #: the ``hostname`` label's value; None leaves the label out
        self.hostname = hostname_of(worker)
        self._tasks = worker.app.tasks
        self._queues: set[str] = set()
        self._arrivals: dict[str, float] = {}
        self._series: dict[tuple[Any, Any], _Series] = {}
        labels = TASK_LABELS if self.hostname is not None else ("name", "queue_name")

        def counter(event: str, what: str, *extra: str) -> Counter:
            return Counter(f"celery_task_{event}", what, (*labels, *extra), registry=registry)

        self.received = counter("received", "Task messages this worker accepted.")
        self.started = counter("started", "Tasks an executor started.")
        self.succeeded = counter("succeeded", "Tasks that returned.")
        self.failed = counter("failed", "Tasks that raised, timed out or lost their process.", "exception")
        self.retried = counter("retried", "Tasks that asked to be retried.")
        self.rejected = counter("rejected", "Task messages refused (malformed, unknown task, refused "
                                            "content, Reject raised).")
        self.revoked = counter("revoked", "Tasks that did not run: revoked, expired or terminated.")
        self.runtime = Histogram("celery_task_runtime", "Seconds a task ran (successes and failures).",
                                 labels, buckets=BUCKETS, registry=registry)
        self.wait = Histogram("celery_task_queue_wait_time",
                              "Seconds from this worker's receipt of a task to its start (prefetched, "
                              "held for its ETA or rate limit, or waiting for an executor).",
                              labels, buckets=BUCKETS, registry=registry)

    def labels(self, request: Request | None) -> tuple[str, ...]:
        """The task series' labels for ``request``: a name this worker has, a queue among the
        first :data:`QUEUE_LABELS` seen, else ``unknown`` and ``other`` (and the hostname, unless
        it is left out)."""
        if request is None:
            return self._with_hostname(UNKNOWN, UNKNOWN)
        name = request.name if request.name in self._tasks else UNKNOWN
        info = request.message.delivery_info or {}
        queue = info.get("routing_key")
        if not isinstance(queue, str) or not queue:
            queue = UNKNOWN
        elif queue not in self._queues:
            if len(self._queues) >= QUEUE_LABELS:
                queue = OTHER
            else:
                self._queues.add(queue)
        return self._with_hostname(name, queue)

    def _with_hostname(self, name: str, queue: str) -> tuple[str, ...]:
        return (name, queue) if self.hostname is None else (name, self.hostname, queue)

    def series(self, request: Request | None) -> _Series:
        """The labelled series of ``request``'s task and queue, made once per pair (a lookup
        instead of prometheus_client's ``labels()`` for each event)."""
        if request is None:
            key: tuple[Any, Any] = (None, None)
        else:
            key = (request.name, (request.message.delivery_info or {}).get("routing_key"))
        found = self._series.get(key)
        if found is None:
            found = _Series(self, self.labels(request))
            if len(self._series) < SERIES_KEPT:  # keys come from messages: a bounded cache
                self._series[key] = found
        return found

    @hookimpl
    def task_received(self, request: Request) -> None:
        self.series(request).received.inc()
        arrivals = self._arrivals
        if len(arrivals) >= ARRIVALS_KEPT:
            del arrivals[next(iter(arrivals))]
        arrivals[request.id] = time.monotonic()

    @hookimpl
    def task_started(self, request: Request, pid: int) -> None:
        series = self.series(request)
        series.started.inc()
        arrived = self._arrivals.pop(request.id, None)
        if arrived is not None:
            series.wait.observe(time.monotonic() - arrived)

    @hookimpl
    def task_succeeded(self, request: Request, runtime: float, result: str | None) -> None:
        series = self.series(request)
        series.succeeded.inc()
        series.runtime.observe(runtime)

    @hookimpl
    def task_failed(self, request: Request, exc_type: str, runtime: float) -> None:
        series = self.series(request)
        self._arrivals.pop(request.id, None)  # a task failed before it started (its process lost)
        series.failed(exc_type).inc()
        series.runtime.observe(runtime)

    @hookimpl
    def task_retried(self, request: Request, reason: str) -> None:
        self.series(request).retried.inc()

    @hookimpl
    def task_rejected(self, request: Request | None, reason: str, requeue: bool) -> None:
        if request is not None:
            self._arrivals.pop(request.id, None)
        self.series(request).rejected.inc()

    @hookimpl
    def task_revoked(self, request: Request, reason: str) -> None:
        self._arrivals.pop(request.id, None)
        self.series(request).revoked.inc()


class _Series:
    """The series of one task name and queue."""

    __slots__ = ("_failed", "_labels", "_metrics", "received", "rejected", "retried", "revoked", "runtime",
                 "started", "succeeded", "wait")

    def __init__(self, metrics: TaskMetrics, labels: tuple[str, ...]) -> None:
        self._metrics, self._labels = metrics, labels
        self.received = metrics.received.labels(*labels)
        self.started = metrics.started.labels(*labels)
        self.succeeded = metrics.succeeded.labels(*labels)
        self.retried = metrics.retried.labels(*labels)
        self.rejected = metrics.rejected.labels(*labels)
        self.revoked = metrics.revoked.labels(*labels)
        self.runtime = metrics.runtime.labels(*labels)
        self.wait = metrics.wait.labels(*labels)
        self._failed: dict[str, Any] = {}

    def failed(self, exc_type: str) -> Any:
        found = self._failed.get(exc_type)
        if found is None:
            found = self._failed[exc_type] = self._metrics.failed.labels(*self._labels, exc_type)
        return found


class WorkerGauges(Collector):
    """What the worker holds, read when Prometheus scrapes (the HTTP server's thread reads sizes
    the loop thread changes: each read is one length, consistent on its own)."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        hostname = hostname_of(worker)
        #: the gauges' label names and values: the hostname, or none
        self.label_names: tuple[str, ...] = ("hostname",) if hostname is not None else ()
        self.label_values: tuple[str, ...] = (hostname,) if hostname is not None else ()

    def collect(self) -> Iterator[Any]:
        worker, names, values = self.worker, self.label_names, self.label_values

        def gauge(name: str, what: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, what, labels=names)
            family.add_metric(values, value)
            return family

        yield gauge("celery_worker_up", "1 while this worker serves its metrics.", 1)
        consumer = getattr(worker, "consumer", None)
        reservations = getattr(consumer, "reservations", None)
        if reservations is not None:
            yield gauge("celery_worker_tasks_active", "Tasks running in the pool.", len(reservations.active))
            yield gauge("worker_tasks_reserved", "Tasks this worker holds unfinished: running, waiting "
                        "for an executor, or for their rate limit.", len(reservations.reserved))
            # not started: in the worker's queue, or handed to a pool that queues them itself
            waiting = len(reservations.ready) + max(0, reservations.inflight - len(reservations.active))
            yield gauge("worker_tasks_waiting", "Tasks waiting for a free executor.", waiting)
            yield gauge("worker_tasks_eta_held", "Tasks held for their ETA or countdown.",
                        len(reservations.eta_held))
        if consumer is not None:
            reconnects = CounterMetricFamily("worker_broker_reconnects", "Times the consumer reconnected "
                                             "after losing its broker connection.", labels=names)
            reconnects.add_metric(values, consumer.restart_count)
            yield reconnects
            state = worker.broker_state()
            yield gauge("worker_broker_refusing", "1 while the broker refuses work (full, read-only, "
                        "busy, blocking the connection).", 1 if state["refusing"] is not None else 0)
            refusals = CounterMetricFamily("worker_broker_refusals", "Times the broker started refusing "
                                           "work.", labels=names)
            refusals.add_metric(values, state["refusals"])
            yield refusals
            refused = CounterMetricFamily("worker_broker_refused_seconds", "Seconds the broker refused "
                                          "work, in all.", labels=names)
            refused.add_metric(values, state["refused_seconds"])
            yield refused
        pool = getattr(worker, "pool", None)
        if pool is not None:
            yield gauge("worker_pool_processes", "Executors in the pool (processes or threads).",
                        pool.num_processes)
        yield from plugin_gauges(worker, names, values)
        yield from election_families(worker.stash.get(ELECTIONS, {}), names, values)


def plugin_gauges(worker: Any, names: tuple[str, ...] = ("hostname",),
                  values: tuple[str, ...] = ()) -> Iterator[GaugeMetricFamily]:
    """The gauges other plugins contribute (the ``worker_gauges`` hook), one family per name, with
    the worker's own labels (``names``/``values``: its hostname, or none) before theirs; a plugin
    whose hook raises is logged and left out of this reading."""
    families: dict[str, GaugeMetricFamily] = {}
    try:
        contributed = worker.plugins.collect("worker_gauges", worker=worker)
    except Exception as exc:
        logger.warning("A plugin's gauges are left out of the metrics: %s", exc)
        return
    for gauges, _provider in contributed:
        for item in gauges or ():
            own = sorted(item.labels)
            family = families.get(item.name)
            if family is None:
                family = GaugeMetricFamily(item.name, item.help, labels=(*names, *own))
                families[item.name] = family
            family.add_metric((*values, *(item.labels[name] for name in own)), item.value)
    yield from families.values()
