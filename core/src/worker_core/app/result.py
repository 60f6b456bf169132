"""``AsyncResult``: a handle on a sent task's state and return value, and on the tasks before it
(``parent``, set by a chain) and those it sent (``children``, as the worker stored them)."""

from __future__ import annotations

from collections.abc import Generator, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ..control.client import broadcast
from ..results.meta import FAILURE, PROPAGATE_STATES, READY_STATES, SUCCESS, decode_result
from .awaiting import client_of

if TYPE_CHECKING:
    from .base import App
    from .groupresult import GroupResult

__all__ = ["AsyncResult", "result_from_tuple"]


class AsyncResult:
    """The state and result of one task, read from the app's result backend.

    ``parent`` is the result of the task before this one in a chain (a GroupResult for a chord's
    header), as the client that sent the workflow knows it; ``children`` are the results of the
    tasks this one sent, as the worker stored them.
    """

    def __init__(self, id: str, app: App, parent: AsyncResult | GroupResult | None = None) -> None:
        self.id = id
        self.app = app
        self.parent = parent
        self._ready_meta: Mapping[str, Any] | None = None

    @property
    def task_id(self) -> str:
        return self.id

    def _meta(self) -> Mapping[str, Any]:
        if self._ready_meta is not None:
            return self._ready_meta
        meta: Mapping[str, Any] = self.app.backend.get_task_meta(self.id)
        if meta.get("status") in READY_STATES:
            self._ready_meta = meta
        return meta

    def get(self, timeout: float | None = None, propagate: bool = True, interval: float = 0.5,
            follow_parents: bool = True) -> Any:
        """Wait for the task to finish and return its value.

        :param timeout: seconds to wait; ``ResultTimeout`` after that.
        :param propagate: re-raise the task's exception (as its own type) if it failed.
        :param follow_parents: with ``propagate``, first re-raise the exception of a task before
            this one in its chain that has already failed (the first one, as Celery does).
        """
        if follow_parents and propagate and self.parent is not None:
            for node in reversed(list(self._parents())):
                node.maybe_throw()
        if self._ready_meta is None:
            meta = self.app.backend.wait_for(self.id, timeout=timeout, interval=interval)
            self._ready_meta = meta
        meta = self._ready_meta
        value = decode_result(meta)
        if propagate and meta.get("status") in PROPAGATE_STATES and isinstance(value, BaseException):
            raise value
        return value

    wait = get

    async def aget(self, timeout: float | None = None, propagate: bool = True, interval: float = 0.5,
                   follow_parents: bool = True) -> Any:
        """:meth:`get` from async code: waits for the result without blocking the event loop
        (``await result`` does the same with the defaults)."""
        client = client_of(self.app)
        if follow_parents and propagate and self.parent is not None:
            await client.call(lambda: [node.maybe_throw() for node in reversed(list(self._parents()))])
        if self._ready_meta is None:
            self._ready_meta = await client.wait(self.id, timeout, interval)
        return self.get(timeout=0, propagate=propagate, follow_parents=False)

    def __await__(self) -> Generator[Any, None, Any]:
        return self.aget().__await__()

    def _parents(self) -> Iterator[AsyncResult | GroupResult]:
        node = self.parent
        while node is not None:
            yield node
            node = node.parent

    def maybe_throw(self, propagate: bool = True) -> None:
        """Raise the task's exception if it has failed (reads its state; does not wait)."""
        meta = self._meta()
        if propagate and meta.get("status") in PROPAGATE_STATES:
            value = decode_result(meta)
            if isinstance(value, BaseException):
                raise value

    def revoke(self, terminate: bool = False, signal: str | int | None = None) -> None:
        """Ask every worker to discard this task, and with ``terminate`` to kill the process
        running it (``signal``, TERM by default); like Celery's, it does not wait for replies."""
        broadcast(self.app, "revoke", {"task_id": self.id, "terminate": terminate, "signal": signal},
                  reply=False)

    @property
    def state(self) -> str:
        return str(self._meta().get("status"))

    status = state

    @property
    def result(self) -> Any:
        """The return value, or the exception for a failed task (without raising it)."""
        return decode_result(self._meta())

    info = result

    @property
    def traceback(self) -> str | None:
        return self._meta().get("traceback")

    @property
    def date_done(self) -> str | None:
        return self._meta().get("date_done")

    # What the result_extended setting stores with a result (None without it), as in Celery.

    @property
    def name(self) -> str | None:
        return self._meta().get("name")

    @property
    def args(self) -> list[Any] | None:
        return self._meta().get("args")

    @property
    def kwargs(self) -> dict[str, Any] | None:
        return self._meta().get("kwargs")

    @property
    def worker(self) -> str | None:
        return self._meta().get("worker")

    @property
    def retries(self) -> int | None:
        return self._meta().get("retries")

    @property
    def queue(self) -> str | None:
        return self._meta().get("queue")

    def ready(self) -> bool:
        return self.state in READY_STATES

    def successful(self) -> bool:
        return self.state == SUCCESS

    def failed(self) -> bool:
        return self.state == FAILURE

    def forget(self) -> None:
        """Delete the stored result of this task and of the tasks before it."""
        self._ready_meta = None
        self.app.backend.forget(self.id)
        if self.parent is not None:
            self.parent.forget()

    @property
    def children(self) -> list[AsyncResult | GroupResult]:
        """The results of the tasks this task sent (its callbacks, the next step of its chain,
        ...), read from the ``children`` the worker stored with its result (Celery's result
        tuples); empty until the task has finished."""
        return [result_from_tuple(child, self.app) for child in self._meta().get("children") or ()]

    def as_tuple(self) -> tuple[Any, ...]:
        """Celery's result tuple: ``((id, parent's tuple or None), None)``."""
        return (self.id, self.parent.as_tuple() if self.parent is not None else None), None

    def as_list(self) -> list[str]:
        """This task's id, then its parents' (for a chain: last to first)."""
        ids = [self.id]
        if self.parent is not None:
            ids.extend(self.parent.as_list())
        return ids

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AsyncResult) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        return f"<AsyncResult: {self.id}>"


def result_from_tuple(value: Any, app: App) -> AsyncResult | GroupResult:
    """The result a Celery result tuple describes (as stored in ``children`` or a saved group,
    lists in JSON): ``[[id, parent], None]`` a task's, ``[[id, parent], [children]]`` a group's,
    ``parent`` the same form or None. A bare id is a task's."""
    if isinstance(value, AsyncResult) or hasattr(value, "results"):  # a result, or a group's
        given: AsyncResult | GroupResult = value
        return given
    if isinstance(value, str):
        return AsyncResult(value, app)
    try:
        head, nodes = value
    except (TypeError, ValueError):
        raise ValueError(f"not a Celery result tuple: {value!r}") from None
    if isinstance(head, (list, tuple)):
        task_id, parent_tuple = head
    else:
        task_id, parent_tuple = head, None
    parent = result_from_tuple(parent_tuple, app) if parent_tuple else None
    if nodes is not None:
        group: GroupResult = app.GroupResult(task_id, [result_from_tuple(node, app) for node in nodes],
                                             parent=parent)
        return group
    return AsyncResult(task_id, app, parent=parent)
