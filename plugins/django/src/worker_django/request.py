"""A Django task's message in the worker's main process: handed to the pool with
:func:`~worker_django.execution.execute`, and the outcomes the worker decides itself (a time
limit, a lost process, a revoke) stored as Django's ``TaskResult`` (FAILED with the error, or
READY again when the message will be delivered again)."""

from __future__ import annotations

import logging
from typing import Any

from worker_core import Request
from worker_core.protocol import LOST_HEADER
from worker_core.results import RETRY, Outcome

from . import records
from .execution import error_of, execute, store

__all__ = ["DjangoRequest"]

logger = logging.getLogger("worker.django")


class DjangoRequest(Request):
    """A :class:`~worker_core.Request` whose task is a Django ``@task``."""

    __slots__ = ()

    @property
    def django_header(self) -> Any:
        return self.envelope.headers.get(records.HEADER)

    def execute_using_pool(self, pool: Any) -> None:
        soft, hard = self.limits()
        envelope = self.envelope
        again = bool((self.message.delivery_info or {}).get("redelivered")) or LOST_HEADER in envelope.headers
        self.pool_job = pool.apply_async(
            execute,
            (self.name, self.id, envelope.args, envelope.kwargs, self.django_header, again,
             self.consumer.result_reprs),
            callback=self.on_result,
            error_callback=self.on_error,
            accept_callback=self.on_accepted,
            timeout_callback=self.on_timeout,
            soft_timeout=soft,
            timeout=hard,
            name=self.name,
        )

    def store(self, outcome: Outcome) -> None:
        """Record what the worker decided became of the task in its ``TaskResult``: FAILED with
        the error (a time limit, a lost process, a revoke, a refused message), or READY when the
        message goes back to the broker to run again."""
        header = self.django_header
        if not isinstance(header, dict) or not header.get("results"):
            return
        from django.utils import timezone

        from . import framework

        backend = self.consumer.app.backend
        try:
            stored = records.read(backend.get_task_meta(self.id))
            task = records.task_of(self.name, header)
            if stored is not None:
                result = stored.result(self.id, task)
            else:
                result = framework.TaskResult(
                    task=task, id=self.id, status=framework.TaskResultStatus.READY,
                    enqueued_at=records.when(header.get("enqueued_at")), started_at=None, finished_at=None,
                    last_attempted_at=None, args=self.envelope.args, kwargs=self.envelope.kwargs,
                    backend=header.get("backend") or task.backend, errors=[], worker_ids=[])
        except Exception as exc:
            logger.error("could not store state %s for Django task %s: %s", outcome.state, self.label, exc)
            return
        if outcome.state == RETRY:
            object.__setattr__(result, "status", framework.TaskResultStatus.READY)
        else:
            exception = outcome.exception
            if exception is not None:
                result.errors.append(error_of(exception, outcome.traceback or f"{type(exception).__name__}: "
                                                                             f"{exception}\n"))
            object.__setattr__(result, "status", framework.TaskResultStatus.FAILED)
            object.__setattr__(result, "finished_at", timezone.now())
        store(backend, result)
