"""The commands a worker answers: ``inspect`` ones read state, ``control`` ones change it.

Each handler takes the worker and keyword arguments and returns a JSON-able reply; control
commands answer ``{"ok": ...}`` or ``{"error": ...}`` as Celery's do. The read-only ones also
take (and ignore) the extra arguments Celery's ``inspect`` sends, so ``celery inspect`` works.

One module: the table of built-in commands, each next to its handler.
"""

from __future__ import annotations

import logging
import os
import resource
import signal as signals
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from ..app.builtins import BUILTIN_PREFIX, builtin_names
from ..app.queues import queue_from_data
from ..events.plugin import disable_task_events, dispatcher, enable_task_events, send_heartbeat
from ..exceptions import ConfigurationError, PoolError, TaskRevokedError, WorkerError
from ..options import did_you_mean, scheme_of
from ..rates import parse_rate
from ..results.meta import PENDING, RECEIVED, REJECTED, RETRY, REVOKED
from ..results.outcome import Outcome, store_outcome
from ..slots import DiscardsResults, RepliesToSender, RestartsProcesses
from .command import ControlCommand as Command
from .configuration import conf
from .debugging import memdump, memsample, objgraph, report
from .signals import signal_number
from .stamps import revoke_by_stamped_headers

if TYPE_CHECKING:
    from ..request import Request
    from ..worker.worker import Worker

__all__ = ["ALIASES", "BUILTIN_COMMANDS", "Command", "request_info", "signal_number"]

logger = logging.getLogger("worker.control")


def ok(message: str) -> dict[str, str]:
    return {"ok": message}


def nok(message: str) -> dict[str, str]:
    return {"error": message}


def request_info(request: Request, safe: bool = False) -> dict[str, Any]:
    """A request as Celery's ``Request.info()`` describes it; ``safe`` gives the arguments'
    reprs the message carries instead of the arguments."""
    envelope = request.envelope
    return {
        "id": request.id,
        "name": request.shown_name,
        "args": envelope.argsrepr if safe else envelope.args,
        "kwargs": envelope.kwargsrepr if safe else envelope.kwargs,
        "type": request.name,
        "hostname": request.consumer.hostname,
        "time_start": request.time_start,
        "acknowledged": request.acknowledged,
        "delivery_info": request.delivery_info(),
        "worker_pid": request.worker_pid,
    }


def ping(worker: Worker, **_celery: Any) -> dict[str, str]:
    return ok("pong")


RUSAGE_FIELDS = ("utime", "stime", "maxrss", "ixrss", "idrss", "isrss", "minflt", "majflt", "nswap",
                 "inblock", "oublock", "msgsnd", "msgrcv", "nsignals", "nvcsw", "nivcsw")


def stats(worker: Worker, **_celery: Any) -> dict[str, Any]:
    """Celery's ``stats``, with its fields' types (``clock`` a string, ``uptime`` whole seconds,
    the broker's ``transport`` named by its URL scheme, as Celery names it), and this worker's
    own counts beside them."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    info = worker.stats()
    info["rusage"] = {field: getattr(usage, f"ru_{field}") for field in RUSAGE_FIELDS}
    info["clock"] = str(worker.clock)  # a string in Celery's reply too
    info["uptime"] = round(info["uptime"])
    info.setdefault("autoscaler", {})
    info["autoscaler"] = info["autoscaler"] or {}
    info["pid"] = os.getpid()
    broker = info.get("broker")
    if isinstance(broker, dict) and isinstance(broker.get("uri"), str):
        broker["transport"] = scheme_of(broker["uri"])  # kombu's info() gives the plugin's class
    return info


def clock(worker: Worker, **_celery: Any) -> dict[str, int]:
    """The logical clock's value now (Celery's ``clock``)."""
    return {"clock": worker.clock.value}


def active(worker: Worker, safe: bool = False, **_celery: Any) -> list[dict[str, Any]]:
    consumer = worker.consumer
    return [request_info(r, bool(safe)) for r in consumer.reservations.active] if consumer else []


def reserved(worker: Worker, safe: bool = False, **_celery: Any) -> list[dict[str, Any]]:
    consumer = worker.consumer
    if consumer is None:
        return []
    held = consumer.reservations
    return [request_info(r) for r in held.reserved if r not in held.active]


#: the ``priority`` of each entry of Celery's ``scheduled`` reply (its ETA timer entries' priority)
ETA_PRIORITY = 6
#: the task attributes ``registered`` shows when not asked for others, as Celery's
TASK_INFO_ITEMS = ("exchange", "routing_key", "rate_limit")


def scheduled(worker: Worker, safe: bool = False, **_celery: Any) -> list[dict[str, Any]]:
    consumer = worker.consumer
    if consumer is None:
        return []
    held = consumer.reservations
    requests = [held.held_request(task) for task in held.eta_held]
    # "priority" is that of Celery's timer entry, which is 6 for every task waiting for its ETA
    return [{"eta": r.envelope.eta.isoformat() if r.envelope.eta else None, "priority": ETA_PRIORITY,
             "request": request_info(r)} for r in requests]


def registered(worker: Worker, taskinfoitems: Any = None, builtins: bool = False,
               **_celery: Any) -> list[str]:
    """The tasks' names, each followed by the attributes ``taskinfoitems`` names that it has
    (``proj.add [rate_limit=10/m]``; by default ``exchange``, ``routing_key``, ``rate_limit``);
    Celery's built-in tasks (``celery.*``) only with ``builtins``, as Celery lists them."""
    wanted = taskinfoitems if isinstance(taskinfoitems, (list, tuple)) and taskinfoitems else TASK_INFO_ITEMS
    fields = [field for field in wanted if isinstance(field, str) and not field.startswith("_")]
    tasks = worker.app.tasks
    described = []
    for name in builtin_names(tasks, bool(builtins)):
        task = tasks[name]
        values = [(field, task.info_item(field)) for field in fields]
        shown = " ".join(f"{field}={value}" for field, value in values if value is not None)
        described.append(f"{name} [{shown}]" if shown else name)
    return described


def active_queues(worker: Worker, **_celery: Any) -> list[dict[str, Any]]:
    """The queues consumed, as Celery's ``active_queues`` describes them (kombu's ``as_dict``)."""
    topology = worker.app.topology
    found = []
    for name in worker.queues:
        try:
            queue = topology.queue(name)
        except Exception:  # made at run time, outside the topology
            found.append({"name": name})
            continue
        info = queue.as_dict(recurse=True)
        info["bindings"] = [binding.as_dict(recurse=True) for binding in queue.bindings or ()]
        found.append(info)
    return found


def add_consumer(worker: Worker, queue: Any = None, exchange: Any = None, exchange_type: Any = None,
                 routing_key: Any = None, **options: Any) -> dict[str, str]:
    """Celery's ``add_consumer``: consume one more queue, as ``task_queues`` declares it, else on
    the exchange (``exchange``, ``exchange_type``, ``routing_key``) given, else as Celery makes a
    queue (the direct exchange of its name). A queue the broker has with other arguments is
    adopted; one it cannot be consumed as is answered with the reason, and the other queues go on
    being consumed."""
    if not isinstance(queue, str) or not queue.strip() or queue != queue.strip() or "," in queue:
        return nok(f"add_consumer needs one queue name, without commas or spaces around it (got {queue!r})")
    name = queue
    if name in worker.queues:
        return ok(f"already consuming from {name!r}")
    try:
        if exchange is None and exchange_type is None and routing_key is None:
            made = worker.app.topology.queue(name)
        else:
            data: dict[str, Any] = {"name": name, "exchange": exchange or name,
                                    "exchange_type": exchange_type or "direct",
                                    "routing_key": name if routing_key is None else routing_key}
            if isinstance(options.get("queue_arguments"), dict):
                data["queue_arguments"] = options["queue_arguments"]
            made = queue_from_data(data, f"add_consumer {name!r}")
        if worker.consumer is not None:
            worker.consumer.tasks.add_queue(made)
    except WorkerError as exc:
        logger.error("Cannot consume from %s: %s", name, exc)
        return nok(f"cannot consume from {name!r}: {exc}")
    except Exception as exc:
        logger.error("Cannot consume from %s: %s: %s", name, type(exc).__name__, exc)
        return nok(f"cannot consume from {name!r}: {type(exc).__name__}: {exc}")
    worker.queues.append(name)
    logger.info("Started consuming from %s", name)
    return ok(f"add consumer {name}")


def cancel_consumer(worker: Worker, queue: Any = None, **_celery: Any) -> dict[str, str]:
    """Celery's ``cancel_consumer``: stop consuming one queue."""
    if not isinstance(queue, str) or queue not in worker.queues:
        consumed = ", ".join(worker.queues) or "none"
        return nok(f"not consuming from {queue!r}; the queues consumed are {consumed}")
    worker.queues.remove(queue)
    if worker.consumer is not None:
        worker.consumer.tasks.cancel_queue(queue)
    logger.info("Stopped consuming from %s", queue)
    return ok(f"no longer consuming from {queue}")


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


def pool_restart(worker: Worker, modules: Any = None, reload: Any = False, reloader: Any = None,
                 **_celery: Any) -> dict[str, str]:
    """Celery's ``pool_restart``, answered only with ``worker_pool_restarts`` on: import the
    task modules (``modules``, by default those of the app's tasks) that are not imported yet,
    reload them too with ``reload``, then replace every pool process, so the new ones run the
    new code; each running task finishes first."""
    import importlib
    import sys

    if not worker.app.settings.worker_pool_restarts:
        return nok("pool restarts are not enabled on this worker: set worker_pool_restarts = True "
                   "in its configuration (WORKER_WORKER_POOL_RESTARTS=true) to allow pool_restart")
    pool = worker.pool
    if pool is None:
        return nok("the pool has not started")
    if not isinstance(pool, RestartsProcesses):
        return nok(f"the {type(pool).__name__} pool cannot restart its processes; restart the worker")
    if modules is not None and not (isinstance(modules, (list, tuple))
                                    and all(isinstance(name, str) and name for name in modules)):
        return nok(f"pool_restart takes modules as a list of module names (got {modules!r})")
    names = list(modules) if modules is not None else _task_modules(worker)
    try:
        for name in names:
            if name not in sys.modules:
                logger.debug("importing module %s", name)
                importlib.import_module(name)
            elif reload:
                logger.debug("reloading module %s", name)
                importlib.reload(sys.modules[name])
        pool.restart()
    except PoolError as exc:
        return nok(str(exc))
    except Exception as exc:
        logger.error("pool_restart failed: %s: %s", type(exc).__name__, exc)
        return nok(f"pool_restart failed: {type(exc).__name__}: {exc}")
    logger.info("Restarting the pool's processes (pool_restart)")
    return ok("reload started")


def _task_modules(worker: Worker) -> list[str]:
    """The modules that define the app's tasks (not the built-in ones)."""
    found = {task.module for name, task in worker.app.tasks.items() if not name.startswith(BUILTIN_PREFIX)}
    return sorted(module for module in found if module and module != "__main__")


def election(worker: Worker, id: Any = None, topic: Any = None, action: Any = None,
             **_celery: Any) -> None:
    """Celery's ``election`` among the workers of its gossip: this worker takes no part in
    gossip, and answers as a Celery worker started ``--without-gossip`` does (no answer)."""
    logger.debug("election %r on %r ignored: this worker takes no part in gossip", id, topic)


def hello(worker: Worker, from_node: Any = None, revoked: Any = None,
          **_celery: Any) -> dict[str, Any] | None:
    """Celery's ``hello``, which a starting Celery worker sends its neighbours (mingle): take the
    revoked ids it brings, answer with this worker's and the logical clock."""
    if not isinstance(from_node, str) or from_node == worker.hostname:
        return None
    logger.info("sync with %s", from_node)
    if isinstance(revoked, (list, tuple, dict)):
        worker.revoked.add(task_id for task_id in revoked if isinstance(task_id, str) and task_id)
    return {"revoked": list(worker.revoked), "clock": worker.clock.forward()}


def _task_ids(value: Any) -> list[str]:
    ids = [value] if isinstance(value, str) else value
    if not isinstance(ids, (list, tuple)) or not ids or not all(isinstance(i, str) and i for i in ids):
        raise ValueError(f"task_id must be a task id or a list of them (got {value!r})")
    return list(dict.fromkeys(ids))


def revoke(worker: Worker, task_id: Any = None, terminate: bool = False, signal: Any = None,
           **_celery: Any) -> dict[str, str]:
    """Celery's ``revoke``: remember the ids, so their messages are discarded when they come;
    discard those waiting here now; with ``terminate``, kill the process running them."""
    try:
        ids = _task_ids(task_id)
        signum = signal_number(signal if signal is not None else "TERM") if terminate else None
    except ValueError as exc:
        return nok(f"revoke: {exc}")
    worker.revoked.add(ids)
    worker.save_state()
    consumer = worker.consumer
    reservations = consumer.reservations if consumer is not None else None
    held = reservations.requests_by_id(ids) if reservations is not None else {}
    discarded = [request.id for request in reservations.revoke_waiting(ids)] if reservations else []
    _mark_revoked(worker, [task_id for task_id in ids if task_id not in held])
    if signum is None:
        logger.info("Tasks flagged as revoked: %s", ", ".join(ids))
        return ok(f"tasks {set(ids)} flagged as revoked")
    terminated, failed = list(discarded), []
    for task_id in ids:
        request = held.get(task_id)
        if request is None or request.finished:
            continue
        logger.info("Terminating %s (%s)", task_id, signals.Signals(signum).name)
        try:
            request.terminate(worker.pool, signum)
        except PoolError as exc:
            failed.append(f"{task_id}: {exc}")
        else:
            terminated.append(task_id)
    if failed:
        return nok("cannot terminate " + "; ".join(failed))
    if not terminated:
        return ok("terminate: tasks unknown")
    return ok("terminate: {}".format(", ".join(terminated)))


def _mark_revoked(worker: Worker, ids: list[str]) -> None:
    """Store REVOKED for tasks this worker does not hold, unless they already have a result or
    another state set by whoever runs them (as Celery does), so their clients stop waiting. A
    backend replying to the sender (rpc://) can neither read their states nor reach their
    clients without their messages: the worker that gets a message sends its REVOKED then."""
    backend = worker.app.backend
    if not ids or (isinstance(backend, DiscardsResults) and backend.discards_results) or isinstance(
            backend, RepliesToSender):
        return
    for task_id in ids:
        try:
            if backend.get_task_meta(task_id).get("status") in (PENDING, RECEIVED, RETRY, REJECTED):
                revoked = Outcome(REVOKED, exception=TaskRevokedError("revoked"), task_id=task_id)
                store_outcome(backend, revoked)
        except Exception as exc:
            logger.warning("Failed to mark task %s as revoked in the result backend: %s", task_id, exc)


def terminate(worker: Worker, signal: Any = None, task_id: Any = None, **_celery: Any) -> dict[str, str]:
    return revoke(worker, task_id, terminate=True, signal=signal)


def revoked(worker: Worker, **_celery: Any) -> list[str]:
    return list(worker.revoked)


def query_task(worker: Worker, ids: Any = None, **_celery: Any) -> dict[str, Any]:
    """``{id: [state, request]}`` for the ids this worker holds: active, reserved or scheduled."""
    consumer = worker.consumer
    try:
        wanted = _task_ids(ids)
    except ValueError:
        return {}
    if consumer is None:
        return {}
    held = consumer.reservations
    found = held.requests_by_id(wanted)
    return {task_id: ["active" if request in held.active else
                      "scheduled" if task_id in held.eta_held else "reserved", request_info(request)]
            for task_id, request in found.items()}


def _known_task(worker: Worker, name: Any) -> Any:
    return worker.app.tasks.get(name) if isinstance(name, str) else None


def _unknown_task(worker: Worker, name: Any) -> dict[str, str]:
    return nok(f"unknown task {name!r}.{did_you_mean(str(name), list(worker.app.tasks))}")


def rate_limit(worker: Worker, task_name: Any = None, rate_limit: Any = None,
               **_celery: Any) -> dict[str, str]:
    """Celery's ``rate_limit``: a new rate for one task type on this worker ("0" lifts it)."""
    task = _known_task(worker, task_name)
    if task is None:
        return _unknown_task(worker, task_name)
    try:
        parse_rate(rate_limit)
    except ValueError as exc:
        return nok(f"Invalid rate limit string: {exc}")
    if worker.app.settings.worker_disable_rate_limits:
        return nok("rate limits are disabled on this worker (worker_disable_rate_limits)")
    task.rate_limit = rate_limit
    if worker.consumer is not None:
        worker.consumer.reservations.rate_limits.set_rate(task.name, task.rate_per_second)
    if not task.rate_per_second:
        logger.info("Rate limits disabled for tasks of type %s", task.name)
        return ok("rate limit disabled successfully")
    logger.info("New rate limit for tasks of type %s: %s.", task.name, rate_limit)
    return ok("new rate limit set successfully")


def time_limit(worker: Worker, task_name: Any = None, soft: Any = None, hard: Any = None,
               **_celery: Any) -> dict[str, str]:
    """Celery's ``time_limit``: new soft and hard limits (seconds; None for the defaults) for
    one task type, applied to the tasks that start from now on."""
    task = _known_task(worker, task_name)
    if task is None:
        return _unknown_task(worker, task_name)
    try:
        task.set_time_limits(soft, hard)
    except ConfigurationError as exc:
        return nok(str(exc))
    logger.info("New time limits for tasks of type %s: soft=%s hard=%s", task.name, soft, hard)
    return ok("time limits set successfully")


def _events_switch(worker: Worker, on: bool) -> dict[str, str]:
    if dispatcher(worker) is None:
        return nok("event dispatcher unavailable")
    state = "enabled" if on else "disabled"
    if not (enable_task_events if on else disable_task_events)(worker):
        return ok(f"task events already {state}")
    logger.info("Events of group {task} %s by remote.", state)
    return ok(f"task events {state}")


def enable_events(worker: Worker, **_celery: Any) -> dict[str, str]:
    return _events_switch(worker, True)


def disable_events(worker: Worker, **_celery: Any) -> dict[str, str]:
    return _events_switch(worker, False)


def heartbeat(worker: Worker, **_celery: Any) -> None:
    """Send a worker-heartbeat event now (Celery's ``heartbeat``; no reply)."""
    if worker.consumer is not None:
        send_heartbeat(worker.consumer, "worker-heartbeat")


def shutdown(worker: Worker, msg: str = "", **_celery: Any) -> dict[str, str]:
    """Stop warmly. Asked again while stopping, it does nothing: a second stop request turns a
    warm shutdown cold, which kills running tasks, and a remote sender may not do that."""
    if worker.stopping:
        return ok("already shutting down")
    worker.request_stop()
    return ok("shutting down")


def _flag(word: str) -> bool:
    """A yes/no word of a command line (Celery's ``strtobool``)."""
    if word.strip().lower() in ("1", "true", "yes", "y", "on"):
        return True
    if word.strip().lower() in ("0", "false", "no", "n", "off"):
        return False
    raise ValueError("must be true or false")


_COMMANDS: Mapping[str, Command] = {
    command.name: command
    for command in (
        Command("ping", ping, help="Answer pong."),
        Command("stats", stats, help="Pool, prefetch, autoscaler, totals, uptime."),
        Command("clock", clock, help="The logical clock's value."),
        Command("active", active, help="Tasks running now."),
        Command("reserved", reserved, help="Tasks received and waiting for the pool."),
        Command("scheduled", scheduled, help="Tasks waiting for their ETA."),
        Command("registered", registered, variadic="taskinfoitems", signature="[ATTR...]",
                help="Task names this worker knows, with these attributes (rate_limit by default)."),
        Command("active_queues", active_queues, help="Queues this worker consumes."),
        Command("revoked", revoked, help="Ids of the revoked tasks this worker remembers."),
        Command("conf", conf, args=(("with_defaults", _flag),), signature="[INCLUDE_DEFAULTS=false]",
                help="The configuration: what differs from the defaults (all with true), secrets hidden."),
        Command("report", report, help="Software, platform and settings, for a bug report."),
        Command("memsample", memsample, help="Sample the worker process's resident memory."),
        Command("memdump", memdump, args=(("samples", int),), signature="[N_SAMPLES=10]",
                help="The memory samples taken since the last memdump, and the memory now."),
        Command("objgraph", objgraph, args=(("type", str), ("num", int), ("max_depth", int)),
                signature="[OBJECT_TYPE=Request [NUM=200 [MAX_DEPTH=10]]]",
                help="Draw what holds objects of a type alive into a PNG file (needs objgraph)."),
        Command("hello", hello, hidden=True, help="Trade revoked ids and the clock with a starting worker."),
        Command("query_task", query_task, variadic="ids", required=1,
                help="State of the tasks with these ids here."),
        Command("autoscale", autoscale, kind="control", args=(("max", int), ("min", int)), required=1,
                help="Change the autoscaler's MAX MIN."),
        Command("pool_grow", pool_grow, kind="control", args=(("n", int),), help="Add N processes."),
        Command("pool_shrink", pool_shrink, kind="control", args=(("n", int),),
                help="Remove N idle processes."),
        Command("pool_restart", pool_restart, kind="control",
                help="Replace every pool process (with worker_pool_restarts on)."),
        Command("revoke", revoke, kind="control", variadic="task_id", required=1,
                help="Discard the tasks with these ids (ID...)."),
        Command("terminate", terminate, kind="control", args=(("signal", str),), variadic="task_id",
                required=2,
                help="Revoke these tasks and kill their processes (SIGNAL ID...)."),
        Command("revoke_by_stamped_headers", revoke_by_stamped_headers, kind="control", variadic="headers",
                required=1, signature="KEY=VALUE...",
                help="Discard the tasks stamped with these headers (KEY=VALUE...)."),
        Command("rate_limit", rate_limit, kind="control", args=(("task_name", str), ("rate_limit", str)),
                required=2, help="Change a task's rate limit (TASK_NAME RATE, e.g. 10/m; 0 lifts it)."),
        Command("time_limit", time_limit, kind="control",
                args=(("task_name", str), ("soft", float), ("hard", float)), required=2,
                help="Change a task's time limits (TASK_NAME SOFT [HARD], seconds)."),
        Command("add_consumer", add_consumer, kind="control",
                args=(("queue", str), ("exchange", str), ("exchange_type", str), ("routing_key", str)),
                required=1, help="Consume one more queue (QUEUE [EXCHANGE [TYPE [ROUTING_KEY]]])."),
        Command("cancel_consumer", cancel_consumer, kind="control", args=(("queue", str),), required=1,
                help="Stop consuming a queue (QUEUE)."),
        Command("enable_events", enable_events, kind="control", help="Start sending task events."),
        Command("disable_events", disable_events, kind="control", help="Stop sending task events."),
        Command("heartbeat", heartbeat, kind="control", help="Send a worker-heartbeat event now."),
        Command("election", election, kind="control", help="Celery's gossip election: not taken part in."),
        Command("shutdown", shutdown, kind="control", help="Stop warmly."),
    )
}
#: Celery's older names for some commands, still answered (``dump_tasks`` is ``registered``)
ALIASES: Mapping[str, str] = {"dump_conf": "conf", "dump_active": "active", "dump_reserved": "reserved",
                              "dump_schedule": "scheduled", "dump_revoked": "revoked",
                              "dump_tasks": "registered"}
#: every command a worker answers without plugins, Celery's older names included
BUILTIN_COMMANDS: Mapping[str, Command] = {**_COMMANDS, **{
    alias: attrs.evolve(_COMMANDS[name], name=alias, hidden=True) for alias, name in ALIASES.items()}}
