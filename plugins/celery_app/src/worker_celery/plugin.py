"""The ``celery`` plugin: Celery's worker signals at the matching moments of this worker, its
logging set-up, and each pool process prepared as Celery prepares its own, while the worker runs
a Celery app (for this project's apps every hook returns at once).

| Celery signal | sent |
|---|---|
| ``celeryd_init``, ``worker_init``, ``setup_logging`` (and ``after_setup_logger``,
  ``after_setup_task_logger``), ``celeryd_after_setup`` | in that order, in the main process,
  when the worker object exists and before any step starts |
| ``worker_process_init`` / ``worker_process_shutdown`` | in each prefork child as it starts /
  ends without being killed, and ``worker_process_init`` once with the solo pool, as Celery's
  pools send them |
| ``worker_ready`` | once the consumer takes messages |
| ``heartbeat_sent`` | after each worker event (online, heartbeat, offline) |
| ``worker_shutting_down`` | when a warm or cold stop is asked for |
| ``worker_shutdown`` | once every step has stopped (the pool's processes have ended) |
| ``task_received``, ``task_revoked`` | in the main process, as a message becomes a request and
  when a task will not run (while someone is connected to them at start) |
"""

from __future__ import annotations

import logging
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

from worker_core.hookspecs import hookimpl
from worker_core.redaction import SecretFilter, redact_url
from worker_core.stash import StashKey

if TYPE_CHECKING:
    from celery import Celery

    from worker_core import Request, Worker

__all__ = ["MAIN_PROCESS_TASK_SIGNALS", "SENDER", "CeleryWorker", "MainProcessTaskSignals"]

logger = logging.getLogger("worker.celery")


class CeleryWorker:
    """The worker as Celery's signal receivers see it (``sender``/``instance``): Celery's
    ``WorkController`` names over this worker (``app`` is the Celery app)."""

    def __init__(self, worker: Worker, celery: Celery) -> None:
        self.app = celery
        self.worker = worker
        self.hostname = worker.hostname
        self.pid = worker.pid
        self.pool_cls = worker.options.pool
        self.concurrency = worker.options.concurrency
        self.loglevel = worker.options.loglevel

    @property
    def consumer(self) -> Any:
        return self.worker.consumer

    @property
    def pool(self) -> Any:
        return self.worker.pool

    def __repr__(self) -> str:
        return f"<CeleryWorker {self.hostname}>"


#: what Celery's signals name as the worker, while a Celery app runs
SENDER = StashKey[CeleryWorker]()


def _celery(worker: Worker) -> Celery | None:
    """The Celery app the worker runs, if it runs one. Nothing of Celery is imported otherwise:
    its adapter module is only there once the app loader adapted a Celery app."""
    if f"{__package__}.app" not in sys.modules:
        return None
    from .app import CeleryApp

    app = worker.app
    return app.celery if isinstance(app, CeleryApp) else None


def _execution() -> ModuleType | None:
    """The executor's module in a process that runs a Celery app's tasks (see :func:`_celery`)."""
    module = sys.modules.get(f"{__package__}.execution")
    return module if module is not None and module.installed() is not None else None


@hookimpl(tryfirst=True)
def worker_init(worker: Worker) -> None:
    celery = _celery(worker)
    if celery is None:
        return
    from celery import signals

    from . import execution
    from .app import CeleryApp

    assert isinstance(worker.app, CeleryApp)
    urls = ";".join(worker.plan.selection.broker_urls)
    if celery.conf.broker_url != urls:  # -b or WORKER_BROKER_URL: tasks publish there too
        celery.conf.broker_url = urls
    execution.install(celery, worker.hostname, worker.options.pool)
    sender = worker.stash[SENDER] = CeleryWorker(worker, celery)
    logger.info("Celery app %s: results through its own backend, %s", worker.app.spec,
                redact_url(celery.backend.as_uri()) if celery.conf.result_backend else "disabled")
    for line in worker.app.notes:
        logger.warning("Celery setting %s", line)
    for line in worker.app.task_notes:
        logger.warning("Celery task %s", line)
    signals.celeryd_init.send(sender=worker.hostname, instance=sender, conf=celery.conf,
                              options=dict(worker.options.extra))
    signals.worker_init.send(sender=sender)
    custom = _setup_logging(celery, worker)
    signals.celeryd_after_setup.send(sender=worker.hostname, instance=sender, conf=celery.conf)
    if not custom and celery.conf.worker_redirect_stdouts:
        celery.log.redirect_stdouts(celery.conf.worker_redirect_stdouts_level)
    if signals.task_received.receivers or signals.task_revoked.receivers:
        # per-task hooks only while someone listens: a worker without them pays nothing per task
        worker.plugins.register(MainProcessTaskSignals(celery), MAIN_PROCESS_TASK_SIGNALS)


def _setup_logging(celery: Celery, worker: Worker) -> bool:
    """Celery's logging set-up (``setup_logging``, then its own handlers, hijacking the root
    logger when ``worker_hijack_root_logger``, and ``after_setup_*``), keeping the worker's guard
    that hides secrets on every handler. True when a ``setup_logging`` receiver did it all."""
    root = logging.getLogger()
    guards = [f for handler in root.handlers for f in handler.filters if isinstance(f, SecretFilter)]
    # --logfile as given: Celery expands its %n, %i and %I for the node, as under celery worker
    custom = bool(celery.log.setup(worker.options.loglevel, worker.options.logfile, redirect_stdouts=False,
                                   hostname=worker.hostname))
    for handler in root.handlers:
        for guard in guards[:1]:
            if guard not in handler.filters:
                handler.addFilter(guard)
    return custom


#: the name :class:`MainProcessTaskSignals` is registered under while a Celery app runs
MAIN_PROCESS_TASK_SIGNALS = "celery-task-signals"


class MainProcessTaskSignals:
    """Celery's task signals of the worker's main process: ``task_received`` when a message
    becomes a request, ``task_revoked`` when a task will not run (revoked, expired, terminated).
    The ``request`` they carry is Celery's ``Context`` of the message (``id``, ``task``,
    ``args``, ``kwargs``, the headers); the tracer sends the others where the task runs."""

    def __init__(self, celery: Celery) -> None:
        self.celery = celery

    @hookimpl
    def task_received(self, request: Request) -> None:
        from celery import signals

        if signals.task_received.receivers:
            signals.task_received.send(sender=request.consumer.worker.stash[SENDER],
                                       request=_context(request, self.celery))

    @hookimpl
    def task_revoked(self, request: Request, reason: str) -> None:
        from celery import signals

        if signals.task_revoked.receivers:
            signals.task_revoked.send(sender=getattr(request.task, "celery", None),
                                      request=_context(request, self.celery), signum=None,
                                      terminated=reason == "terminated", expired=reason == "expired")


def _context(request: Request, celery: Celery) -> Any:
    from .request import CeleryRequest

    return request.context(celery) if isinstance(request, CeleryRequest) else None


@hookimpl
def worker_process_init(pid: int) -> None:
    execution = _execution()
    if execution is None:
        return
    from celery import signals

    celery = execution.installed()
    if execution.is_pool_process():
        from celery._state import _set_task_join_will_block

        _set_task_join_will_block(True)  # result.get() in a task fails, as in Celery's children
        celery.loader.init_worker()
        celery.loader.init_worker_process()
    execution.prepare_process()
    # Celery's solo pool sends it once, in the worker's process; its threads pool never does
    if execution.is_pool_process() or execution.pool() == "solo":
        signals.worker_process_init.send(sender=execution.hostname())


@hookimpl
def worker_process_shutdown(pid: int, exitcode: int) -> None:
    execution = _execution()
    if execution is None or not execution.is_pool_process():
        return
    from celery import signals

    signals.worker_process_shutdown.send(sender=execution.hostname(), pid=pid, exitcode=exitcode)


@hookimpl
def worker_ready(worker: Worker) -> None:
    if _celery(worker) is None:
        return
    from celery import signals

    signals.worker_ready.send(sender=worker.stash[SENDER])


@hookimpl
def heartbeat_sent(worker: Worker, event: str) -> None:
    if _celery(worker) is None:
        return
    from celery import signals

    if signals.heartbeat_sent.receivers:
        signals.heartbeat_sent.send(sender=worker.stash[SENDER])


@hookimpl
def worker_shutting_down(worker: Worker, how: str) -> None:
    if _celery(worker) is None:
        return
    from celery import signals

    signals.worker_shutting_down.send(sender=worker.hostname, sig=None, how=how.capitalize(), exitcode=0)


@hookimpl
def worker_stopped(worker: Worker, how: str) -> None:
    if _celery(worker) is None:
        return
    from celery import signals

    signals.worker_shutdown.send(sender=worker.stash[SENDER])
