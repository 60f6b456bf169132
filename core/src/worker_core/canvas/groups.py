"""``group``: tasks sent at once to run in parallel, whose results are read together.

Every task of a group is sent with the group's id (the ``group`` header) and its position
(``group_index``); nested groups are flattened. ``apply_async()`` returns a
:class:`~worker_core.app.groupresult.GroupResult`. A group sent as a chord's header also
carries the chord's body in each task's embed, and the chord's size is recorded in the result
backend just before its last task is sent.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ..app.context import add_child
from ..app.groupresult import GroupResult
from ..results.requirements import require_chords
from .interface import CanvasApp
from .signatures import IMMUTABLE_OPTIONS, Signature, from_dict, maybe_signature, new_id, register_type

__all__ = ["group"]


@register_type("group")
class group(Signature):
    """``group(add.s(2, 2), add.s(4, 4))`` or ``group(add.s(i, i) for i in range(10))``: options
    given as keywords apply to every task (``group(..., queue="q")``). A generator is read when
    the group is made."""

    def __init__(self, *tasks: Any, **options: Any) -> None:
        members: Any = tasks
        if len(tasks) == 1:
            only = tasks[0]
            if isinstance(only, group):
                members = only.tasks
            elif isinstance(only, Signature):
                members = [only.clone()]
            elif isinstance(only, (list, tuple)):
                members = only
            else:
                members = list(only)
        super().__init__("celery.group", (), {"tasks": members}, subtask_type="group", **options)

    @classmethod
    def _from_dict(cls, data: Mapping[str, Any], app: CanvasApp | None) -> Signature:
        tasks = data["kwargs"]["tasks"]
        rebuilt = type(tasks)(maybe_signature(task, app=app) for task in tasks)
        return cls(rebuilt, app=app, **data["options"])

    @property
    def tasks(self) -> Any:
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

    def set_immutable(self, immutable: bool) -> None:
        for task in self.tasks:
            task.set_immutable(immutable)

    def link(self, callback: Signature) -> Signature:
        """Link ``callback`` to the first task only, made immutable (it cannot be given every
        task's result): for a callback after all of them, use a chord."""
        callback = callback.clone().set(immutable=True)
        return self.tasks[0].link(callback)  # type: ignore[no-any-return]

    def link_error(self, errback: Signature) -> Any:
        """Link a copy of ``errback`` to every task (any of them may fail)."""
        errback = maybe_signature(errback)
        return tuple(task.link_error(errback.clone()) for task in self.tasks)

    def skew(self, start: float = 1.0, stop: float | None = None, step: float = 1.0) -> group:
        """Give the tasks countdowns ``start``, ``start + step``, ... (at most ``stop``)."""
        countdown = start
        for task in self.tasks:
            task.set(countdown=countdown)
            if stop is None or countdown + step <= stop:
                countdown += step
        return self

    # -- sending --------------------------------------------------------------------------------

    def __call__(self, *partial_args: Any, **options: Any) -> Any:
        return self.apply_async(partial_args, **options)

    def apply_async(self, args: Iterable[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
                    add_to_parent: bool = True, link: Any = None, link_error: Any = None,
                    **options: Any) -> Any:
        """Send every task (``args`` before each one's own) and return their GroupResult."""
        if link is not None:
            raise TypeError("cannot link a callback to a group: use a chord, group(...) | callback")
        if link_error is not None:
            raise TypeError("cannot link an errback to a group as a whole: link it to its tasks, "
                            "group.link_error(errback)")
        if not self.tasks:
            return self.freeze()
        app = self.app
        options, group_id, root_id = self._freeze_gid(options)
        prepared = list(self._prepared(self.tasks, (), group_id, root_id, app))
        results = list(_send_all(app, prepared, args=args, kwargs=kwargs, **options))
        result = app.GroupResult(group_id, results)
        if len(result) == 1 and isinstance(result[0], GroupResult):
            # group(a | group(b, c)): the inner group is the result
            result = result[0]
        if add_to_parent:  # the group, not each of its tasks, is a child of a task sending it
            add_child(result)
        return result

    def _freeze_gid(self, options: Mapping[str, Any]) -> tuple[dict[str, Any], str, str | None]:
        """The options the tasks are sent with (the group's own, then those given, except the
        group's fixed ones) and the group's id: its ``task_id`` option, else a new one."""
        merged = {**self.options, **{key: value for key, value in options.items()
                                     if key not in IMMUTABLE_OPTIONS or key not in self.options}}
        merged["group_id"] = group_id = merged.pop("task_id", None) or new_id()
        return merged, group_id, merged.get("root_id")

    def _prepared(self, tasks: Iterable[Any], partial_args: Iterable[Any], group_id: str,
                  root_id: str | None, app: CanvasApp) -> Iterator[tuple[Signature, Any, str]]:
        """Copies of the tasks frozen as members of this group (nested groups unrolled, empty
        chains dropped), each with its result handle."""
        for index, task in enumerate(tasks):
            task = task.clone() if isinstance(task, Signature) else from_dict(task, app=app)
            if isinstance(task, group):
                yield from task._prepared(task.tasks, partial_args, group_id, root_id, app)
            elif task.runs_nothing():
                continue
            else:
                if partial_args and not task.immutable:
                    task.args = tuple(partial_args) + tuple(task.args)
                yield task, task.freeze(group_id=group_id, root_id=root_id, group_index=index), group_id

    def freeze(self, _id: str | None = None, group_id: str | None = None, chord: Signature | None = None,
               root_id: str | None = None, parent_id: str | None = None,
               group_index: int | None = None) -> Any:
        """Give the group and every task their ids now; returns the GroupResult to be."""
        group_id, results = self.freeze_tasks(_id, group_id, chord, root_id, parent_id, group_index)
        return self.app.GroupResult(group_id, results)

    def freeze_tasks(self, _id: str | None = None, group_id: str | None = None,
                     chord: Signature | None = None, root_id: str | None = None, parent_id: str | None = None,
                     group_index: int | None = None) -> tuple[str, list[Any]]:
        """Freeze copies of the tasks (nested groups flattened into this one) and put them in
        place of the originals; returns the group's id and their results."""
        opts = self.options
        gid = opts.get("task_id") or None
        if gid is None:
            gid = opts["task_id"] = new_id()
        if group_id:
            opts["group_id"] = group_id
        if chord:
            opts["chord"] = chord
        if group_index is not None:
            opts["group_index"] = group_index
        root_id = opts.setdefault("root_id", root_id)
        parent_id = opts.setdefault("parent_id", parent_id)
        flat: list[Signature] = []
        results: list[Any] = []
        pending: deque[Any] = deque(self.tasks)
        while pending:
            task = maybe_signature(pending.popleft(), app=self._app).clone()
            if isinstance(task, group):
                pending.extendleft(task.tasks)
            elif task.runs_nothing():
                continue
            else:
                flat.append(task)
                results.append(task.freeze(group_id=group_id, chord=chord, root_id=root_id,
                                           parent_id=parent_id, group_index=len(flat) - 1))
        if isinstance(self.tasks, list):
            self.tasks[:] = flat
        else:
            self.tasks = flat
        return gid, results

    # -- what a workflow holding the group asks of it --------------------------------------------

    def chord_size(self) -> int:
        return sum(_size(task) for task in self.tasks)

    def clear_chord_option(self) -> None:
        super().clear_chord_option()
        for task in self.tasks:
            task.clear_chord_option()

    def strip_chord_header_links(self) -> None:
        for task in self.tasks:
            task.strip_chord_header_links()

    def members(self) -> list[Any]:
        tasks: list[Any] = self.tasks
        return tasks

    def __repr__(self) -> str:
        return f"group({list(self.tasks)!r})" if self.tasks else "group(<empty>)"


def _size(sig: Any) -> int:
    """:meth:`Signature.chord_size` of a signature or of its dict (a plain sequence: its length)."""
    if not isinstance(sig, Signature) and isinstance(sig, Mapping):
        sig = from_dict(sig)
    return sig.chord_size() if isinstance(sig, Signature) else len(sig)


def _send_all(app: CanvasApp, prepared: list[tuple[Signature, Any, str]], chord: Signature | None = None,
              args: Iterable[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
              group_index: int | None = None, add_to_parent: bool | None = None,
              **options: Any) -> Iterator[Any]:
    """Send the prepared tasks of a group; a chord's header records the chord's size in the
    result backend just before its last task goes."""
    size = 0
    for position, (sig, result, group_id) in enumerate(prepared):
        body = chord if chord is not None else sig.options.get("chord")
        size += sig.chord_size()
        if body is not None and position == len(prepared) - 1:
            joins = require_chords(app)
            if joins is not None:  # else celery.chord_unlock polls the header
                joins.set_chord_size(group_id, size)
        sig.apply_async(chord=body, args=args, kwargs=kwargs, add_to_parent=False, **options)
        yield result
