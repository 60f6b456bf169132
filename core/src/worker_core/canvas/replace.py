"""``Task.replace(sig)`` and ``Task.add_to_chord(sig)``, as Celery 5.7's (``celery/app/task.py``):
a running task hands its place in its workflow (its id, callbacks, errbacks, chain, chord) to
another signature, or adds a task to the chord it is part of."""

from __future__ import annotations

from typing import Any, NoReturn

from ..exceptions import ConfigurationError, Ignore
from ..results.requirements import require_chords
from .chains import chain
from .groups import group
from .interface import RunningTask as Task
from .signatures import Signature, as_list, maybe_signature, signature

__all__ = ["add_to_chord", "replace"]


def _running(task: Task, what: str) -> Any:
    request = task.request
    if request.called_directly or not request.id:
        raise RuntimeError(f"{task.name}.{what}() was called outside a worker: only a task a worker runs "
                           f"has a place in a workflow to hand over")
    return request


def replace(task: Task, sig: Any) -> NoReturn:
    """Send ``sig`` in place of the running task, which ends here (``Ignore``: nothing is stored
    for it). ``sig`` gets the task's id (its final result is the task's), callbacks, errbacks,
    chord and place in its group; the rest of the task's chain follows it. A group is made a
    chord ending in ``celery.accumulate``, so callbacks get its results as one list.

    :raise ConfigurationError: ``sig`` is part of a chord already, or is an empty chain.
    """
    request = _running(task, "replace")
    app = task.app
    sig = maybe_signature(sig, app=app)
    if not isinstance(sig, Signature):
        raise TypeError(f"{task.name}.replace() takes a signature (got {sig!r}), for example add.s(2, 2)")
    if "chord" in sig.options:
        raise ConfigurationError("A signature replacing a task must not be part of a chord")
    if isinstance(sig, chain) and not sig.tasks:
        raise ConfigurationError("Cannot replace with an empty chain")
    accumulate = app.tasks.get("celery.accumulate")
    if isinstance(sig, group) or (isinstance(sig, chain) and isinstance(sig.tasks[-1], group)):
        if accumulate is None:
            raise ConfigurationError("replacing a task with a group needs the built-in task "
                                     "celery.accumulate, which every worker registers: call replace() "
                                     "from a task a worker runs")
        if isinstance(sig, group):
            sig = sig | accumulate.s(index=0)
        else:
            tasks = list(sig.tasks)
            tasks[-1] = tasks[-1] | accumulate.s(index=0)
            sig.tasks = tasks
    for callback in as_list(request.callbacks) or []:
        sig.link(maybe_signature(callback, app=app))
    for errback in as_list(request.errbacks) or []:
        sig.link_error(maybe_signature(errback, app=app))
    if isinstance(sig, chain) and "link" in sig.options:
        # the callbacks run after the chain's last task, once
        last = sig.tasks[-1]
        last.options.setdefault("link", []).extend(as_list(sig.options.pop("link")) or [])
    sig.freeze(request.id)
    nesting = request.replaced_task_nesting + 1
    sig.set(chord=request.chord, group_id=request.group, group_index=request.group_index,
            root_id=request.root_id, replaced_task_nesting=nesting)
    if isinstance(sig, chain):
        for step in sig.tasks:
            step.set(replaced_task_nesting=nesting)
    for step in reversed(request.chain or []):
        following = signature(step, app=app)
        following.set(replaced_task_nesting=nesting)
        sig |= following
    sig.delay()
    raise Ignore("Replaced by new task")


def add_to_chord(task: Task, sig: Any, lazy: bool = False) -> Any:
    """Add ``sig`` to the chord the running task is part of: the body waits for its result too
    (needs a result backend that counts chords, :class:`~worker_core.slots.JoinsChords`).
    Returns its result, or with ``lazy`` the signature, to be sent with ``delay()``.

    :raise ValueError: the task is not part of a chord.
    """
    request = _running(task, "add_to_chord")
    if not request.chord:
        raise ValueError("Current task is not member of any chord")
    app = task.app
    joins = require_chords(app)
    if joins is None:
        raise ConfigurationError(f"add_to_chord needs a result backend that counts a chord's results; "
                                 f"{type(app.backend).__name__} does not (the Redis and embedded ones do)")
    sig = maybe_signature(sig, app=app)
    sig.set(group_id=request.group, group_index=request.group_index, chord=request.chord,
            root_id=request.root_id)
    sig.freeze()
    joins.add_to_chord(str(request.group), 1)
    return sig if lazy else sig.delay()
