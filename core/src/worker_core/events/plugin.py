"""The ``events`` plugin of worker-core: Celery's monitoring events.

- **Worker events** (``worker-online``, ``worker-heartbeat`` every ``--heartbeat-interval``
  seconds, 2 by default, ``worker-offline``) are sent unless ``--without-heartbeat``: monitors
  such as Flower count a worker as online while its heartbeats arrive.
- **Task events** (``task-received``, ``-started``, ``-succeeded``, ``-failed``, ``-retried``,
  ``-rejected``, ``-revoked``) are sent with ``-E``/``--task-events`` or
  ``worker_send_task_events``, or once a monitor asks with ``enable_events``: a
  :class:`TaskEvents` plugin implementing the task hooks is registered while they are on, so a
  worker without them calls no hook per task for them.

The dispatcher lives in the worker's stash under :data:`DISPATCHER`.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..bootsteps import Condition, Step
from ..hookspecs import hookimpl
from ..options import OptionSpec
from ..protocol import safe_repr, to_iso
from ..slots import FansOutEvents
from ..stash import StashKey
from .dispatcher import EventDispatcher

if TYPE_CHECKING:
    from ..consumer.consumer import Consumer
    from ..options import WorkerOptions
    from ..request import Request
    from ..worker.worker import Worker

__all__ = ["DISPATCHER", "EventsStep", "HeartStep", "TaskEvents", "disable_task_events", "dispatcher",
           "enable_task_events", "send_heartbeat", "task_events_enabled"]

#: the worker's event dispatcher, while the Events step runs
DISPATCHER = StashKey[EventDispatcher]()
#: the name the task events plugin is registered under while task events are on
TASK_EVENTS_PLUGIN = "task-events"

logger = logging.getLogger("worker.events")

DEFAULT_INTERVAL = 2.0
#: what ``platform.system()`` says, without its import
SYSTEM = os.uname().sysname if hasattr(os, "uname") else sys.platform


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"must be a number of seconds (got {text!r})") from None
    if not value > 0 or value == float("inf"):
        raise ValueError(f"must be a number of seconds above 0 (got {text!r})")
    return value


@hookimpl
def worker_options() -> list[OptionSpec]:
    return [
        OptionSpec("task_events", ("-E", "--task-events", "--events"), is_flag=True,
                   help="Send task events for monitors such as Flower (also worker_send_task_events)."),
        OptionSpec("without_heartbeat", ("--without-heartbeat",), is_flag=True,
                   help="Send no worker-online/heartbeat/offline events."),
        OptionSpec("heartbeat_interval", ("--heartbeat-interval",), convert=_interval,
                   help=f"Seconds between worker-heartbeat events (default {DEFAULT_INTERVAL:g})."),
    ]


@hookimpl
def worker_bootsteps(blueprint: str) -> list[Step[Any]]:
    return [EventsStep(), HeartStep()] if blueprint == "consumer" else []


def task_events_enabled(consumer: Consumer) -> bool:
    return bool(consumer.options.extra.get("task_events") or consumer.app.settings.worker_send_task_events)


def dispatcher(worker: Worker) -> EventDispatcher | None:
    """The worker's event dispatcher, None while the Events step does not run."""
    return worker.stash.get(DISPATCHER, None)


class EventsStep(Step["Consumer"]):
    """Opens the event channel; with task events on, sends one event per task hook."""

    name = "Events"
    requires = ("Connection",)
    label = "monitoring events on the celeryev exchange"

    def describe(self, options: WorkerOptions) -> str:
        task = "worker and task events" if options.extra.get("task_events") else "worker events"
        return f"{task} on the celeryev exchange"

    def start(self, consumer: Consumer) -> None:
        connection = consumer.broker.connection
        assert connection is not None
        worker = consumer.worker
        transport = consumer.broker.transport
        events = worker.stash[DISPATCHER] = EventDispatcher(
            connection, consumer.hostname, task_events=task_events_enabled(consumer), clock=worker.clock,
            fanout=isinstance(transport, FansOutEvents) and transport.fans_out_events)
        if events.task_events:
            enable_task_events(worker)

    def stop(self, consumer: Consumer) -> None:
        worker = consumer.worker
        disable_task_events(worker)
        events = dispatcher(worker)
        if events is not None:
            events.close()
            del worker.stash[DISPATCHER]


class HeartStep(Step["Consumer"]):
    """``worker-online`` now, ``worker-heartbeat`` every interval, ``worker-offline`` at stop."""

    name = "Heart"
    requires = ("Events",)
    condition = Condition("--without-heartbeat is not given",
                          lambda options: not options.extra.get("without_heartbeat"))

    def __init__(self) -> None:
        super().__init__()
        self._entry: Any = None

    def describe(self, options: WorkerOptions) -> str:
        return f"worker-heartbeat every {heartbeat_interval(options):g} s"

    def start(self, consumer: Consumer) -> None:
        assert consumer.timer is not None
        send_heartbeat(consumer, "worker-online")
        self._entry = consumer.timer.call_repeatedly(heartbeat_interval(consumer.options), send_heartbeat,
                                                     (consumer, "worker-heartbeat"))

    def stop(self, consumer: Consumer) -> None:
        if self._entry is not None:
            self._entry.cancel()
            self._entry = None
            if not consumer.broker.lost:
                send_heartbeat(consumer, "worker-offline")


def heartbeat_interval(options: WorkerOptions) -> float:
    return float(options.extra.get("heartbeat_interval") or DEFAULT_INTERVAL)


def send_heartbeat(consumer: Consumer, kind: str) -> None:
    events = dispatcher(consumer.worker)
    if events is None:
        return
    reservations = consumer.reservations
    events.send(kind, freq=heartbeat_interval(consumer.options), active=len(reservations.active),
                processed=sum(reservations.totals.values()),
                loadavg=[round(load, 2) for load in os.getloadavg()], sw_ident="py-worker",
                sw_ver=__version__, sw_sys=SYSTEM)
    consumer.notify("heartbeat_sent", worker=consumer.worker, event=kind)


# -- task events ------------------------------------------------------------------------------


def _received(request: Request) -> dict[str, Any]:
    envelope = request.envelope
    headers = envelope.headers
    argsrepr, kwargsrepr = headers.get("argsrepr"), headers.get("kwargsrepr")
    return {"name": request.shown_name,  # the shadow name, as Celery sends it (Flower shows it)
            "args": argsrepr if isinstance(argsrepr, str) else safe_repr(envelope.args, 1024),
            "kwargs": kwargsrepr if isinstance(kwargsrepr, str) else safe_repr(envelope.kwargs, 1024),
            "root_id": envelope.root_id, "parent_id": envelope.parent_id, "retries": envelope.retries,
            "eta": to_iso(envelope.eta) if envelope.eta else None,
            "expires": to_iso(envelope.expires) if envelope.expires else None}


class TaskEvents:
    """The task hooks, each sending its event (registered while task events are on)."""

    def __init__(self, events: EventDispatcher) -> None:
        self.events = events

    def _send(self, kind: str, request: Request, **fields: Any) -> None:
        try:
            self.events.send(kind, uuid=request.id, **fields)
        except Exception:
            logger.exception("Could not send the %s event for %s", kind, request.label)

    @hookimpl
    def task_received(self, request: Request) -> None:
        self._send("task-received", request, **_received(request))

    @hookimpl
    def task_started(self, request: Request, pid: int) -> None:
        self._send("task-started", request, pid=pid)

    @hookimpl
    def task_succeeded(self, request: Request, runtime: float, result: str | None) -> None:
        self._send("task-succeeded", request, result=result, runtime=runtime)

    @hookimpl
    def task_failed(self, request: Request, exception: BaseException, traceback: str) -> None:
        # Celery's event carries the exception's repr
        self._send("task-failed", request, exception=safe_repr(exception, 500), traceback=traceback)

    @hookimpl
    def task_retried(self, request: Request, reason: str) -> None:
        self._send("task-retried", request, exception=reason, traceback="")

    @hookimpl
    def task_rejected(self, request: Request | None, requeue: bool) -> None:
        if request is not None:
            self._send("task-rejected", request, requeue=requeue)

    @hookimpl
    def task_revoked(self, request: Request, reason: str) -> None:
        self._send("task-revoked", request, terminated=reason == "terminated", signum=None,
                   expired=reason == "expired")


def enable_task_events(worker: Worker) -> bool:
    """Send task events from now on; False if they were on already, or cannot be (no Events)."""
    events = dispatcher(worker)
    if events is None or worker.plugins.has_plugin(TASK_EVENTS_PLUGIN):
        return False
    events.task_events = True
    worker.plugins.register(TaskEvents(events), TASK_EVENTS_PLUGIN)
    return True


def disable_task_events(worker: Worker) -> bool:
    """Stop sending task events; False if they were off already."""
    events = dispatcher(worker)
    if events is not None:
        events.task_events = False
    if not worker.plugins.has_plugin(TASK_EVENTS_PLUGIN):
        return False
    worker.plugins.unregister(TASK_EVENTS_PLUGIN)
    return True
