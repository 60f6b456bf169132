"""``chain``: tasks run one after another, each given the previous one's return value.

Sending a chain sends its first task only; the rest travel in that message's embed as the
``chain`` list, in reverse order (the worker pops the next one from the end), each with its task
id given in advance. Groups followed by a task become chords on the way (see :mod:`.compose`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .kinds import from_dict, maybe_signature, register_type
from .signatures import Signature, _as_list

if TYPE_CHECKING:
    from ..app.base import App
    from ..app.groupresult import GroupResult
    from ..app.result import AsyncResult

__all__ = ["RUN_OPTIONS", "chain", "prepare_steps", "unroll_chords"]

#: Options of a chain that sending it uses itself instead of passing them to its first task.
RUN_OPTIONS = frozenset({"chord", "group_id", "group_index", "link", "link_error", "parent_id", "root_id",
                         "task_id"})


def _is_list(value: Any) -> bool:
    return isinstance(value, Iterable) and not isinstance(value, (str, bytes, Mapping))


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
            from .compose import fold

            return fold(tasks[0] if len(tasks) == 1 else tasks)
        return super().__new__(cls)

    def __init__(self, *tasks: Any, **options: Any) -> None:
        if "task" in self:  # built by ``fold`` in __new__, which Python follows with __init__
            return
        members: Any = list(tasks[0]) if len(tasks) == 1 and _is_list(tasks[0]) else tasks
        super().__init__("celery.chain", (), {"tasks": members}, subtask_type="chain", **options)

    @classmethod
    def of(cls, tasks: Sequence[Any], app: App | None = None, **options: Any) -> chain:
        """A chain of exactly these tasks, composed by no rule."""
        made = Signature.__new__(cls)
        Signature.__init__(made, "celery.chain", (), {"tasks": tasks}, subtask_type="chain", app=app,
                           **options)
        return made

    @classmethod
    def _from_dict(cls, data: Mapping[str, Any], app: App | None) -> Signature:
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
    def app(self) -> App:
        if self._app is None:
            for task in self.tasks:
                if isinstance(task, Signature) and task._app is not None:
                    return task._app
        return super().app

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
        for callback in _as_list(self.options.get("link")) or ():
            tasks[-1].link(callback)
        for errback in _as_list(self.options.get("link_error")) or ():
            for task in tasks:
                task.link_error(errback)
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
            parent_id: str | None = None, app: App | None = None, group_index: int | None = None,
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
               group_index: int | None = None) -> AsyncResult | GroupResult:
        """Give every task its id now (in place) and return the last task's result handle."""
        _, results = prepare_steps(self.app, self.args, self.kwargs, self.tasks, root_id, None, _id, group_id,
                                   chord, group_index=group_index, clone=False)
        if results:
            self.id = results[0].id
        last: AsyncResult | GroupResult = results[0]
        return last

    def __repr__(self) -> str:
        if not self.tasks:
            return "<chain: empty>"
        return " | ".join(repr(task) for task in self.tasks)


def unroll_chords(sig: chain) -> None:
    """Split chords whose body is a chain led by a task, so each header task carries only the
    body's first task: ``chord(h, a | b | c)`` becomes ``chord(h, a), b, c``."""
    from .chords import chord, is_chain_led_by_task

    pending: deque[Any] = deque(sig.tasks)
    tasks: list[Any] = []
    while pending:
        task = pending.popleft()
        if isinstance(task, chain):
            task = task.clone()
            assert isinstance(task, chain)
            unroll_chords(task)
        if isinstance(task, chord) and is_chain_led_by_task(task.body):
            pending.extendleft(reversed(task.unroll_body()))
        else:
            tasks.append(task)
    sig.tasks = tasks


def prepare_steps(
    app: App, args: Iterable[Any] | None, kwargs: Mapping[str, Any] | None, steps_given: Iterable[Any],
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
    from ..app.groupresult import GroupResult
    from .backends import require_chords
    from .chords import chord, is_chain_led_by_task, strip_chord_header_links
    from .compose import is_empty_group, unroll
    from .groups import group

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
        if clone and isinstance(task, chord) and is_chain_led_by_task(task.body):
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
        for errback in _as_list(link_error) or ():
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
