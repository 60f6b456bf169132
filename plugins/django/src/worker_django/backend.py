"""``WorkerBackend``: a backend of Django's task framework (``TASKS = {"default": {"BACKEND":
"worker_django.WorkerBackend", ...}}``) that sends each enqueued task as a Celery protocol v2
message on one of this worker's transports, and reads its result back from the result backend
the worker stores it in."""

from __future__ import annotations

import uuid
from typing import Any, ClassVar

from worker_core import App
from worker_core.exceptions import WorkerError
from worker_core.options import scheme_of
from worker_core.results import PENDING
from worker_core.slots import OrdersByPriority, RepliesToSender

from . import framework, records
from .configuration import default_result_backend, priority_scale, worker_settings

__all__ = ["WorkerBackend"]


class WorkerBackend(framework.BaseTaskBackend):  # type: ignore[misc]
    """Sends Django's tasks to ``workerctl worker`` (or ``manage.py worker``).

    ``OPTIONS`` are worker settings: ``broker_url`` (the embedded transport, a file in
    ``./.worker/``, when not given), ``result_backend`` (the broker's own when a result backend
    serves its scheme), and any other (``task_acks_late``, ``result_expires``, ...).
    ``QUEUES`` are the queue names tasks may use, each a queue of the broker.
    """

    #: ``run_after`` becomes the message's ETA: the worker holds it until then
    supports_defer: ClassVar[bool] = True
    #: ``async def`` tasks run to completion in the pool's process or thread
    supports_async_task: ClassVar[bool] = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        settings, problems = worker_settings(self.options)
        #: the worker settings ``OPTIONS`` give
        self.settings: dict[str, Any] = settings
        #: what is wrong with ``OPTIONS``, one line each (``manage.py check`` lists them)
        self.problems: list[str] = problems
        self._app: App | None = None
        self._capabilities: tuple[type | None, tuple[int, int] | None, bool] | None = None

    # -- the worker's client ---------------------------------------------------------------------

    @property
    def app(self) -> App:
        """The worker's client these tasks are sent with (made on first use)."""
        app = self._app
        if app is None:
            if self.problems:
                from django.core.exceptions import ImproperlyConfigured

                raise ImproperlyConfigured(f"TASKS[{self.alias!r}]: {self.problems[0]}")
            settings = dict(self.settings)
            app = App(f"django-{self.alias}")
            default_result_backend(settings, app.plugins)
            app.conf.update(**settings)
            self._app = app
        return app

    def capabilities(self) -> tuple[type | None, tuple[int, int] | None, bool]:
        """``(transport, order, results)``, decided once: the transport's class (None when none
        serves the broker's scheme), its priority order (see
        :class:`~worker_core.slots.OrdersByPriority`), and whether results are stored where any
        process reads them by id (a result backend is set, and is not ``rpc://``, whose results
        go to the sender alone)."""
        found = self._capabilities
        if found is None:
            app = self.app
            try:
                transport: type | None = app.plugins.slot("transport", scheme_of(app.broker_urls[0]))
            except WorkerError:
                transport = None
            order = None
            if transport is not None and isinstance(transport, OrdersByPriority):
                order = transport.priority_order(app.settings)
            try:
                url = app.result_url()
                backend = None if scheme_of(url) == "disabled" else app.plugins.slot(
                    "result_backend", scheme_of(url))
            except WorkerError:
                backend = None
            found = self._capabilities = (transport, order,
                                          backend is not None and not isinstance(backend, RepliesToSender))
        return found

    @property
    def supports_priority(self) -> bool:
        """Whether the transport serves the higher priority first; True while the settings or
        the transport are wrong, so that what a task is told is not about its priority
        (``manage.py check`` says what is wrong)."""
        if self.problems:
            return True
        transport, order, _ = self.capabilities()
        return transport is None or order is not None

    @property
    def supports_get_result(self) -> bool:
        """Whether results are stored where any process reads them by id."""
        return not self.problems and self.capabilities()[2]

    # -- sending -------------------------------------------------------------------------------

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        from django.utils import timezone

        self.validate_task(task)
        app = self.app
        results = self.supports_get_result
        result = framework.TaskResult(
            task=task, id=str(uuid.uuid4()), status=framework.TaskResultStatus.READY,
            enqueued_at=timezone.now(), started_at=None, last_attempted_at=None, finished_at=None,
            args=args, kwargs=kwargs, backend=self.alias, errors=[], worker_ids=[])
        if results:  # before the message: a fast worker's RUNNING is never overwritten by it
            app.backend.store_result(result.id, records.record_of(result), PENDING)
        order = self.capabilities()[1]
        # ignore_result: the worker stores Django's record itself (the header says whether)
        app.send_task(task.module_path, result.args, result.kwargs, task_id=result.id, queue=task.queue_name,
                      priority=priority_scale(order, task.priority), eta=task.run_after, ignore_result=True,
                      headers={records.HEADER: records.header_of(result, results)})
        framework.signals.task_enqueued.send(type(self), task_result=result)
        return result

    # -- results -------------------------------------------------------------------------------

    def get_result(self, result_id: str) -> Any:
        if not self.supports_get_result:
            return super().get_result(result_id)
        stored = records.read(self.app.backend.get_task_meta(str(result_id)))
        if stored is None:
            raise framework.TaskResultDoesNotExist(result_id)
        return stored.result(str(result_id))

    async def aget_result(self, result_id: str) -> Any:
        # a read needs no thread of Django's (no transaction): any thread of the executor
        from asgiref.sync import sync_to_async

        return await sync_to_async(self.get_result, thread_sensitive=False)(result_id)

    # -- checks --------------------------------------------------------------------------------

    def check(self, **kwargs: Any) -> list[Any]:
        from .checks import check_backend

        return [*super().check(**kwargs), *check_backend(self)]
