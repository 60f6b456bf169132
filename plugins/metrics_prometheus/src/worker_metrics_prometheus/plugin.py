"""Hook implementations: the ``--metrics-listen`` option and the Metrics step.

The worker serves ``/metrics`` itself, from its main process, where every task event is seen
whichever pool runs the task: no event stream to follow, no exporter to run beside it. The
task counters and histograms carry the names and labels of the de facto Celery exporter
(``celery_task_succeeded_total{name, hostname, queue_name}`` and so on), so its dashboards and
alerts read them; the gauges add what an exporter cannot see from events (tasks held for their
ETA, waiting for an executor, the pool's size, reconnections).

The task hooks are implemented by a :class:`~.metrics.TaskMetrics` object registered while the
step runs, and prometheus_client is imported then: a worker without ``--metrics-listen`` calls no
hook per task for metrics and does not load it. The server's socket is closed in prefork
children forked after it opened, so none holds the port.
"""

from __future__ import annotations

import ipaddress
import logging
from typing import Any

from worker_core import Condition, OptionSpec, Step, WorkerOptions, hookimpl
from worker_core.exceptions import ConfigurationError

logger = logging.getLogger("worker.metrics")

#: the name the task-metrics plugin object is registered under while the step runs
TASK_METRICS_PLUGIN = "prometheus-task-metrics"


def parse_listen(text: str) -> tuple[str, int]:
    """``PORT``, ``:PORT``, ``HOST:PORT`` or ``[IPv6]:PORT`` as ``(host, port)``; without a host,
    every IPv4 address (``0.0.0.0``), as exporters listen for the Prometheus server to reach them.
    Port 0 takes a free port (the log line says which)."""
    text = text.strip()
    host, _, port_text = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{host!r} in brackets is not an IPv6 address (got {text!r})") from None
    elif ":" in host:
        raise ValueError(f"write an IPv6 address in brackets, as [::1]:9808 (got {text!r})")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(
            f"must be PORT or HOST:PORT, for example 9808 or 127.0.0.1:9808 (got {text!r})") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"the port must be from 0 to 65535 (got {text!r})")
    return host or "0.0.0.0", port


@hookimpl
def worker_options() -> list[OptionSpec]:
    return [
        OptionSpec("metrics_listen", ("--metrics-listen",), convert=parse_listen,
                   help="Serve Prometheus metrics on this [HOST:]PORT at /metrics (9808 is the Celery "
                        "exporter's port; 0 takes a free one)."),
    ]


@hookimpl
def worker_bootsteps(blueprint: str) -> list[Step[Any]]:
    return [MetricsStep()] if blueprint == "worker" else []


class MetricsStep(Step[Any]):
    """Serves ``/metrics`` over HTTP from a thread of the main process while the worker runs."""

    name = "Metrics"
    requires = ("Pool",)
    condition = Condition("--metrics-listen is given", lambda o: o.extra.get("metrics_listen") is not None)

    def describe(self, options: WorkerOptions) -> str:
        listen = options.extra.get("metrics_listen")
        if listen is None:  # described while disabled (workerctl steps --json)
            return "serve Prometheus metrics on --metrics-listen [HOST:]PORT"
        return f"serve Prometheus metrics on {_address(*listen)}/metrics"

    def start(self, worker: Any) -> None:
        from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server

        from .metrics import TaskMetrics, WorkerGauges

        host, port = worker.options.extra["metrics_listen"]
        registry = CollectorRegistry()
        task_metrics = TaskMetrics(worker, registry)
        registry.register(WorkerGauges(worker))
        ProcessCollector(registry=registry)  # the main process's CPU, memory and open files
        try:
            self.server, _thread = start_http_server(port, host, registry)
        except OSError as exc:
            raise ConfigurationError(
                f"--metrics-listen {_host_port(host, port)}: cannot listen there ({exc.strerror or exc}); "
                f"choose a free port, or an address of this machine"
            ) from None
        task_metrics.server = self.server
        worker.plugins.register(task_metrics, TASK_METRICS_PLUGIN)
        logger.info("Prometheus metrics on %s/metrics", _address(host, self.server.server_port))

    def stop(self, worker: Any) -> None:
        if worker.plugins.has_plugin(TASK_METRICS_PLUGIN):
            worker.plugins.unregister(TASK_METRICS_PLUGIN)
        server = self.__dict__.pop("server", None)  # once, though stop may be called again
        if server is not None:
            server.shutdown()
            server.server_close()


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _address(host: str, port: int) -> str:
    return f"http://{_host_port(host, port)}"
