"""``chord``: a group (the header) whose results, as one list, are given to a last task (the
body) once every header task has finished.

Sending a chord gives the body its task id, records what the result backend needs to join the
header (:class:`~worker_core.slots.JoinsChords`), then sends the header as a group whose every
task carries the body in its embed (``chord``). The worker that finishes the last header task
sends the body. ``apply_async()`` returns the body's result, whose ``parent`` is the header's
GroupResult.

One module: besides the class, the helpers that only a chord's sending uses (moving callbacks
onto the body, taking the body off nested headers, counting the results the body waits for).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..results.requirements import require_chords
from .groups import group
from .interface import CanvasApp
from .signatures import RUN_OPTIONS, Signature, as_list, maybe_signature, new_id, register_type, signature

__all__ = ["chord", "strip_chord_header_links"]


def _header_tasks(tasks: Any, app: CanvasApp | None) -> Any:
    """A chord's header as the list of its signatures (a group or chain given gives its tasks)."""
    if isinstance(tasks, Mapping) and not isinstance(tasks, Signature):
        tasks = signature(tasks, app=app)
    if isinstance(tasks, Signature):
        return tasks.members()
    return [signature(task, app=app) for task in tasks]


@register_type("chord")
class chord(Signature):
    """``chord([add.s(2, 2), add.s(4, 4)], tsum.s())``, ``chord(header)(body)``, or a group piped
    into a task: ``group(...) | tsum.s()``.

    Needs a result backend that joins chords (the Redis backend); others are refused when the
    chord is sent, saying what to configure.
    """

    def __init__(self, header: Any, body: Any = None, task: str = "celery.chord",
                 args: Iterable[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
                 app: CanvasApp | None = None, **options: Any) -> None:
        members = dict(kwargs) if kwargs else {"kwargs": {}}
        members.update(header=_header_tasks(header, app), body=maybe_signature(body, app=app))
        options.setdefault("subtask_type", "chord")
        super().__init__(task, tuple(args or ()), members, app=app, **options)

    @classmethod
    def _from_dict(cls, data: Mapping[str, Any], app: CanvasApp | None) -> Signature:
        rest = dict(data["kwargs"])
        header, body = rest.pop("header", None), rest.pop("body", None)
        return cls(header, body, task=data.get("task", "celery.chord"), args=data.get("args"), kwargs=rest,
                   app=app, options=data.get("options"), immutable=bool(data.get("immutable")))

    @property
    def tasks(self) -> Any:
        """The header: a list of signatures, a group once frozen."""
        return self.kwargs["header"]

    @tasks.setter
    def tasks(self, value: Any) -> None:
        self.kwargs["header"] = value

    @property
    def body(self) -> Any:
        return self.kwargs.get("body")

    @body.setter
    def body(self, value: Any) -> None:
        self.kwargs["body"] = value

    @property
    def app(self) -> CanvasApp:
        if self._app is None:
            header = self.tasks.tasks if isinstance(self.tasks, group) else self.tasks
            for task in [*(header or ()), self.body]:
                if isinstance(task, Signature):
                    try:
                        return task.app
                    except Exception:
                        continue
        return super().app

    @app.setter
    def app(self, value: CanvasApp) -> None:
        self._app = value

    def clone(self, args: Iterable[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
              **options: Any) -> Signature:
        copy = super().clone(args, kwargs, **options)
        if copy.kwargs.get("body") is not None:
            copy.kwargs["body"] = maybe_signature(copy.kwargs["body"], clone=True)
        return copy

    def set_immutable(self, immutable: bool) -> None:
        """Make the header's tasks (not the body) take no partial arguments."""
        for task in self.tasks:
            task.set_immutable(immutable)

    def link(self, callback: Signature) -> Signature:
        """Link ``callback`` to the body."""
        self.body.link(callback)
        return callback

    def link_error(self, errback: Signature) -> Signature:
        """Link ``errback`` to the body (and, with the setting
        ``task_allow_error_cb_on_chord_header``, to every header task)."""
        errback = maybe_signature(errback)
        header = self.tasks.tasks if isinstance(self.tasks, group) else self.tasks
        if self.app.settings.task_allow_error_cb_on_chord_header:
            for task in header or ():
                task.link_error(errback.clone(immutable=True))
        for task in header or ():
            if isinstance(task, chord):
                task.link_error(errback)
        self.body.link_error(errback)
        linked: Signature = errback
        return linked

    # -- sending --------------------------------------------------------------------------------

    def __call__(self, body: Any = None, **options: Any) -> Any:
        return self.apply_async((), {"body": body} if body else {}, **options)

    def apply_async(self, args: Iterable[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
                    task_id: str | None = None, **options: Any) -> Any:
        """Send the chord: ``args`` go to the header's tasks, ``countdown``/``eta`` delay the
        header, ``link``/``link_error`` are linked to the body; returns the body's result."""
        given = tuple(args or ())
        header_args = given + tuple(self.args) if given and not self.immutable else tuple(self.args)
        call_kwargs = dict(kwargs or {})
        body = call_kwargs.pop("body", None) or self.body
        header_kwargs = dict(self.kwargs.get("kwargs") or {}, **call_kwargs)
        # countdown/eta delay the header (run() takes ``countdown`` for something else)
        delay = {key: options.pop(key) for key in ("countdown", "eta") if options.get(key) is not None}
        callbacks = {key: options.pop(key) for key in ("link", "link_error") if key in options}
        body = body.clone(**_body_options(options))
        app = _app_of(self, body)
        tasks = self.tasks
        if isinstance(tasks, group):
            tasks = tasks.clone()
        else:
            tasks = group(list(tasks), app=app, task_id=self.options.get("task_id") or new_id())
        merged = dict(self.options, **options, **callbacks)
        for key in ("countdown", "eta"):
            merged.pop(key, None)
        option_task_id = merged.pop("task_id", None)
        return self.run(tasks, body, header_args, task_id=task_id or option_task_id, kwargs=header_kwargs,
                        header_delay=delay, app=app, **merged)

    def run(self, header: Any, body: Signature, partial_args: Iterable[Any], app: CanvasApp | None = None,
            interval: float | None = None, countdown: float = 1, max_retries: int | None = None,
            task_id: str | None = None, kwargs: Mapping[str, Any] | None = None,
            header_delay: Mapping[str, Any] | None = None, **options: Any) -> Any:
        """Freeze the body, let the result backend prepare the join (or send
        ``celery.chord_unlock`` to poll it, for a backend that does not join), send the header.

        ``interval``, ``countdown`` and ``max_retries`` are Celery's ``chord_unlock`` options: the
        pause between two looks at the header (``result_chord_retry_interval`` when None), when
        the first look is, and how many looks at most (None: until it is complete).
        """
        app = app or _app_of(self, body)
        joins = require_chords(app)
        group_id = header.options.get("task_id") or new_id()
        root_id = body.options.get("root_id")
        options = dict(self.options, **options)
        delay = dict(header_delay or {})
        for key in ("countdown", "eta"):
            if key not in delay and options.get(key) is not None:
                delay[key] = options[key]
            options.pop(key, None)
        if options:
            options.pop("task_id", None)
            body = _add_body_callbacks(body, options)
            body.options.update(_body_options(options))
        body.unroll_chords()
        body_result = body.freeze(task_id or new_id(), group_id=group_id, root_id=root_id)
        body.strip_chord_header_links()
        # the header's tasks carry the body themselves; a chain's rest travels with the body
        for key in ("chain", "chord", "task_id"):
            options.pop(key, None)
        header.options["task_id"] = group_id
        _, header_results = header.freeze_tasks(group_id=group_id, chord=body, root_id=root_id)
        if header.tasks:
            header_tuple = app.GroupResult(group_id, header_results).as_tuple()
            if joins is not None:
                joins.apply_chord(group_id, header_tuple)
            else:
                _send_chord_unlock(app, group_id, body, header_tuple, interval=interval, countdown=countdown,
                                   max_retries=max_retries)
            header_result = header.apply_async(partial_args, kwargs, task_id=group_id,
                                               **dict(options, **delay))
        else:
            body.delay([])  # nothing will finish to send it
            header_result = app.GroupResult(group_id, header_results)
        body_result.parent = header_result
        return body_result

    def freeze(self, _id: str | None = None, group_id: str | None = None, chord: Signature | None = None,
               root_id: str | None = None, parent_id: str | None = None,
               group_index: int | None = None) -> Any:
        """Give the header's tasks and the body their ids now; returns the body's result, the
        header's GroupResult at the root of its parents."""
        if not isinstance(self.tasks, group):
            self.tasks = group(self.tasks, app=self.app)
        header_result = self.tasks.freeze(parent_id=parent_id, root_id=root_id, chord=self.body)
        self.id = self.tasks.id
        if self.body is None:
            return None  # a chord without a body has no result
        body_result = self.body.freeze(_id, root_id=root_id, chord=chord, group_id=group_id,
                                       group_index=group_index)
        node: Any = body_result
        seen: set[str] = set()
        while node is not None:
            if node.id in seen:
                raise RuntimeError("the results of this chord's body are their own parents")
            seen.add(node.id)
            if node.parent is None:
                node.parent = header_result
                break
            node = node.parent
        return body_result

    def unroll_body(self) -> list[Signature]:
        """This chord followed by the rest of its body, a chain led by a task:
        ``chord(h, a | b | c)`` gives ``[chord(h, a), b, c]`` (every header task carries a copy
        of the body, which should not hold the rest of the chain)."""
        task = self.clone()
        assert isinstance(task, chord)
        body_tasks = task.body.unchain_tasks()
        first_options = {key: value for key, value in task.body.options.items() if key not in RUN_OPTIONS}
        task.body = body_tasks[0].clone(**first_options)
        return [task, *body_tasks[1:]]

    # -- what a workflow holding the chord asks of it --------------------------------------------

    def chord_size(self) -> int:
        body = self.body
        if not isinstance(body, Signature) and isinstance(body, Mapping):
            body = maybe_signature(body)
        return body.chord_size() if isinstance(body, Signature) else len(body)

    def clear_chord_option(self) -> None:
        super().clear_chord_option()
        if self.body is not None:
            self.body.clear_chord_option()

    def strip_chord_header_links(self) -> None:
        header = self.tasks
        for task in header if isinstance(header, list) else [header]:  # a list until frozen
            task.clear_chord_option()
            task.strip_chord_header_links()
        if self.body is not None:
            self.body.strip_chord_header_links()

    def __repr__(self) -> str:
        return f"chord({self.tasks!r}, {self.body!r})" if self.body is not None else f"chord({self.tasks!r})"


def strip_chord_header_links(sig: Any) -> None:
    """:meth:`Signature.strip_chord_header_links` of a signature, or of each of a list of them."""
    for task in sig if isinstance(sig, list) else [sig]:
        task.strip_chord_header_links()


def _send_chord_unlock(app: CanvasApp, group_id: str, body: Signature, header: Any, *, interval: float | None,
                       countdown: float, max_retries: int | None) -> None:
    """Send ``celery.chord_unlock`` as Celery's client does for a backend that does not join
    chords: routed as the body, with its priority, to look at the header after ``countdown``."""
    body_task = body.type
    queue = body.options.get("queue") or (body_task.queue if body_task is not None else None)
    priority = body.options.get("priority", body_task.priority if body_task is not None else None)
    app.send_task("celery.chord_unlock", (group_id, body), {"interval": interval, "max_retries": max_retries,
                                                            "result": header[1]},
                  countdown=countdown, queue=queue, priority=priority,
                  route_name=None if queue else body.task)


def _app_of(sig: chord, body: Any) -> CanvasApp:
    if sig.known_app is not None:
        return sig.known_app
    header = sig.tasks.tasks if isinstance(sig.tasks, group) else sig.tasks
    for task in [*(header or ()), body]:
        if isinstance(task, Signature):
            try:
                return task.app
            except Exception:
                continue
    return sig.app


def _body_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The chord's options the body takes: all but ``parent_id`` (its parent is a header task)."""
    return {key: value for key, value in options.items() if key != "parent_id"}


def _clone_with_members(sig: Any) -> Any:
    """A copy of ``sig`` and of the signatures ``link()`` would change in it (a group's tasks,
    a chord's body), which a plain clone shares."""
    sig = maybe_signature(sig, clone=True)
    if isinstance(sig, group):
        sig.tasks = [_clone_with_members(task) for task in sig.tasks]
    elif isinstance(sig, chord):
        sig.body = _clone_with_members(sig.body)
    return sig


def _link_error_to_body_tasks(sig: Any, errback: Signature, runs_as_group: bool = True) -> None:
    if isinstance(sig, group):
        if runs_as_group and sig.options.get("link_error") is not None:
            sig.append_to_list_option("link_error", errback.clone())
        else:
            for task in sig.tasks:
                _link_error_to_body_tasks(task, errback, runs_as_group=False)
    elif isinstance(sig, chord):
        _link_error_to_body_tasks(sig.body, errback)
    else:
        sig.link_error(errback.clone())


def _add_body_callbacks(body: Any, options: dict[str, Any]) -> Any:
    """Move ``link`` and ``link_error`` from ``options`` onto the body (a copy when there are
    any): callbacks as ``body.link`` does, errbacks to each task of a group body, else to the
    body's own ``link_error``."""
    callbacks = as_list(options.pop("link", None)) or []
    errbacks = as_list(options.pop("link_error", None)) or []
    if callbacks or errbacks:
        body = _clone_with_members(body)
    for callback in callbacks:
        callback = _clone_with_members(maybe_signature(callback, app=body.known_app))
        if isinstance(body, group) and not body.tasks:
            body.append_to_list_option("link", callback)
        else:
            body.link(callback)
    for errback in errbacks:
        if isinstance(body, group):
            _link_error_to_body_tasks(body, maybe_signature(errback, app=body.known_app))
        else:
            body.append_to_list_option("link_error", errback)
    return body
