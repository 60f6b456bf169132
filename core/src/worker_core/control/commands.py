"""The commands a worker answers: ``inspect`` ones read state, ``control`` ones change it.

Each handler takes the worker and keyword arguments and returns a JSON-able reply; control
commands answer ``{"ok": ...}`` or ``{"error": ...}`` as Celery's do. The read-only ones also
take (and ignore) the extra arguments Celery's ``inspect`` sends, so ``celery inspect`` works.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from ..exceptions import PoolError

if TYPE_CHECKING:
    from ..request import Request
    from ..worker.worker import Worker

__all__ = ["BUILTIN_COMMANDS", "Command", "request_info"]


@attrs.frozen
class Command:
    """A remote command: ``kind`` is ``inspect`` (read-only) or ``control``."""

    name: str
    handler: Callable[..., Any] = attrs.field(eq=False)
    kind: str = "inspect"
    help: str = ""
    #: names of the arguments on the command line, in order (``autoscale MAX MIN``)
    args: tuple[str, ...] = ()


def ok(message: str) -> dict[str, str]:
    return {"ok": message}


def nok(message: str) -> dict[str, str]:
    return {"error": message}


def request_info(request: Request) -> dict[str, Any]:
    envelope = request.envelope
    return {
        "id": request.id,
        "name": request.name,
        "args": envelope.args,
        "kwargs": envelope.kwargs,
        "type": request.name,
        "hostname": request.consumer.hostname,
        "time_start": request.time_start,
        "acknowledged": request.acknowledged,
        "delivery_info": request.delivery_info(),
        "worker_pid": request.worker_pid,
    }


def ping(worker: Worker, **_celery: Any) -> dict[str, str]:
    return ok("pong")


def stats(worker: Worker, **_celery: Any) -> dict[str, Any]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    info = worker.stats()
    info["rusage"] = {"utime": usage.ru_utime, "stime": usage.ru_stime, "maxrss": usage.ru_maxrss}
    info["clock"] = 0
    info.setdefault("autoscaler", {})
    info["autoscaler"] = info["autoscaler"] or {}
    info["pid"] = os.getpid()
    return info


def active(worker: Worker, safe: bool = False, **_celery: Any) -> list[dict[str, Any]]:
    consumer = worker.consumer
    return [request_info(r) for r in consumer.active] if consumer else []


def reserved(worker: Worker, safe: bool = False, **_celery: Any) -> list[dict[str, Any]]:
    consumer = worker.consumer
    if consumer is None:
        return []
    return [request_info(r) for r in consumer.reserved if r not in consumer.active]


def scheduled(worker: Worker, safe: bool = False, **_celery: Any) -> list[dict[str, Any]]:
    consumer = worker.consumer
    if consumer is None:
        return []
    return [{"eta": r.envelope.eta.isoformat() if r.envelope.eta else None, "priority": None,
             "request": request_info(r)} for r in consumer.eta_held]


def registered(worker: Worker, taskinfoitems: Any = None, builtins: bool = False,
               **_celery: Any) -> list[str]:
    return sorted(worker.app.tasks)


def active_queues(worker: Worker, **_celery: Any) -> list[dict[str, Any]]:
    return [{"name": name, "exchange": {"name": name, "type": "direct"}, "routing_key": name, "durable": True}
            for name in worker.options.queues]


def autoscale(worker: Worker, max: int | None = None, min: int | None = None) -> dict[str, str]:
    scaler = worker.autoscaler
    if scaler is None:
        return nok("autoscale is not enabled on this worker (start it with --autoscale MAX,MIN)")
    try:
        new_max = None if max is None else int(max)
        new_min = None if min is None else int(min)
    except (TypeError, ValueError):
        return nok(f"autoscale takes whole numbers MAX MIN (got {max!r} {min!r})")
    if new_max is not None and new_max < 1:
        return nok(f"autoscale MAX must be at least 1 (got {new_max})")
    if new_max is not None and new_min is not None and new_min > new_max:
        return nok(
            f"autoscale takes MAX first, then MIN, and MIN may not exceed MAX (got {new_max} {new_min})"
        )
    high, low = scaler.update(new_max, new_min)
    return ok(f"autoscale now max={high} min={low}")


def _resize(worker: Worker, n: Any, grow: bool) -> dict[str, str]:
    verb = "grow" if grow else "shrink"
    if worker.autoscaler is not None:
        return nok(
            f"pool_{verb} is not available while the autoscaler is on; change its range with autoscale"
        )
    try:
        count = int(n)
    except (TypeError, ValueError):
        return nok(f"pool_{verb} takes a whole number (got {n!r})")
    if count < 1:
        return nok(f"pool_{verb} takes a number of processes, at least 1 (got {count})")
    pool = worker.pool
    if pool is None:
        return nok("the pool has not started")
    try:
        (pool.grow if grow else pool.shrink)(count)
    except PoolError as exc:
        return nok(str(exc))
    return ok(f"pool will {verb}")


def pool_grow(worker: Worker, n: int = 1) -> dict[str, str]:
    return _resize(worker, n, grow=True)


def pool_shrink(worker: Worker, n: int = 1) -> dict[str, str]:
    return _resize(worker, n, grow=False)


def shutdown(worker: Worker, msg: str = "", **_celery: Any) -> dict[str, str]:
    worker.request_stop()
    return ok("shutting down")


BUILTIN_COMMANDS: Mapping[str, Command] = {
    command.name: command
    for command in (
        Command("ping", ping, help="Answer pong."),
        Command("stats", stats, help="Pool, prefetch, autoscaler, totals, uptime."),
        Command("active", active, help="Tasks running now."),
        Command("reserved", reserved, help="Tasks received and waiting for the pool."),
        Command("scheduled", scheduled, help="Tasks waiting for their ETA."),
        Command("registered", registered, help="Task names this worker knows."),
        Command("active_queues", active_queues, help="Queues this worker consumes."),
        Command("autoscale", autoscale, kind="control", args=("max", "min"),
                help="Change the autoscaler's MAX MIN."),
        Command("pool_grow", pool_grow, kind="control", args=("n",), help="Add N processes."),
        Command("pool_shrink", pool_shrink, kind="control", args=("n",), help="Remove N idle processes."),
        Command("shutdown", shutdown, kind="control", help="Stop warmly."),
    )
}
