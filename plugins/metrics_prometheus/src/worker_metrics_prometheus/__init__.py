"""worker-metrics-prometheus: the worker serves Prometheus metrics itself (``--metrics-listen``)."""

from .plugin import MetricsStep, TaskMetrics, parse_listen

__all__ = ["MetricsStep", "TaskMetrics", "parse_listen"]
