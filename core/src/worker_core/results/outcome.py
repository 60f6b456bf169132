"""What became of a task, and the one place a worker stores it through the result backend slot.

An :class:`Outcome` is made where the worker learns what became of a task: in the executor
that ran it (a pool's process or thread), or in the worker's main process for what it decides
itself (a revoke, a lost process, a time limit, a refused message, a failed workflow step).
:func:`store_outcome` stores it; a pool sends it from its process to the worker's without its
request, with an exception that could not make the trip replaced by an
:class:`~worker_core.exceptions.UnpicklableError` standing in for it.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from ..exceptions import Retry, UnpicklableError
from .meta import RETRY, encode_exception

if TYPE_CHECKING:
    from ..slots import ResultBackend

__all__ = ["Outcome", "portable", "store_outcome"]

#: the longest message or repr a stand-in for an exception keeps
_MAX_TEXT = 1000


@attrs.frozen
class Outcome:
    """What became of one task: its state, what it returned or raised, how long it ran, and the
    request to store it with."""

    #: Celery's state: ``SUCCESS``, ``FAILURE``, ``RETRY``, ``REVOKED``, ``REJECTED``, ``IGNORED``,
    #: ``STARTED``, or a task's own (``update_state``)
    state: str
    #: seconds the task ran (0.0 when it did not run, or its process died)
    runtime: float = 0.0
    #: what is stored for a state without an exception: the return value of a ``SUCCESS`` (as
    #: the executor reports it to the worker's main process, its repr, or None when nobody
    #: reads it), a ``STARTED``'s pid and hostname, the meta of a task's own state
    value: Any = None
    #: the exception itself: what the task raised (``FAILURE``), the :class:`~worker_core.exceptions.Retry`
    #: (``RETRY``, stored as its reason), the ``TaskRevokedError`` (``REVOKED``), the
    #: :class:`~worker_core.exceptions.Reject` (``REJECTED``); None for the other states
    exception: BaseException | None = None
    #: the formatted traceback of what the task raised, else None
    traceback: str | None = None
    #: the task id the state is stored under
    task_id: str | None = None
    #: the request as the result backend reads it (see ``ResultBackend.store_result``); None
    #: where there is none (a revoke of a task the worker never received)
    request: Mapping[str, Any] | None = attrs.field(default=None, eq=False)

    @property
    def exc_type(self) -> str:
        """The class name of the exception (of the one an ``UnpicklableError`` stands for)."""
        exc = self.exception
        if isinstance(exc, UnpicklableError):
            return exc.exc_type.rpartition(".")[2]
        return type(exc).__name__

    def stored(self) -> Any:
        """What the backend stores as the result: the value, or the exception in Celery's
        encoding (a retry's reason, as Celery stores it)."""
        exc = self.exception
        if exc is None:
            return self.value
        if self.state == RETRY and isinstance(exc, Retry) and exc.exc is not None:
            exc = exc.exc
        return encode_exception(exc)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # what a process pool sends back: no request (the worker's main process has its own), and
        # an exception that makes the trip (the common case, a success, in as few bytes as can be)
        if self.exception is None and self.traceback is None and self.task_id is None:
            return Outcome, (self.state, self.runtime, self.value)
        return Outcome, (self.state, self.runtime, self.value, portable(self.exception), self.traceback,
                         self.task_id)


def portable(exc: BaseException | None) -> BaseException | None:
    """``exc`` when it pickles and unpickles as itself, else an ``UnpicklableError`` standing in
    for it (a task's exception may hold anything, or take arguments its ``args`` do not hold)."""
    if exc is None:
        return None
    try:
        if type(pickle.loads(pickle.dumps(exc))) is type(exc):
            return exc
    except Exception:
        pass
    return UnpicklableError(type(exc).__qualname__, type(exc).__module__, _bounded(str, exc),
                            _bounded(repr, exc))


def _bounded(show: Any, exc: BaseException) -> str:
    try:
        text = str(show(exc))
    except Exception:
        return f"<unprintable {type(exc).__name__}>"
    return text if len(text) <= _MAX_TEXT else text[: _MAX_TEXT - 3] + "..."


def store_outcome(backend: ResultBackend, outcome: Outcome, serializer: str | None = None) -> None:
    """Store ``outcome`` under its task id through ``backend``, in ``serializer`` when the task
    names one (else the backend's own, ``result_serializer``). Raises what the backend raised."""
    task_id = outcome.task_id
    if task_id is None:
        raise ValueError(f"an outcome stored needs its task id (got {outcome!r})")
    if serializer is None:
        backend.store_result(task_id, outcome.stored(), outcome.state, outcome.traceback, outcome.request)
    else:
        backend.store_result(task_id, outcome.stored(), outcome.state, outcome.traceback, outcome.request,
                             serializer=serializer)
