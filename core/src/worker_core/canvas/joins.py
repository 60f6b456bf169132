"""Completing a chord on the worker side, as Celery's worker does
(``celery/backends/redis.py`` ``on_chord_part_return``, ``celery/backends/base.py``
``chord_error_from_stack``): each header task's result is counted where it ran; the one count
that completes the chord sends the body with the header's results, or fails it with
``ChordError`` (``Dependency <id> raised ...``) and calls its errbacks.

Counting needs a result backend that joins chords (:class:`~worker_core.slots.JoinsChords`);
with any other, the client sent ``celery.chord_unlock``, which joins by polling
(:func:`unlock_chord`).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, cast

from ..app.context import TaskContext
from ..app.groupresult import GroupResult
from ..exceptions import ChordError
from ..protocol import safe_repr
from ..results.meta import EXCEPTION_STATES, FAILURE, PROPAGATE_STATES, decode_exception, encode_exception
from ..results.outcome import Outcome, store_outcome
from ..slots import JoinsChords, SavesGroups
from .errbacks import call_errbacks
from .groups import group
from .interface import CanvasApp
from .signatures import Signature, as_list, maybe_signature, new_id

__all__ = ["chord_error_from_stack", "claim_seconds", "count_chord_part", "fail_chain", "fail_task",
           "failed_culprit", "send_chord_body"]

logger = logging.getLogger("worker.canvas")


def claim_seconds(app: CanvasApp) -> float:
    """How long a completed chord's claim lasts: the join (``result_chord_join_timeout``, twice,
    at least 5 s, as Celery's) and publishing the body with its retries."""
    settings = app.settings
    return max(5.0, 2 * settings.result_chord_join_timeout) + 4 * settings.broker_connection_timeout + 1


def count_chord_part(app: CanvasApp, body: Any, group_id: str, task_id: str, group_index: int | None,
                     state: str, result: Any) -> None:
    """Count the result of header task ``task_id`` (``result`` encoded as stored) for the chord
    of header ``group_id`` whose body is ``body``; the count that completes it sends the body.
    Nothing to do for a backend that does not count (``celery.chord_unlock`` joins there)."""
    backend = cast("JoinsChords", app.backend)
    if not _counts_chords(backend):
        return
    count = backend.count_chord_part(group_id, task_id, group_index, state, result,
                                     claim_seconds=claim_seconds(app))
    if count.claim is None:
        return
    callback = maybe_signature(body, app=app)
    try:
        values = _joined(app, backend, group_id)
    except ChordError as exc:
        logger.error("Chord %s raised: %r", group_id, exc)
        try:
            chord_error_from_stack(app, callback, exc)
        finally:
            backend.finish_chord(group_id, count.claim, sent=False)
        return
    except Exception as exc:
        logger.exception("Chord %s raised: %r", group_id, exc)
        try:
            chord_error_from_stack(app, callback, _caused(f"Join error: {exc!r}", exc))
        finally:
            backend.finish_chord(group_id, count.claim, sent=False)
        return
    try:
        send_chord_body(app, callback, values, group_id)
    finally:
        if not backend.finish_chord(group_id, count.claim, sent=True):
            logger.warning("Chord %s: its claim lapsed before it was finished; its state is left to expire",
                           group_id)


#: whether each result backend class counts chords (a Protocol's isinstance costs tens of
#: microseconds, on every header task)
_COUNTS: dict[type, bool] = {}


def _counts_chords(backend: object) -> bool:
    kind = type(backend)
    counts = _COUNTS.get(kind)
    if counts is None:
        counts = _COUNTS[kind] = isinstance(backend, JoinsChords)
    return counts


def _joined(app: CanvasApp, backend: JoinsChords, group_id: str) -> list[Any]:
    """The header's results in order, from the saved header when it holds groups (its shape is
    the body's argument), else from the parts counted; a failed part raises ChordError."""
    saved = None
    if isinstance(backend, SavesGroups):
        saved = app.GroupResult.restore(group_id)
    if saved is not None:
        joined: list[Any] = saved.join(timeout=app.settings.result_chord_join_timeout, propagate=True)
        return joined
    values = []
    for task_id, state, result in backend.chord_parts(group_id):
        value = result
        if state in EXCEPTION_STATES and isinstance(result, Mapping):
            value = decode_exception(result)
        if state in PROPAGATE_STATES:
            raise _caused(f"Dependency {task_id} raised {value!r}", value)
        values.append(value)
    return values


def _caused(message: str, cause: Any) -> ChordError:
    error = ChordError(message)
    if isinstance(cause, BaseException):
        error.__cause__ = cause
    return error


def send_chord_body(app: CanvasApp, body: Signature, values: list[Any], group_id: str) -> None:
    """Send the body with the header's ``values``; a body that cannot be sent is failed with
    ``ChordError("Callback error: ...")`` and its errbacks called."""
    try:
        body.apply_async((values,))
    except Exception as exc:
        logger.exception("Chord %s: its body could not be sent: %r", group_id, exc)
        chord_error_from_stack(app, body, _caused(f"Callback error: {exc!r}", exc))


def chord_error_from_stack(app: CanvasApp, body: Any, exc: BaseException) -> None:
    """Fail a chord's body with ``exc`` (a ChordError): its result is FAILURE and its errbacks
    are called with it; for a body that is a group, each of its tasks; the chain after the body
    fails too, and a chord the body is part of counts it as failed."""
    body = maybe_signature(body, app=app)
    cause = exc.__cause__ if isinstance(exc, ChordError) and exc.__cause__ is not None else exc
    if isinstance(body, group):
        group_errbacks = as_list(body.options.get("link_error")) or []
        for task in body.tasks:
            task = maybe_signature(task, app=app)
            errbacks = [*(as_list(task.options.get("link_error")) or []), *group_errbacks]
            task_id = task.id or new_id()
            fail_task(app, task, task_id, cause, errbacks)
        if body.id:
            _store_failure(app, str(body.id), cause, None, {})
        _fail_steps(app, body.options.get("chain"), exc)
        return
    if not body.id:
        body.id = new_id()
    fail_task(app, body, str(body.id), exc, as_list(body.options.get("link_error")) or [])
    _fail_steps(app, body.options.get("chain"), exc)


def fail_task(app: CanvasApp, sig: Signature, task_id: str, exc: BaseException, errbacks: list[Any],
              traceback: str | None = None) -> None:
    """Store FAILURE for the task ``sig`` would have run as ``task_id``, call its errbacks, and
    count it for the chord it is part of (so that one does not wait for ever)."""
    options = sig.options
    request = TaskContext(task_id, sig.task, list(sig.args), dict(sig.kwargs), root_id=options.get("root_id"),
                          parent_id=options.get("parent_id"), group=options.get("group_id"),
                          group_index=options.get("group_index"))
    request.called_directly = False
    request.errbacks = list(errbacks)
    try:
        if errbacks:
            call_errbacks(app, errbacks, request, exc, traceback)
    finally:
        _store_failure(app, task_id, exc, traceback, request.as_dict())
        chord = options.get("chord")
        if chord is not None and request.group:
            count_chord_part(app, chord, request.group, task_id, request.group_index, FAILURE,
                             encode_exception(exc))


def _store_failure(app: CanvasApp, task_id: str, exc: BaseException, traceback: str | None,
                   request: Mapping[str, Any]) -> None:
    try:
        store_outcome(app.backend, Outcome(FAILURE, exception=exc, traceback=traceback, task_id=task_id,
                                           request=request))
    except Exception:
        logger.exception("could not store the failure of task %s", task_id)


def _fail_steps(app: CanvasApp, chain: Any, exc: BaseException) -> None:
    if chain:
        fail_chain(app, chain, exc, None)


def fail_chain(app: CanvasApp, chain: Sequence[Any], exc: BaseException, traceback: str | None) -> None:
    """Store FAILURE with ``exc`` under the task id of every remaining step of a chain (as the
    message carries it), so a client waiting on the chain's result gets the error; a step in a
    chord counts for it, and a chord's body is failed too (its result is the chord's)."""
    backend = app.backend
    encoded = encode_exception(exc)
    pending: deque[Any] = deque(chain)
    while pending:
        step = pending.popleft()
        if not isinstance(step, Mapping):
            logger.error("A step after a failed task is not a signature and cannot be failed: %s",
                         safe_repr(step, 300))
            continue
        options = step.get("options") or {}
        task_id = options.get("task_id")
        in_chord = options.get("chord") is not None and options.get("group_id")
        already_failed = False
        if in_chord and task_id:
            try:
                already_failed = backend.get_task_meta(task_id).get("status") in PROPAGATE_STATES
            except Exception:
                already_failed = False
        if task_id:
            # with the step's own reply_to: a backend replying to the sender (rpc://) sends the
            # failure to the client waiting on that step, as Celery's does
            request = {"task": step.get("task"), "id": task_id, "args": step.get("args"),
                       "kwargs": step.get("kwargs"), "group": options.get("group_id"),
                       "parent_id": options.get("parent_id"), "reply_to": options.get("reply_to"),
                       "correlation_id": task_id}
            try:
                store_outcome(backend, Outcome(FAILURE, exception=exc, traceback=traceback, task_id=task_id,
                                               request=request))
            except Exception:
                logger.exception("could not store the failure of task %s after a failed step", task_id)
        if in_chord and task_id and not already_failed:
            count_chord_part(app, options["chord"], options["group_id"], task_id, options.get("group_index"),
                             FAILURE, encoded)
        if step.get("subtask_type") == "chord":
            body = (step.get("kwargs") or {}).get("body")
            if body is not None:
                pending.append(body)


# -- joining by polling (celery.chord_unlock) --------------------------------------------------


def failed_culprit(results: GroupResult) -> Iterator[Any]:
    """The results of ``results`` that failed, depth first (groups within it searched too)."""
    for result in results.results:
        if isinstance(result, GroupResult):
            yield from failed_culprit(result)
        elif result.failed() or result.state in PROPAGATE_STATES:
            yield result
