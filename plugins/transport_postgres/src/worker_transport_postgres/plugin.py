"""The plugin's hooks: the ``workerctl postgres`` command (migrate, status), and the queue lengths
the worker's maintenance reads from SQL as metrics."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from worker_core.hookspecs import Gauge, hookimpl

__all__ = ["worker_gauges", "workerctl_commands"]

_HELP = {
    "ready": "Messages ready in a PostgreSQL queue this worker consumes (read from SQL by its maintenance).",
    "delayed": "Messages waiting in a PostgreSQL queue for their countdown or ETA.",
    "taken": "Messages of a PostgreSQL queue delivered and not acknowledged yet (by any worker).",
}


@hookimpl
def workerctl_commands() -> Mapping[str, Any]:
    from .cli import postgres

    return {"postgres": postgres}


@hookimpl
def worker_gauges(worker: Any) -> list[Gauge]:
    """``worker_postgres_queue_messages{queue, state}``: ready, delayed and taken messages of
    each queue consumed here, as the last maintenance round read them (every few seconds)."""
    import sys

    module = sys.modules.get("worker_transport_postgres.location")
    if module is None:  # not on PostgreSQL
        return []
    gauges: list[Gauge] = []
    for location in module.locations():
        for queue, counts in location.depths.items():
            for state, count in counts.items():
                gauges.append(Gauge("worker_postgres_queue_messages", _HELP[state], float(count),
                                    {"queue": queue, "state": state, "schema": location.names.schema_name}))
    return gauges
