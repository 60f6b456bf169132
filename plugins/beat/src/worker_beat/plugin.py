"""Hook implementations: ``-B``/``-s``/``--scheduler`` for ``workerctl worker`` and the Beat step
they turn on, the ``workerctl beat`` command, the ``inspect beat`` command, and the scheduler's
gauges in the worker's metrics."""

from __future__ import annotations

import logging
from typing import Any

from worker_core import Condition, ControlCommand, OptionSpec, StashKey, Step, WorkerOptions, hookimpl
from worker_core.hookspecs import Gauge

from .service import BeatService

__all__ = ["SERVICE", "BeatStep"]

logger = logging.getLogger("worker.beat")

#: the scheduler of a worker started with ``-B``
SERVICE = StashKey[BeatService]()


def _path(text: str) -> str:
    if not text.strip():
        raise ValueError("must name a file")
    return text


@hookimpl
def worker_options() -> list[OptionSpec]:
    return [
        OptionSpec("beat", ("-B", "--beat"), is_flag=True,
                   help="Run the periodic-task scheduler in this worker (every worker of a fleet may: one "
                        "of them sends each tick)."),
        OptionSpec("schedule_filename", ("-s", "--schedule-filename", "--schedule"), convert=_path,
                   help="Celery's file of the scheduler's state; not used here (the state is kept on the "
                        "broker)."),
        OptionSpec("scheduler", ("--scheduler",),
                   help="Where entries come from besides beat_schedule: store (the default where the broker "
                        "keeps records: workerctl beat add) or settings."),
    ]


class BeatStep(Step[Any]):
    """Runs one scheduler of the fleet on a thread of the worker's main process: it waits for the
    lease, and sends the periodic tasks while it holds it."""

    name = "Beat"
    after = ("Pool",)
    condition = Condition("-B is given", lambda options: bool(options.extra.get("beat")))

    def describe(self, options: WorkerOptions) -> str:
        return "send the periodic tasks (beat_schedule) while this worker holds the lease 'beat'"

    def start(self, worker: Any) -> None:
        extra = worker.options.extra
        service = BeatService(worker.app, worker.hostname, scheduler=extra.get("scheduler"),
                              schedule_file=extra.get("schedule_filename"))
        worker.stash[SERVICE] = service
        service.start()

    def stop(self, worker: Any) -> None:
        service = worker.stash.get(SERVICE, None)
        if service is not None:
            service.stop()  # releases the lease: another worker sends at once

    def terminate(self, worker: Any) -> None:
        self.stop(worker)


@hookimpl
def worker_bootsteps(blueprint: str) -> list[Step[Any]]:
    return [BeatStep()] if blueprint == "worker" else []


def _inspect_beat(worker: Any, **_celery: Any) -> dict[str, Any]:
    service = worker.stash.get(SERVICE, None)
    if service is None:
        return {"error": "this worker runs no scheduler (start it with -B)"}
    info: dict[str, Any] = service.info()
    return info


@hookimpl
def worker_control_commands() -> list[ControlCommand]:
    return [ControlCommand("beat", _inspect_beat, kind="inspect",
                           help="The scheduler: whether this worker sends the periodic tasks, its lease, and "
                                "each entry's next run and last send.")]


@hookimpl
def worker_gauges(worker: Any) -> list[Gauge]:
    service = worker.stash.get(SERVICE, None)
    if service is None:
        return []
    scheduler = service.scheduler
    return [
        Gauge("worker_beat_leader", "1 while this worker's scheduler holds the lease and sends the periodic "
                                    "tasks, else 0.", 1.0 if service.election.leading else 0.0),
        Gauge("worker_beat_entries", "Entries of the schedule this scheduler knows.",
              float(scheduler.entry_count)),
        Gauge("worker_beat_ticks_sent", "Ticks this worker's scheduler sent since it started.",
              float(scheduler.sent)),
        Gauge("worker_beat_lease_terms", "Times this worker's scheduler took the lease.",
              float(service.election.terms)),
    ]


@hookimpl
def workerctl_commands() -> dict[str, Any]:
    from .cli import beat

    command: Any = beat
    return {"beat": command}
