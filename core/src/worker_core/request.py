"""A received task message on the worker side: dispatch to the pool, then acknowledge,
reject or requeue it by Celery's rules once the pool reports back.

One module: a request's states and the rules between them (accepted, done, failed, lost, revoked,
terminated) read best side by side.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from .app.context import TaskContext, pop, push
from .app.handlers import ExceptionInfo, call_in_main_process
from .canvas.after import Workflow
from .exceptions import (
    JobWithdrawn,
    PoolError,
    Reject,
    Retry,
    TaskRevokedError,
    TimeLimitExceeded,
    WorkerLostError,
)
from .execution import LEASE_LOST, execute, request_mapping
from .protocol import LOST_HEADER, TaskEnvelope, custom_headers, safe_repr, shown, to_iso
from .protocol.headers import PROTOCOL_HEADERS, carried_count
from .results.meta import FAILURE, REJECTED, RETRY, REVOKED, SUCCESS
from .results.outcome import Outcome, store_outcome
from .slots import StopsOneJob

if TYPE_CHECKING:
    from kombu.message import Message

    from .app.base import App
    from .app.task import Task

__all__ = ["LOST_HEADER", "Request", "RequestHost", "Settles", "has_workflow"]

logger = logging.getLogger("worker.request")


def has_workflow(embed: Mapping[str, Any] | None) -> bool:
    """Whether a message's embed holds anything to do after its task (callbacks, errbacks, a
    chain, a chord): Celery's client sends the four keys, null for a plain task."""
    if not embed:
        return False
    return bool(embed.get("callbacks") or embed.get("errbacks") or embed.get("chain") or embed.get("chord"))


class Settles(Protocol):
    """What a request reports its start and its end to: the consumer's reservations."""

    def task_started(self, request: Request) -> None:
        """The request's task started in the pool (it is running)."""

    def task_done(self, request: Request, *, started: bool = True) -> None:
        """The request is over (``started``: it had gone to the pool): it leaves what the worker
        holds, and its place in the pool is free."""

    def withdrawn(self, request: Request) -> None:
        """The pool gave the request back unstarted."""


class RequestHost(Protocol):
    """What a request needs of the consumer that received it (its ``consumer``)."""

    @property
    def app(self) -> App:
        """The app whose task it is."""

    @property
    def hostname(self) -> str:
        """The worker's node name."""

    @property
    def log_info(self) -> bool:
        """Whether the worker logs at INFO (each task's success and retry)."""

    @property
    def result_reprs(self) -> bool:
        """Whether the pool reports a successful task's return value (its repr)."""

    @property
    def notify(self) -> Callable[..., None]:
        """Calls an observer hook (:mod:`worker_core.hookspecs`)."""

    @property
    def inbox(self) -> Any:
        """Runs ``inbox.call(function, *args)`` in the consumer's loop thread."""

    @property
    def tasks(self) -> Any:
        """Acknowledges, rejects, dead-letters and republishes messages (``ack``, ``reject``,
        ``dead_letter``, ``republish``)."""

    @property
    def fence(self) -> Any:
        """The leases of the messages held (``settle``, ``not_run``)."""

    @property
    def worker(self) -> Any:
        """The worker: its ``pool``, whether it is ``terminating``, its ``stash``."""

    @property
    def reservations(self) -> Settles:
        """What its requests report their start and end to, unless a request is given its own."""


class Request:
    """One task message between its arrival and its acknowledgement.

    Pool callbacks (:meth:`on_accepted`, :meth:`on_result`, :meth:`on_error`,
    :meth:`on_timeout`) may come from any thread; they hop to the consumer's loop thread before
    touching the broker.
    """

    __slots__ = (
        "acknowledged",
        "acks_late",
        "consumer",
        "count_at_start",
        "deliveries",
        "envelope",
        "finished",
        "id",
        "message",
        "name",
        "pool_job",
        "reservations",
        "task",
        "terminate_signal",
        "time_start",
        "worker_pid",
    )

    def __init__(self, consumer: RequestHost, message: Message, envelope: TaskEnvelope, task: Task, *,
                 reservations: Settles | None = None) -> None:
        """``consumer`` is what received it; ``reservations``, what it reports its start and its
        end to (the consumer's reservations when not given)."""
        self.consumer = consumer
        self.reservations: Settles = reservations if reservations is not None else consumer.reservations
        self.message = message
        self.envelope = envelope
        self.task = task
        self.name = envelope.name
        self.id = envelope.id
        self.acks_late = task.acks_late
        self.acknowledged = False
        self.time_start: float | None = None
        self.worker_pid: int | None = None
        self.finished = False
        #: what the pool returned for this request's job (see ``Pool.withdraw_job``)
        self.pool_job: Any = None
        #: earlier starts of this task that ended without an outcome (its process or worker died):
        #: what the message carries, then what the poison cap counted (:mod:`.consumer.poison`)
        self.deliveries = 0
        #: delivered again with no count from the broker: counted just before it starts
        self.count_at_start = False
        #: revoked with ``terminate`` before it started: killed with this signal when it starts
        self.terminate_signal: int | None = None

    def __repr__(self) -> str:
        return f"<Request {self.name}[{self.id}]>"

    @property
    def shown_name(self) -> str:
        """The name logs and monitors show: the sender's shadow name if it gave one (Celery's
        ``shadow``), else the task's."""
        return self.envelope.shadow or self.name

    @property
    def label(self) -> str:
        """``name[id]`` for log lines (the shadow name if any), bounded: both come from the message."""
        return f"{shown(self.envelope.shadow or self.name)}[{shown(self.id, 100)}]"

    # -- facts ---------------------------------------------------------------------------------

    @property
    def stamps(self) -> dict[str, Any]:
        """Celery's stamps on the message: each header ``stamped_headers`` names, with its value
        from ``stamps`` (what ``revoke_by_stamped_headers`` matches)."""
        headers = self.envelope.headers
        names, values = headers.get("stamped_headers"), headers.get("stamps")
        if not names or not isinstance(names, (list, tuple)) or not isinstance(values, Mapping):
            return {}
        return {name: values.get(name) for name in names if isinstance(name, str)}

    def delivery_info(self) -> dict[str, Any]:
        info = self.message.delivery_info or {}
        properties = self.message.properties or {}
        return {
            "exchange": info.get("exchange"),
            "routing_key": info.get("routing_key"),
            "priority": properties.get("priority"),
            "redelivered": bool(info.get("redelivered")),
        }

    def message_fields(self) -> tuple[Any, ...]:
        """The request as the task sees it (``self.request``), plain data in
        :data:`~worker_core.app.context.MESSAGE_FIELDS` order, for the executor."""
        envelope = self.envelope
        headers = envelope.headers
        eta = headers.get("eta")
        expires = headers.get("expires")
        return (
            envelope.retries,
            eta if isinstance(eta, str) or eta is None else to_iso(envelope.eta) if envelope.eta else None,
            expires if isinstance(expires, str) or expires is None
            else to_iso(envelope.expires) if envelope.expires else None,
            (envelope.time_limit, envelope.soft_time_limit),
            envelope.root_id,
            envelope.parent_id,
            envelope.group,
            envelope.group_index,
            envelope.origin,
            self.consumer.hostname,
            envelope.reply_to,
            envelope.correlation_id,
            self.delivery_info(),
            envelope.ignore_result,
            envelope.shadow,
            # (the common case checked here: it is on every message's way, where a call is felt)
            None if PROTOCOL_HEADERS.issuperset(headers) else custom_headers(headers),
        )

    def request_fields(self) -> dict[str, Any]:
        """The request as a result backend reads it (see :func:`~worker_core.execution.request_mapping`)."""
        envelope = self.envelope
        return request_mapping(self.name, self.id, envelope.args, envelope.kwargs, self.message_fields())

    def limits(self) -> tuple[float | None, float | None]:
        """``(soft, hard)`` seconds from the message, else the task's own, else the pool's."""
        envelope = self.envelope
        soft = envelope.soft_time_limit if envelope.soft_time_limit is not None else self.task.soft_time_limit
        hard = envelope.time_limit if envelope.time_limit is not None else self.task.time_limit
        return soft, hard

    # -- running -----------------------------------------------------------------------------

    def workflow_embed(self) -> dict[str, Any] | None:
        """What the executor needs of the message's canvas (see
        :func:`~worker_core.execution.execute`): None for a plain task, decided here once."""
        envelope = self.envelope
        nesting = envelope.headers.get("replaced_task_nesting")
        if not has_workflow(envelope.embed) and not nesting:
            return None
        embed = dict(envelope.embed or {})
        if nesting and isinstance(nesting, int):
            embed["replaced_task_nesting"] = nesting
        return embed

    def execute_using_pool(self, pool: Any) -> None:
        soft, hard = self.limits()
        envelope = self.envelope
        self.pool_job = pool.apply_async(
            execute,
            (self.name, self.id, envelope.args, envelope.kwargs, self.message_fields(),
             self.consumer.result_reprs, self.workflow_embed()),
            callback=self.on_result,
            error_callback=self.on_error,
            accept_callback=self.on_accepted,
            timeout_callback=self.on_timeout,
            soft_timeout=soft,
            timeout=hard,
            name=self.name,
        )

    def on_accepted(self, pid: int, time_accepted: float) -> None:
        self.consumer.inbox.call(self._accepted, pid, time_accepted)

    def _accepted(self, pid: int, time_accepted: float) -> None:
        self.worker_pid = pid
        self.time_start = time_accepted
        if self.terminate_signal is not None and not self.finished:
            logger.info("Task %s started after it was revoked with terminate: stopping process %s",
                        self.label, pid)
            try:
                self.terminate(self.consumer.worker.pool, self.terminate_signal)
            except PoolError as exc:
                logger.warning("Could not terminate %s (%s): it runs on", self.label, exc)
            else:
                return
        if not self.acks_late:
            self.acknowledge()
        self.reservations.task_started(self)

    def on_result(self, outcome: Outcome) -> None:
        self.consumer.inbox.call(self._result, outcome)

    def _result(self, outcome: Outcome) -> None:
        if self.finished:
            return
        state = outcome.state
        consumer = self.consumer
        if state == SUCCESS:
            if consumer.log_info:
                logger.info("Task %s succeeded in %.6fs: %s", self.label, outcome.runtime, outcome.value)
            consumer.notify("task_succeeded", request=self, runtime=outcome.runtime, result=outcome.value)
            self._ack_late()
        elif state == FAILURE:
            exc = outcome.exception
            assert exc is not None
            traceback = outcome.traceback or ""
            logger.error("Task %s raised unexpected: %s\n%s", self.label, safe_repr(exc, 500),
                         traceback.rstrip())
            self._notify_failed(exc, outcome.exc_type, outcome.runtime, traceback)
            self._settle_failure(timeout=False)
        elif state == RETRY:
            reason = _text(outcome.exception)
            if consumer.log_info:
                logger.info("Task %s retry: %s", self.label, reason)
            consumer.notify("task_retried", request=self, reason=reason)
            self._ack_late()
        elif state == LEASE_LOST:  # its lease was lost before it started: it runs where its copy went
            consumer.fence.not_run(self)
        elif state == REVOKED:  # expired while it waited in the pool
            self.discard(_text(outcome.exception))
        elif state == REJECTED:
            rejection = outcome.exception
            requeue = bool(getattr(rejection, "requeue", False))
            reason = str(getattr(rejection, "reason", ""))
            logger.warning("Task %s rejected itself (requeue=%s): %s", self.label, requeue, reason)
            if not requeue:
                self._fail_rejected(reason, outcome.runtime)
            consumer.notify("task_rejected", request=self, reason=reason, requeue=requeue)
            self.reject(requeue=requeue, reason=f"the task rejected it: {reason}")
        else:  # ignored
            self._ack_late()
        self.reservations.task_done(self)

    def _fail_rejected(self, reason: str, runtime: float) -> None:
        """A message its task rejected without requeueing never runs again: as Celery 5.7 does,
        its result is FAILURE (the task's ``Reject``), its errbacks run, its chord counts it."""
        error = Reject(reason, False)
        self.store(self.outcome(FAILURE, error))
        self.follow(FAILURE, error, None)
        self._notify_failed(error, "Reject", runtime, "")

    def _notify_failed(self, exc: BaseException, exc_type: str, runtime: float, traceback: str) -> None:
        self.consumer.notify("task_failed", request=self, exception=exc, exc_type=exc_type,
                             exc_message=_text(exc), runtime=runtime, traceback=traceback)

    def on_error(self, exc: BaseException) -> None:
        self.consumer.inbox.call(self._error, exc)

    def _error(self, exc: BaseException) -> None:
        if self.finished:
            return
        consumer = self.consumer
        if isinstance(exc, JobWithdrawn):  # given back unstarted: requeued, or left to the broker
            self.reservations.withdrawn(self)
            return
        if consumer.worker.terminating:
            # cold shutdown: leave the message unacknowledged; closing the channel (or the lost
            # connection) gives it back to the broker
            self.reservations.task_done(self)
            return
        if isinstance(exc, WorkerLostError) and self.acks_late and self.task.reject_on_worker_lost:
            if not self._send_again_after_lost_process(exc):
                # a poison message: kept where a person can find it, not run again
                self.fail_as_poison(WorkerLostError(
                    f"{exc}; its process died {self.lost_count() + 1} times, so it is not run again "
                    f"(worker_redelivery_limit={consumer.app.settings.worker_redelivery_limit})"))
            self.reservations.task_done(self)
            return
        text = f"{type(exc).__name__}: {exc}"
        if not isinstance(exc, TimeLimitExceeded):
            logger.error("Task %s failed: %s", self.label, text)
        self.store(self.outcome(FAILURE, exc, text))
        self.follow(FAILURE, exc, text)
        if isinstance(exc, TimeLimitExceeded) and self.task.handlers:
            # its process is gone: the handlers run here, as in Celery
            self._call_handlers([("on_failure", (exc, self.id, self.envelope.args, self.envelope.kwargs,
                                                 ExceptionInfo.of(exc, text))),
                                 ("after_return", (FAILURE, exc, self.id, self.envelope.args,
                                                   self.envelope.kwargs, None))])
        self._notify_failed(exc, type(exc).__name__, 0.0, "")
        self._settle_failure(timeout=isinstance(exc, TimeLimitExceeded))
        self.reservations.task_done(self)

    def fail_as_poison(self, exc: WorkerLostError) -> None:
        """Fail this task for good, as a poison message (over ``worker_redelivery_limit``): logged,
        FAILURE stored and followed (errbacks, the rest of its chain, its chord), and its message
        taken to the dead-letter queue (when there is one) with the reason. The caller ends the
        request (``task_done``)."""
        text = f"{type(exc).__name__}: {exc}"
        logger.error("Task %s failed: %s", self.label, text)
        self.store(self.outcome(FAILURE, exc, text))
        self.follow(FAILURE, exc, text)
        self._notify_failed(exc, type(exc).__name__, 0.0, "")
        self.reject(requeue=False, reason=text)

    def lost_count(self) -> int:
        """How many times this task already started without an outcome (its process or worker
        died): what its message carries, or what the poison cap counted (:attr:`deliveries`)."""
        return max(self.deliveries, carried_count(self.envelope.headers))

    def _send_again_after_lost_process(self, exc: BaseException) -> bool:
        """Publish a copy with the loss counted (not when the pool knows another task took the
        process down: ``exc.bystander``), then acknowledge this one; False once the redelivery
        limit is reached (a poison message), so the task fails instead."""
        consumer = self.consumer
        bystander = isinstance(exc, WorkerLostError) and exc.bystander
        lost = self.lost_count() + (0 if bystander else 1)
        limit = consumer.app.settings.worker_redelivery_limit
        if limit is not None and lost > limit:
            return False
        logger.error("Task %s lost its process (%s); sending it again (%s%d of %s)", self.label, exc,
                     "not counted: " if bystander else "", lost, limit if limit is not None else "unlimited")
        self._notify_failed(exc, type(exc).__name__, 0.0, "")
        if consumer.tasks.republish(self.message, {LOST_HEADER: lost}):
            self.acknowledge()
        else:
            self.reject(requeue=True)
        return True

    def on_timeout(self, soft: bool, seconds: float) -> None:
        if soft:
            logger.warning("Soft time limit (%ss) exceeded for %s", _seconds(seconds), self.label)
        else:
            logger.error("Hard time limit (%ss) exceeded for %s", _seconds(seconds), self.label)

    def revoke(self, reason: str, *, why: str = "") -> None:
        """Do not run: store REVOKED, acknowledge, and tell observers (expired or revoked);
        ``why`` replaces the reason in the log line (``revoked by header: ...``)."""
        self.discard(reason, why=why)
        self.reservations.task_done(self, started=False)

    def discard(self, reason: str, *, why: str = "") -> None:
        logger.info("Discarding revoked task: %s (%s)", self.label, why or reason)
        self._mark_revoked(reason)

    def _mark_revoked(self, reason: str) -> None:
        error = TaskRevokedError(reason)
        self.store(self.outcome(REVOKED, error))
        self.follow(REVOKED, error, None)
        self.consumer.notify("task_revoked", request=self, reason=reason)
        self.acknowledge()

    def terminate(self, pool: Any, signum: int) -> None:
        """Stop this task (remote ``revoke`` with ``terminate``): its process gets ``signum`` now
        if the task runs, or as soon as it starts; it is stored REVOKED and acknowledged, as in
        Celery. Raises ``PoolError`` if the pool cannot stop a running task."""
        if self.finished:
            return
        if self.worker_pid is None:
            self.terminate_signal = signum
            return
        self._stop(pool, signum)
        self._mark_revoked("terminated")
        # sets finished: the pool's report of the killed job is ignored
        self.reservations.task_done(self)

    def cancel_after_connection_loss(self, pool: Any) -> None:
        """Stop this running ``acks_late`` task whose acknowledgement can no longer reach the
        broker (``worker_cancel_long_running_tasks_on_connection_loss``): the broker delivers the
        message again, so letting it finish would run it twice. Stores RETRY, as Celery does."""
        logger.warning("Task %s cannot be acknowledged after a connection loss since late acknowledgement "
                       "is enabled for it.\nTerminating it instead.", self.label)
        if self.worker_pid is not None:
            try:
                self._stop(pool, None)
            except PoolError as exc:
                logger.warning("Could not terminate %s (%s): it runs on, and the broker delivers it "
                               "again", self.label, exc)
        self.acknowledged = True  # its channel is gone: nothing to acknowledge or reject
        reason = Retry("cancelled by the worker after a connection loss")
        self.store(self.outcome(RETRY, reason))
        if self.task.handlers:
            self._call_handlers([("on_retry", (reason, self.id, self.envelope.args, self.envelope.kwargs,
                                               None))])
        self.consumer.notify("task_retried", request=self, reason="cancelled after a connection loss")
        # sets finished: the pool's report of the killed process is ignored
        self.reservations.task_done(self)

    def _stop(self, pool: Any, signum: int | None) -> None:
        """Stop this running task: on its own in a pool that can (:class:`StopsOneJob`), else
        with its process."""
        if isinstance(pool, StopsOneJob):
            pool.stop_job(self.pool_job, signum)
        else:
            pool.terminate_job(self.worker_pid, signum)

    # -- acknowledgement ---------------------------------------------------------------------------

    def _ack_late(self) -> None:
        if self.acks_late:
            self.acknowledge()

    def _settle_failure(self, *, timeout: bool) -> None:
        """Celery's rules for a failed or timed-out task with ``acks_late``."""
        if not self.acks_late:
            return
        if self.task.acks_on_failure_or_timeout:
            self.acknowledge()
        else:
            self.reject(requeue=timeout,
                        reason=f"task {self.label} failed (acks_on_failure_or_timeout is off)")

    def acknowledge(self) -> None:
        if not self.acknowledged:
            self.acknowledged = True
            self.consumer.fence.settle(self)  # (a lost lease: the channel writes nothing)
            self.consumer.tasks.ack(self.message)

    def reject(self, requeue: bool = False, reason: str | None = None) -> None:
        """Give the message back (``requeue``), or take it off its queue to the dead-letter queue
        (when there is one) with ``reason``; a message whose lease was lost is another consumer's
        now: only forgotten here."""
        if not self.acknowledged:
            self.acknowledged = True
            if self.consumer.fence.settle(self):
                self.consumer.tasks.ack(self.message)
            elif requeue:
                self.consumer.tasks.reject(self.message, requeue=True)
            else:
                self.consumer.tasks.dead_letter(self.message, reason or f"task {self.label} was rejected")

    def follow(self, state: str, exc: BaseException, traceback: str | None) -> None:
        """What follows a task failed or revoked here, in the main process (its process could
        not: a time limit, a lost process, a revoke), as in Celery: the chord counts it, and a
        failure fails the rest of its chain and calls its errbacks."""
        embed = self.workflow_embed()
        if embed is None:
            return
        envelope = self.envelope
        context = TaskContext(self.id, self.name, envelope.args, envelope.kwargs, *self.message_fields())
        context.called_directly = False
        push(context)
        try:
            workflow = Workflow.read(self.consumer.app, embed, context)
            if state == REVOKED:
                workflow.revoked(context, exc)
            else:
                workflow.failed(context, exc, traceback)
        except Exception:
            logger.exception("Task %s: what follows its %s could not be done", self.label, state)
        finally:
            pop()

    def outcome(self, state: str, exc: BaseException, traceback: str | None = None) -> Outcome:
        """What this process decided became of the task (a revoke, a lost process, a time limit,
        a poison message, a cancel after a lost connection), with its request as the backend
        reads it."""
        return Outcome(state, exception=exc, traceback=traceback, task_id=self.id,
                       request=self.request_fields())

    def store(self, outcome: Outcome) -> None:
        """Store what this process decided became of the task, unless its results are ignored;
        a failure to store is logged."""
        if self.envelope.ignore_result or self.task.ignore_result:
            return
        try:
            store_outcome(self.consumer.app.backend, outcome, self.task.result_serializer)
        except Exception:
            logger.exception("could not store state %s for task %s", outcome.state, self.label)

    def _call_handlers(self, calls: list[tuple[str, tuple[Any, ...]]]) -> None:
        """The task's handlers for an outcome only this process sees, with ``task.request`` set."""
        envelope = self.envelope
        context = TaskContext(self.id, self.name, envelope.args, envelope.kwargs, *self.message_fields())
        context.called_directly = False
        call_in_main_process(self.task, context, self.label, calls)


def _seconds(value: float) -> str:
    return f"{value:g}"


def _text(exc: BaseException | None) -> str:
    """``str(exc)`` that never raises (the exception is the task's own)."""
    try:
        return str(exc)
    except Exception:
        return f"<unprintable {type(exc).__name__}>"
