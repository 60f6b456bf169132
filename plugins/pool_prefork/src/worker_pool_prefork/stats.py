"""``info()`` for ``workerctl inspect stats``: Celery's key names, so dashboards keep working."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["pool_info"]


def _percent(part: int, total: int) -> str:
    return f"{part / total:.2%}" if total else "0.00%"


def pool_info(pool: object, engine: Engine, *, driver: str) -> Mapping[str, Any]:
    """The pool's statistics (lock held)."""
    options = engine.options
    children = [child for child in engine.children if not child.reaped]
    writes = [child.writes for child in children]
    total = engine.total_writes
    running = sum(1 for child in children if child.jobs and child.jobs[0].accepted is not None)
    written = sum(len(child.jobs) for child in children)
    return {
        "implementation": f"{type(pool).__module__}:{type(pool).__qualname__}",
        "max-concurrency": engine.target,
        "processes": [child.pid for child in children],
        "max-tasks-per-child": options.max_tasks_per_child,
        "max-memory-per-child": options.max_memory_per_child,
        "timeouts": [options.soft_time_limit or 0, options.time_limit or 0],
        "scheduling": engine.scheduling,
        "writes": {
            "total": total,
            "avg": _percent(sum(writes) // len(writes), sum(writes)) if writes else "0.00%",
            "all": ", ".join(_percent(count, sum(writes)) for count in writes),
            "raw": ", ".join(str(count) for count in writes),
            "strategy": engine.scheduling,
            "inqueues": {"total": len(children), "active": sum(1 for child in children if child.outbuf)},
        },
        "running": running,
        "queued": len(engine.outbound) + written - running,
        "forks": engine.supervisor.forks,
        "taken-over": engine.taken_over,
        "driver": driver,
    }
