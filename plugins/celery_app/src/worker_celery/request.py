"""A Celery app's task message in the worker's main process: handed to the pool as Celery's
worker hands it (the message's headers as Celery's request, the embed), and the states the worker
decides itself stored as Celery's worker stores them (errbacks and chords included)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, cast

from worker_core import Request
from worker_core.results import FAILURE, RETRY, REVOKED, Outcome

from .execution import execute
from .tasks import CeleryTaskView

if TYPE_CHECKING:
    from celery import Celery
    from celery.app.task import Context

__all__ = ["CeleryRequest"]

logger = logging.getLogger("worker.request")


class CeleryRequest(Request):
    """A :class:`~worker_core.request.Request` whose task runs through Celery's tracer."""

    __slots__ = ()

    def celery_request(self) -> dict[str, Any]:
        """The request as Celery's worker builds it: the headers, then the message's properties
        and delivery as ``properties``, ``reply_to``, ``correlation_id``, ``hostname`` and
        ``delivery_info`` (``self.request`` in the task, and what Celery's backends read)."""
        message = self.message
        properties = message.properties or {}
        request = dict(self.envelope.headers)
        request.update(properties=properties, reply_to=properties.get("reply_to"),
                       correlation_id=properties.get("correlation_id"), hostname=self.consumer.hostname,
                       delivery_info=self.delivery_info())
        return request

    def execute_using_pool(self, pool: Any) -> None:
        soft, hard = self.limits()
        envelope = self.envelope
        self.pool_job = pool.apply_async(
            execute,
            (self.name, self.id, self.celery_request(), envelope.args, envelope.kwargs, envelope.embed,
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
        """Record a state the worker decided (revoked, expired, a lost process, a time limit, a
        task cancelled after a lost connection) through the Celery app's backend, as Celery's
        worker does: ``mark_as_revoked``/``mark_as_failure``/``mark_as_retry``, which also count
        a chord's part and call the errbacks (the exception as Celery's own class, rebuilt from
        the core's encoding)."""
        task = cast(CeleryTaskView, self.task).celery
        ignored = self.envelope.ignore_result or self.task.ignore_result
        store_errors = not ignored or task.store_errors_even_if_ignored
        backend = task.backend
        context = self.context(task.app)
        state, traceback, result = outcome.state, outcome.traceback, outcome.stored()
        exc = backend.exception_to_python(result) if isinstance(result, dict) else result
        try:
            if state == REVOKED:
                backend.mark_as_revoked(self.id, str(exc) or "revoked", request=context,
                                        store_result=store_errors)
            elif state == FAILURE:
                backend.mark_as_failure(self.id, exc, traceback, request=context, store_result=store_errors,
                                        call_errbacks=True)
            elif state == RETRY:
                if store_errors:
                    backend.mark_as_retry(self.id, exc, traceback, request=context)
            elif store_errors:
                backend.store_result(self.id, result, state, traceback, request=context)
        except Exception:
            logger.exception("could not store state %s for task %s", state, self.label)

    def follow(self, state: str, exc: BaseException, traceback: str | None) -> None:
        """Nothing more to do: :meth:`store` went through the Celery app's backend, whose
        ``mark_as_failure``/``mark_as_revoked`` already counted the chord's part, failed the
        rest of the chain and called the errbacks."""

    def context(self, app: Celery) -> Context:
        """Celery's ``Context`` of this request, with the embed (errbacks, chord) its backend's
        failure handling reads."""
        from celery.app.task import Context

        request = self.celery_request()
        envelope = self.envelope
        request.update(args=envelope.args, kwargs=envelope.kwargs, is_eager=False)
        request.update(envelope.embed or {})
        return Context(request)
