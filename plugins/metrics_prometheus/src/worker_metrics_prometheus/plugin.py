"""Hook implementations: the ``--metrics-listen`` option and the Metrics step.

The worker serves ``/metrics`` itself, from its main process, where every task event is seen
whichever pool runs the task: no event stream to follow, no exporter to run beside it. The
task counters and histograms carry the names and labels of the de facto Celery exporter
(``celery_task_succeeded_total{name, hostname, queue_name}`` and so on), so its dashboards and
alerts read them; the gauges add what an exporter cannot see from events (tasks held for their
ETA, waiting for an executor, the pool's size, reconnections). ``--metrics-without-hostname``
leaves the ``hostname`` label out (a fleet of pods whose names change on every deploy).

The listener is the worker's own (:func:`worker_core.health.serve`: TLS and basic
authentication from the ``--http-*`` options) and answers the health probes (``/livez``,
``/readyz``, ``/startupz``) beside ``/metrics``. The task hooks are implemented by a
:class:`~.metrics.TaskMetrics` object registered while the step runs, and prometheus_client is
imported then: a worker without ``--metrics-listen`` calls no hook per task for metrics and does
not load it.
"""

from __future__ import annotations

import logging
from typing import Any

from worker_core import Condition, OptionSpec, Step, WorkerOptions, hookimpl
from worker_core.exceptions import ConfigurationError
from worker_core.health import address_of, parse_listen

logger = logging.getLogger("worker.metrics")

#: the name the task-metrics plugin object is registered under while the step runs
TASK_METRICS_PLUGIN = "prometheus-task-metrics"

__all__ = ["MetricsStep", "parse_listen"]


@hookimpl
def worker_options() -> list[OptionSpec]:
    return [
        OptionSpec("metrics_listen", ("--metrics-listen",), convert=parse_listen,
                   help="Serve Prometheus metrics on this [HOST:]PORT at /metrics (9808 is the Celery "
                        "exporter's port; 0 takes a free one); the health probes are answered there too."),
        OptionSpec("metrics_without_hostname", ("--metrics-without-hostname",), is_flag=True,
                   help="Leave the hostname label out of every series (one series per task and queue "
                        "across restarts; Prometheus's instance label still tells the workers apart)."),
        OptionSpec("metrics_queue_lengths", ("--metrics-queue-lengths",), is_flag=True,
                   help="Take part in electing the one worker of the fleet that exports "
                        "celery_queue_length (a lease on the broker)."),
        OptionSpec("metrics_queues", ("--metrics-queues",), convert=_queues,
                   help="The queues whose lengths the elected worker exports (default: the queues it "
                        "consumes); give every worker of the fleet the same list."),
        OptionSpec("metrics_queue_interval", ("--metrics-queue-interval",), convert=_seconds,
                   default=DEFAULT_QUEUE_INTERVAL,
                   help=f"Seconds between two readings of the queues' lengths (default "
                        f"{DEFAULT_QUEUE_INTERVAL:g}); another worker takes over within three of them."),
        OptionSpec("metrics_queue_lease", ("--metrics-queue-lease",), default="metrics.queue-lengths",
                   help="The name of the lease the fleet elects its exporter with (workers of another "
                        "fleet on the same broker name their own)."),
    ]


DEFAULT_QUEUE_INTERVAL = 5.0


def _queues(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(name.strip() for name in text.split(",")))
    if not names or "" in names:
        raise ValueError(f"must be comma-separated queue names, for example emails,reports (got {text!r})")
    return names


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"must be a number of seconds (got {text!r})") from None
    if not 0 < value < float("inf"):
        raise ValueError(f"must be a number of seconds above 0 (got {text!r})")
    return value


@hookimpl
def worker_validate_options(options: WorkerOptions) -> None:
    extra = options.extra
    if extra.get("metrics_listen") is None:
        for name, flag in (("metrics_queue_lengths", "--metrics-queue-lengths"),
                           ("metrics_without_hostname", "--metrics-without-hostname")):
            if extra.get(name):
                raise ConfigurationError(f"{flag} needs --metrics-listen [HOST:]PORT (where the metrics are "
                                         f"served)")
    if extra.get("metrics_queues") and not extra.get("metrics_queue_lengths"):
        raise ConfigurationError("--metrics-queues needs --metrics-queue-lengths (the queues are those whose "
                                 "lengths the elected worker exports)")


@hookimpl
def worker_bootsteps(blueprint: str) -> list[Step[Any]]:
    return [MetricsStep()] if blueprint == "worker" else []


class MetricsStep(Step[Any]):
    """Serves ``/metrics`` (and the probes) over HTTP from a thread of the main process while the
    worker runs."""

    name = "Metrics"
    requires = ("Pool",)
    condition = Condition("--metrics-listen is given", lambda o: o.extra.get("metrics_listen") is not None)

    def describe(self, options: WorkerOptions) -> str:
        listen = options.extra.get("metrics_listen")
        if listen is None:  # described while disabled (workerctl steps --json)
            return "serve Prometheus metrics on --metrics-listen [HOST:]PORT"
        scheme = "https" if options.extra.get("http_certfile") else "http"
        host, port = listen
        return f"serve Prometheus metrics on {address_of(host, port, scheme)}/metrics"

    def start(self, worker: Any) -> None:
        from prometheus_client import CollectorRegistry, ProcessCollector, make_wsgi_app

        from worker_core.health import listener_security, probe_app, serve

        from .metrics import TaskMetrics, WorkerGauges

        extra = worker.options.extra
        host, port = extra["metrics_listen"]
        registry = CollectorRegistry()
        task_metrics = TaskMetrics(worker, registry)
        registry.register(WorkerGauges(worker))
        ProcessCollector(registry=registry)  # the main process's CPU, memory and open files
        if extra.get("metrics_queue_lengths"):
            from .queues import QueueLengths

            self.queue_lengths = QueueLengths(worker, extra.get("metrics_queues") or tuple(worker.queues),
                                              float(extra["metrics_queue_interval"]),
                                              str(extra["metrics_queue_lease"]))
            registry.register(self.queue_lengths)
        # every path but the probes' is the metrics, as prometheus_client's own server answers
        app = probe_app(worker.health, fallback=make_wsgi_app(registry))
        self.listener = serve(host, port, app, listener_security(worker.options), option="--metrics-listen")
        worker.plugins.register(task_metrics, TASK_METRICS_PLUGIN)
        logger.info("Prometheus metrics on %s/metrics", self.listener.url)
        queue_lengths = self.__dict__.get("queue_lengths")
        if queue_lengths is not None:
            queue_lengths.start()

    def stop(self, worker: Any) -> None:
        queue_lengths = self.__dict__.pop("queue_lengths", None)
        if queue_lengths is not None:
            queue_lengths.stop()  # gives the lease up: another worker exports at once
        if worker.plugins.has_plugin(TASK_METRICS_PLUGIN):
            worker.plugins.unregister(TASK_METRICS_PLUGIN)
        listener = self.__dict__.pop("listener", None)  # once, though stop may be called again
        if listener is not None:
            listener.close()
