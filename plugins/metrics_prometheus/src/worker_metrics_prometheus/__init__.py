"""worker-metrics-prometheus: the worker serves Prometheus metrics itself (``--metrics-listen``).

The metrics (:mod:`.metrics`, which imports prometheus_client) load when the step starts."""

from .plugin import MetricsStep, parse_listen

__all__ = ["MetricsStep", "parse_listen"]
