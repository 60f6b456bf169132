"""The ``|`` rules, as Celery composes: what ``left | right`` builds for each kind of signature,
and ``chain(a, b, c)`` built in one pass with the same result as ``chain() | a | b | c``.

========================  ===============================================================
left | right             result
========================  ===============================================================
task | task             chain(task, task)
task | chain            chain(task, *chain's tasks)
task | group            chain(task, group) (a group of one task is that task)
chain | task            the chain with the task appended; a chain ending in a group gets
                        chord(group, task) instead, a chain ending in a chord gets the
                        task added to the chord's body
chain | chain           the left chain with each task of the right one, by these rules
chain | group           the chain with the group appended (to the body of a final chord)
group | anything        chord(group, anything) (an empty group on the right: the group)
chord | task or chord   the chord with its body piped into the right side
chord | chain or group  chain(chord, ...) (a group of one task: added to the body)
========================  ===============================================================
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import reduce
from typing import Any

from .chains import chain
from .chords import chord
from .groups import group
from .signatures import Signature

__all__ = ["fold", "is_empty_group", "pipe", "unroll"]


def is_empty_group(sig: Any) -> bool:
    """A group with no tasks: nothing to run, so ``|`` leaves it out."""
    return isinstance(sig, group) and isinstance(sig.tasks, (list, tuple)) and not sig.tasks


def unroll(sig: Signature) -> Signature:
    """A group of one task is that task; anything else is itself."""
    if isinstance(sig, group) and len(sig.tasks) == 1:
        only: Signature = sig.tasks[0]
        return only
    return sig


def pipe(left: Signature, right: Any) -> Any:
    """``left | right`` (``NotImplemented`` when ``right`` is no signature)."""
    if not isinstance(right, Signature):
        return NotImplemented
    if isinstance(left, chord):
        return _after_chord(left, right)
    if isinstance(left, group):
        if is_empty_group(right):
            return left
        return chord(left, body=right, app=left._app)
    if isinstance(left, chain):
        return _after_chain(left, right)
    return _after_task(left, right)


def _after_task(left: Signature, right: Signature) -> Signature:
    if isinstance(right, chain):
        return chain.of([left, *right.unchain_tasks()], app=left._app)
    if isinstance(right, group):
        right = unroll(right)
    return chain.of([left, right], app=left._app)


def _after_chord(left: chord, right: Signature) -> Signature:
    if isinstance(right, group) and len(right.tasks) == 1:
        right = unroll(right)
    elif isinstance(right, (group, chain)):
        return _after_task(left, right)
    joined = left.clone()
    assert isinstance(joined, chord)
    joined.body = pipe(joined.body, right)
    return joined


def _after_chain(left: chain, right: Signature) -> Signature:
    if is_empty_group(right):
        return left
    if isinstance(right, group):
        right = unroll(right)
        if not isinstance(right, group):
            return _after_chain(left, right)
        tasks = left.unchain_tasks()
        if not tasks:
            return right
        if isinstance(tasks[-1], chord):
            tasks[-1].body = pipe(tasks[-1].body, right)
            return chain.of(tasks, app=left._app)
        return chain.of([*tasks, right], app=left._app)
    if isinstance(right, chain):
        return reduce(pipe, right.unchain_tasks(), left)
    if left.tasks and isinstance(left.tasks[-1], group):
        # a group followed by a task waits for the whole group: a chord
        joined = left.clone()
        assert isinstance(joined, chain)
        joined.tasks[-1] = chord(joined.tasks[-1], right, app=left._app)
        if len(joined.tasks) > 1 and isinstance(joined.tasks[-2], chord):
            # two chords in a row: the second runs as part of the first one's body
            joined.tasks[-2].body = pipe(joined.tasks[-2].body, joined.tasks[-1])
            joined.tasks = joined.tasks[:-1]
        return joined
    if left.tasks and isinstance(left.tasks[-1], chord) and not isinstance(right, chord):
        joined = left.clone()
        assert isinstance(joined, chain)
        joined.tasks[-1].body = pipe(joined.tasks[-1].body, right)
        return joined
    return chain.of([*left.unchain_tasks(), right], app=left._app)


def _append(steps: list[Signature], task: Signature, copy: bool) -> Any:
    """Add ``task`` to the chain being built in ``steps`` by the ``chain | task`` rules; returns
    ``steps``, or what the chain turned into when it stopped being one."""
    if is_empty_group(task):
        return steps
    if isinstance(task, group):
        task = unroll(task)
        if not isinstance(task, group):
            return _append(steps, task, copy)
        if not steps:
            return task
        if isinstance(steps[-1], chord):
            steps[-1].body = pipe(steps[-1].body, task)
            return steps
        steps.append(task.clone() if copy else task)
        return steps
    if isinstance(task, chain):
        inner = task.unchain_tasks()
        for position, each in enumerate(inner):
            result = _append(steps, each, copy or position != len(inner) - 1)
            if result is not steps:
                return reduce(pipe, inner[position + 1:], result)
        return steps
    if steps and isinstance(steps[-1], group):
        steps[-1] = chord(steps[-1], task.clone() if copy else task)
        return steps
    if steps and isinstance(steps[-1], chord) and not isinstance(task, chord):
        steps[-1].body = pipe(steps[-1].body, task)
        return steps
    steps.append(task.clone() if copy else task)
    return steps


def fold(tasks: Iterable[Signature]) -> Any:
    """``chain(a, b, c)``: what ``chain() | a | b | c`` gives, in one pass (linear in the number
    of tasks: ``|`` copies the chain at every step)."""
    items = list(tasks)
    steps: list[Signature] = []
    for position, task in enumerate(items):
        # as with ``|``, only the last signature goes in as it was given; the others are copies
        result = _append(steps, task, position != len(items) - 1)
        if result is not steps:
            return reduce(pipe, items[position + 1:], result)
    return chain.of([step.clone() for step in steps[:-1]] + steps[-1:])
