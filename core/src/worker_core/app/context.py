"""``task.request``: what a running task knows about its own message.

The current request lives in a context variable, so it is each thread's own, and each asyncio
task's own when many run on one event loop (each task runs in a copy of the context it was
created in): a coroutine that awaits never sees the request of another one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import attrs

__all__ = ["MESSAGE_FIELDS", "TaskContext", "add_child", "current_context", "pop", "push", "pushed",
           "workflow_options"]


@attrs.define(slots=True)
class TaskContext:
    """The request of the task being run (``self.request`` inside a bound task)."""

    id: str | None = None
    task: str | None = None
    args: list[Any] = attrs.field(factory=list)
    kwargs: dict[str, Any] = attrs.field(factory=dict)
    retries: int = 0
    eta: str | None = None
    expires: str | None = None
    timelimit: tuple[float | None, float | None] = (None, None)
    root_id: str | None = None
    parent_id: str | None = None
    group: str | None = None
    group_index: int | None = None
    origin: str | None = None
    hostname: str | None = None
    reply_to: str | None = None
    correlation_id: str | None = None
    delivery_info: Mapping[str, Any] = attrs.field(factory=dict)
    ignore_result: bool = False
    #: the name the sender gave the task for logs and monitors, if any
    shadow: str | None = None
    #: the message's own headers (the sender's ``headers=``), None when it has none, as in Celery
    headers: dict[str, Any] | None = None
    is_eager: bool = False
    called_directly: bool = True
    #: The message's canvas (its embed), as the message carries it, as Celery's request has it:
    #: the signatures sent with the return value (``link``), those sent with the task's id if
    #: it fails (``link_error``), the rest of its chain (last step first) and the body of the
    #: chord whose header it is part of.
    callbacks: list[Any] | None = None
    errbacks: list[Any] | None = None
    chain: list[Any] | None = None
    chord: Mapping[str, Any] | None = None
    #: how many times the task was replaced on its way here (``Task.replace``)
    replaced_task_nesting: int = 0
    #: the results of the tasks sent while this one runs, stored with its result (``children``)
    children: list[Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self, recurse=False)

    def get(self, key: str, default: Any = None) -> Any:
        """An attribute, or one of the message's own headers, else ``default`` (Celery's)."""
        return getattr(self, key, default)

    if not TYPE_CHECKING:  # at run time only: mypy keeps checking the declared attributes
        def __getattr__(self, name: str) -> Any:
            # As in Celery, each of the message's own headers is an attribute of the request.
            if not name.startswith("__"):
                try:
                    headers = object.__getattribute__(self, "headers")
                except AttributeError:
                    headers = None
                if headers and name in headers:
                    return headers[name]
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


#: What a request carries from its message to the executor, in :class:`TaskContext`'s order
#: (after id, task, args and kwargs): the executor gets them as a tuple, which a process pool
#: pickles in half the time of a dict of them.
MESSAGE_FIELDS = ("retries", "eta", "expires", "timelimit", "root_id", "parent_id", "group", "group_index",
                  "origin", "hostname", "reply_to", "correlation_id", "delivery_info", "ignore_result",
                  "shadow", "headers")


_EMPTY = TaskContext()
#: the requests being run here, innermost last: a tuple, never changed in place, since contexts
#: copied from one another (asyncio tasks) share the value they had when copied
_stack: ContextVar[tuple[TaskContext, ...]] = ContextVar("worker_task_requests", default=())


def current_context() -> TaskContext:
    stack = _stack.get()
    return stack[-1] if stack else _EMPTY


def workflow_options(request: TaskContext) -> dict[str, Any]:
    """The options that send a task again with the same place in its workflow (a retry): its
    callbacks, errbacks, the rest of its chain, its chord and place in its group, as the message
    carried them."""
    options: dict[str, Any] = {}
    if request.callbacks:
        options["link"] = request.callbacks
    if request.errbacks:
        options["link_error"] = request.errbacks
    if request.chain:
        options["chain"] = request.chain
    if request.chord is not None:
        options["chord"] = request.chord
    if request.group_index is not None:
        options["group_index"] = request.group_index
    if request.replaced_task_nesting:
        options["replaced_task_nesting"] = request.replaced_task_nesting
    if options:  # not recorded as a child of itself
        options["add_to_parent"] = False
    return options


def add_child(result: Any) -> None:
    """Record ``result`` (of a task just sent) as a child of the task this thread runs for a
    worker, stored with that task's result as Celery's worker stores it; nothing outside one."""
    stack = _stack.get()
    if stack:
        current = stack[-1]
        if current.id and not current.called_directly:
            if current.children is None:
                current.children = [result]
            else:
                current.children.append(result)


def push(context: TaskContext) -> None:
    """Make ``context`` the current request of this thread or asyncio task (the executor's fast
    path)."""
    _stack.set((*_stack.get(), context))


def pop() -> None:
    _stack.set(_stack.get()[:-1])


@contextmanager
def pushed(context: TaskContext) -> Iterator[TaskContext]:
    """Make ``context`` the current request for this thread or asyncio task while the task runs."""
    push(context)
    try:
        yield context
    finally:
        pop()
