"""``chain``: tasks run one after another, each given the previous one's return value.

Sending a chain sends its first task only; the rest travel in that message's embed as the
``chain`` list, in reverse order (the worker pops the next one from the end), each with its task
id given in advance. Groups followed by a task become chords on the way.

The ``|`` rules, as Celery composes: what ``left | right`` builds for each kind of signature
(:meth:`chain.compose`), and ``chain(a, b, c)`` built in one pass with the same result as
``chain() | a | b | c``.

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

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from functools import reduce
from typing import Any

from ..app.groupresult import GroupResult
from ..results.requirements import require_chords
from .chords import chord, strip_chord_header_links
from .groups import group
from .interface import CanvasApp
from .signatures import RUN_OPTIONS, Signature, as_list, from_dict, maybe_signature, register_type

__all__ = ["RUN_OPTIONS", "chain", "fold", "is_empty_group", "pipe", "prepare_steps", "unroll"]


def _is_list(value: Any) -> bool:
    return isinstance(value, Iterable) and not isinstance(value, (str, bytes, Mapping))


def is_empty_group(sig: Any) -> bool:
    """A group with no tasks: nothing to run, so ``|`` leaves it out."""
    return isinstance(sig, group) and isinstance(sig.tasks, (list, tuple)) and not sig.tasks


def unroll(sig: Signature) -> Signature:
    """A group of one task is that task; anything else is itself."""
    if isinstance(sig, group) and len(sig.tasks) == 1:
        only: Signature = sig.tasks[0]
        return only
    return sig


@register_type("chain")
class chain(Signature):
    """``chain(add.s(2, 2), add.s(4), add.s(8))``, the same as ``add.s(2, 2) | add.s(4) | add.s(8)``.

    Given tasks alone (or one list or generator of them), ``chain(...)`` composes them by the
    ``|`` rules, so it may give a chord or a group instead of a chain (``chain(group, task)`` is a
    chord). With options (``chain(a, b, queue="q")``) the tasks are kept as given.

    ``apply_async()`` returns the last task's result; ``result.parent`` is the one before, and so
    on back to the first.
    """

    def __new__(cls, *tasks: Any, **options: Any) -> Any:
        if not options and tasks and (len(tasks) != 1 or _is_list(tasks[0])):
            return fold(tasks[0] if len(tasks) == 1 else tasks)
        return super().__new__(cls)

    def __init__(self, *tasks: Any, **options: Any) -> None:
        if "task" in self:  # built by ``fold`` in __new__, which Python follows with __init__
            return
        members: Any = list(tasks[0]) if len(tasks) == 1 and _is_list(tasks[0]) else tasks
        super().__init__("celery.chain", (), {"tasks": members}, subtask_type="chain", **options)

    @classmethod
    def of(cls, tasks: Sequence[Any], app: CanvasApp | None = None, **options: Any) -> chain:
        """A chain of exactly these tasks, composed by no rule."""
        made = Signature.__new__(cls)
        Signature.__init__(made, "celery.chain", (), {"tasks": tasks}, subtask_type="chain", app=app,
                           **options)
        return made

    @staticmethod
    def compose(left: Signature, right: Any) -> Any:
        """What ``left | right`` builds (``NotImplemented`` when ``right`` is no signature): the
        rules above."""
        return pipe(left, right)

    @classmethod
    def _from_dict(cls, data: Mapping[str, Any], app: CanvasApp | None) -> Signature:
        tasks = data["kwargs"]["tasks"]
        if tasks:
            tasks = [maybe_signature(task, app=app) for task in tasks]
        return cls.of(tasks or [], app=app, **data["options"])

    @property
    def tasks(self) -> Any:
        """The chain's signatures, first to last."""
        return self.kwargs["tasks"]

    @tasks.setter
    def tasks(self, value: Any) -> None:
        self.kwargs["tasks"] = value

    @property
    def app(self) -> CanvasApp:
        if self._app is None:
            for task in self.tasks:
                if isinstance(task, Signature) and task.known_app is not None:
                    return task.known_app
        return super().app

    @app.setter
    def app(self, value: CanvasApp) -> None:
        self._app = value

    def clone(self, args: Iterable[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
              **options: Any) -> Signature:
        copy = super().clone(args, kwargs, **options)
        copy.kwargs["tasks"] = [maybe_signature(sig, app=self._app, clone=True)
                                for sig in copy.kwargs["tasks"]]
        return copy

    def unchain_tasks(self) -> list[Signature]:
        """Copies of the tasks, the chain's callbacks added to the last one and its errbacks to
        each (so a failure anywhere reaches them)."""
        tasks = [(task if isinstance(task, Signature) else from_dict(task, app=self._app)).clone()
                 for task in self.tasks]
        for callback in as_list(self.options.get("link")) or ():
            tasks[-1].link(callback)
        for errback in as_list(self.options.get("link_error")) or ():
            for task in tasks:
                task.link_error(errback)
        return tasks

    # -- what a workflow holding the chain asks of it --------------------------------------------

    def chord_size(self) -> int:
        for step in reversed(self.tasks):
            if not isinstance(step, Signature) and isinstance(step, Mapping):
                step = from_dict(step)
            size = step.chord_size() if isinstance(step, Signature) else len(step)
            if size > 0:
                return size
        return 0

    def runs_nothing(self) -> bool:
        return not self.tasks

    def led_by_task(self) -> bool:
        return bool(self.tasks) and not isinstance(self.tasks[0], group)

    def unroll_chords(self) -> None:
        """Split the chords whose body is a chain led by a task, so each header task carries only
        the body's first task: ``chord(h, a | b | c)`` becomes ``chord(h, a), b, c``."""
        pending: deque[Any] = deque(self.tasks)
        tasks: list[Any] = []
        while pending:
            task = pending.popleft()
            if isinstance(task, chain):
                task = task.clone()
                task.unroll_chords()
            if isinstance(task, chord) and task.body is not None and task.body.led_by_task():
                pending.extendleft(reversed(task.unroll_body()))
            else:
                tasks.append(task)
        self.tasks = tasks

    def clear_chord_option(self) -> None:
        super().clear_chord_option()
        if self.tasks:
            self.tasks[-1].clear_chord_option()

    def strip_chord_header_links(self) -> None:
        for task in self.tasks:
            task.strip_chord_header_links()

    def members(self) -> list[Any]:
        tasks: list[Any] = self.tasks
        return tasks

    # -- sending --------------------------------------------------------------------------------

    def apply_async(self, args: Iterable[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
                    **options: Any) -> Any:
        """Send the first task, carrying the others; returns the last task's result (None for an
        empty chain)."""
        run_options = dict(self.options, **options) if options else self.options
        return self.run(args, kwargs, app=self.app, **run_options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.apply_async(args, kwargs) if self.tasks else None

    def run(self, args: Iterable[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
            group_id: str | None = None, chord: Signature | None = None, task_id: str | None = None,
            link: Any = None, link_error: Any = None, root_id: str | None = None,
            parent_id: str | None = None, app: CanvasApp | None = None, group_index: int | None = None,
            **options: Any) -> Any:
        """Send the chain with these run options (those of :data:`RUN_OPTIONS` place it in a
        workflow; the rest go to the first task)."""
        app = app or self.app
        given = tuple(args or ())
        first_args = given + tuple(self.args) if given and not self.immutable else tuple(self.args)
        tasks, results = prepare_steps(app, first_args, kwargs, self.tasks, root_id, link_error, task_id,
                                       group_id, chord, group_index=group_index)
        if not results:
            return None
        if link:
            tasks[0].extend_list_option("link", link)
        first = tasks.pop()
        # the rest in reverse order; a chain sent as a step of another carries that one's rest too
        rest = options["chain"] + tasks if "chain" in options and options["chain"] is not None else tasks
        sent = first.apply_async(**dict(options, chain=rest))
        return sent if not tasks else results[0]

    def freeze(self, _id: str | None = None, group_id: str | None = None, chord: Signature | None = None,
               root_id: str | None = None, parent_id: str | None = None,
               group_index: int | None = None) -> Any:
        """Give every task its id now (in place) and return the last task's result handle."""
        _, results = prepare_steps(self.app, self.args, self.kwargs, self.tasks, root_id, None, _id, group_id,
                                   chord, group_index=group_index, clone=False)
        if results:
            self.id = results[0].id
        return results[0]

    def __repr__(self) -> str:
        if not self.tasks:
            return "<chain: empty>"
        return " | ".join(repr(task) for task in self.tasks)


def prepare_steps(
    app: CanvasApp, args: Iterable[Any] | None, kwargs: Mapping[str, Any] | None, steps_given: Iterable[Any],
    root_id: str | None = None, link_error: Any = None, last_task_id: str | None = None,
    group_id: str | None = None, chord_body: Signature | None = None, *, group_index: int | None = None,
    clone: bool = True,
) -> tuple[list[Signature], list[Any]]:
    """Freeze every task of a chain for sending: the signatures in reverse order (the message's
    ``chain`` list once the first is popped off) and their results, last task first, each
    result's ``parent`` the one before it.

    The first task gets the partial ``args``/``kwargs``; the last one the chain's place in a
    workflow (``last_task_id``, ``group_id``, ``chord_body``, ``group_index``); every task
    ``root_id`` and the ``link_error`` errbacks. Nested chains are spliced in, a group followed by
    a task becomes a chord. With ``clone`` the given signatures are left as they were; without,
    they are frozen in place (what :meth:`chain.freeze` promises).
    """
    steps: deque[Any] = deque(steps_given)
    # The walk below is backwards and gives the partial args to the step popped last: make that
    # one a real task (splice leading chains, drop leading empty groups while others follow).
    stripped = None
    while steps:
        head = steps[0]
        if not isinstance(head, Signature):
            head = steps[0] = from_dict(head, app=app)
        if isinstance(head, chain):
            steps.popleft()
            if clone:
                head = head.clone()
            steps.extendleft(reversed(head.tasks))
            continue
        if isinstance(head, group):
            head = steps[0] = unroll(head)
            if len(steps) > 1 and is_empty_group(head):
                stripped = steps.popleft()
                continue
        break
    if stripped is not None and not steps:
        steps.append(stripped)

    prev_task: Any = None
    prev_res: Any = None
    tasks: list[Any] = []
    results: list[Any] = []
    frozen = 0
    while steps:
        task = steps.pop()
        is_first, is_last = not steps, not frozen
        if not isinstance(task, Signature):
            task = from_dict(task, app=app)
        if isinstance(task, group):
            task = unroll(task)
            if is_empty_group(task) and (steps or prev_task):
                continue
        if clone and isinstance(task, chord) and task.body is not None and task.body.led_by_task():
            steps.extend(task.unroll_body())
            continue
        if clone:
            task = task.clone(args, kwargs) if is_first else task.clone()
        elif is_first:
            task.args = tuple(args or ()) + tuple(task.args)
        if isinstance(task, chain):
            steps.extend(task.tasks)
            continue
        if isinstance(task, group) and prev_task:
            # group | task: the task waits for the whole group, a chord
            tasks.pop()
            body_res = results.pop()
            if isinstance(prev_res, GroupResult):
                task = chord(task, body=prev_task, root_id=root_id, app=app)
            else:
                task = chord(task, body=prev_task, task_id=prev_res.task_id, root_id=root_id, app=app)
            prev_task = tasks[-1] if tasks else None
            # what followed the body now follows the chord's result
            node = results[-1] if results else None
            while node is not None and node.parent is not body_res:
                node = node.parent
            if node is not None:
                node.parent = None
                prev_res = node
        if is_last:
            res = task.freeze(last_task_id, root_id=root_id, group_id=group_id, chord=chord_body,
                              group_index=group_index)
        else:
            res = task.freeze(root_id=root_id)
        frozen += 1
        if prev_task and prev_res is not None and prev_res.parent is None:
            prev_res.parent = res
        for errback in as_list(link_error) or ():
            task.link_error(errback)
            if isinstance(task, chord) and task.body:
                task.body.link_error(errback)  # the chord's own failure handling reads it there
        tasks.append(task)
        results.append(res)
        prev_task, prev_res = task, res
        if isinstance(task, chord):
            require_chords(app)
            # what comes before the chord is the parent of its header, the root of its results
            node = res
            while node.parent:
                node = node.parent
            prev_res = node
    if clone:
        for task in tasks:
            strip_chord_header_links(task)
    return tasks, results


# -- the | rules ------------------------------------------------------------------------------


def pipe(left: Signature, right: Any) -> Any:
    """``left | right`` (``NotImplemented`` when ``right`` is no signature)."""
    if not isinstance(right, Signature):
        return NotImplemented
    if isinstance(left, chord):
        return _after_chord(left, right)
    if isinstance(left, group):
        if is_empty_group(right):
            return left
        return chord(left, body=right, app=left.known_app)
    if isinstance(left, chain):
        return _after_chain(left, right)
    return _after_task(left, right)


def _after_task(left: Signature, right: Signature) -> Signature:
    if isinstance(right, chain):
        return chain.of([left, *right.unchain_tasks()], app=left.known_app)
    if isinstance(right, group):
        right = unroll(right)
    return chain.of([left, right], app=left.known_app)


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
            return chain.of(tasks, app=left.known_app)
        return chain.of([*tasks, right], app=left.known_app)
    if isinstance(right, chain):
        return reduce(pipe, right.unchain_tasks(), left)
    if left.tasks and isinstance(left.tasks[-1], group):
        # a group followed by a task waits for the whole group: a chord
        joined = left.clone()
        assert isinstance(joined, chain)
        joined.tasks[-1] = chord(joined.tasks[-1], right, app=left.known_app)
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
    return chain.of([*left.unchain_tasks(), right], app=left.known_app)


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
