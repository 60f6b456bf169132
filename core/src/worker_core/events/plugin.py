"""The ``events`` plugin of worker-core: Celery's monitoring events.

- **Worker events** (``worker-online``, ``worker-heartbeat`` every ``--heartbeat-interval``
  seconds, 2 by default, ``worker-offline``) are sent unless ``--without-heartbeat``: monitors
  such as Flower count a worker as online while its heartbeats arrive.
- **Task events** (``task-received``, ``-started``, ``-succeeded``, ``-failed``, ``-retried``,
  ``-rejected``, ``-revoked``) are sent with ``-E``/``--task-events`` or
  ``worker_send_task_events``, or once a monitor asks with ``enable_events``. They ride on the
  worker's observer hooks only while on, so a worker without them pays nothing per task.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..bootsteps import Condition, Step
from ..hookspecs import hookimpl
from ..options import OptionSpec
from ..protocol import safe_repr, to_iso
from .dispatcher import EventDispatcher

if TYPE_CHECKING:
    from ..consumer.consumer import Consumer
    from ..options import WorkerOptions
    from ..request import Request

__all__ = ["EventsStep", "HeartStep", "task_events_enabled"]

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
        OptionSpec("task_events", ("-E", "--task-events"), is_flag=True,
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
        consumer.events = EventDispatcher(connection, consumer.hostname,
                                          task_events=task_events_enabled(consumer))
        if consumer.events.task_events:
            enable_task_events(consumer)

    def stop(self, consumer: Consumer) -> None:
        disable_task_events(consumer)
        if consumer.events is not None:
            consumer.events.close()
            consumer.events = None


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
    from .. import __version__

    if consumer.events is None:
        return
    reservations = consumer.reservations
    consumer.events.send(kind, freq=heartbeat_interval(consumer.options), active=len(reservations.active),
                         processed=sum(reservations.totals.values()),
                         loadavg=[round(load, 2) for load in os.getloadavg()], sw_ident="py-worker",
                         sw_ver=__version__, sw_sys=SYSTEM)


# -- task events ------------------------------------------------------------------------------


def _received(request: Request) -> dict[str, Any]:
    envelope = request.envelope
    headers = envelope.headers
    argsrepr, kwargsrepr = headers.get("argsrepr"), headers.get("kwargsrepr")
    return {"name": request.name,
            "args": argsrepr if isinstance(argsrepr, str) else safe_repr(envelope.args, 1024),
            "kwargs": kwargsrepr if isinstance(kwargsrepr, str) else safe_repr(envelope.kwargs, 1024),
            "root_id": envelope.root_id, "parent_id": envelope.parent_id, "retries": envelope.retries,
            "eta": to_iso(envelope.eta) if envelope.eta else None,
            "expires": to_iso(envelope.expires) if envelope.expires else None}


#: hook -> (event type, the event's fields from the hook's arguments)
TASK_EVENTS: dict[str, tuple[str, Callable[..., dict[str, Any]]]] = {
    "task_received": ("task-received", lambda request, **_: _received(request)),
    "task_started": ("task-started", lambda request, pid, **_: {"pid": pid}),
    "task_succeeded": ("task-succeeded", lambda request, runtime, result=None, **_: {
        "result": result, "runtime": runtime}),
    "task_failed": ("task-failed", lambda request, exception, traceback, **_: {
        "exception": exception, "traceback": traceback}),
    "task_retried": ("task-retried", lambda request, reason, **_: {"exception": reason, "traceback": ""}),
    "task_rejected": ("task-rejected", lambda request, requeue, **_: {"requeue": requeue}),
    "task_revoked": ("task-revoked", lambda request, reason, **_: {
        "terminated": reason == "terminated", "signum": None, "expired": reason == "expired"}),
}


def enable_task_events(consumer: Consumer) -> bool:
    """Send task events from now on; False if they were on already."""
    events = consumer.events
    if events is None or getattr(consumer.notify, "sends_task_events", False):
        return False
    events.task_events = True
    inner = consumer.notify
    consumer.result_reprs = True

    def notify(hook: str, **kwargs: Any) -> None:
        found = TASK_EVENTS.get(hook)
        request = kwargs.get("request")
        if found is not None and request is not None and consumer.events is not None:
            kind, fields = found
            try:
                consumer.events.send(kind, uuid=request.id, **fields(**kwargs))
            except Exception:
                logger.exception("Could not build the %s event for %s", kind, request.label)
        inner(hook, **kwargs)

    notify.sends_task_events = True  # type: ignore[attr-defined]
    notify.inner = inner  # type: ignore[attr-defined]
    consumer.notify = notify  # type: ignore[method-assign]
    return True


def disable_task_events(consumer: Consumer) -> bool:
    """Stop sending task events; False if they were off already."""
    notify = consumer.notify
    if consumer.events is not None:
        consumer.events.task_events = False
    if not getattr(notify, "sends_task_events", False):
        return False
    consumer.notify = notify.inner  # type: ignore[attr-defined,method-assign]
    consumer.result_reprs = consumer.log_info
    return True
