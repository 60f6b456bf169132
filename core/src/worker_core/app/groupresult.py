"""``ResultSet`` and ``GroupResult``: the results of several tasks read together (a group's),
and Celery's result tuples that carry them through messages and result backends."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from ..control.client import broadcast
from ..results.requirements import require_groups
from .result import AsyncResult, result_from_tuple

if TYPE_CHECKING:
    from .base import App

__all__ = ["GroupResult", "ResultSet", "result_from_tuple"]


class ResultSet:
    """Several results, read and waited for together: ``results`` in the order given."""

    def __init__(self, results: Sequence[AsyncResult | GroupResult] | None = None,
                 app: App | None = None) -> None:
        self.results: list[AsyncResult | GroupResult] = list(results or [])
        self._app = app

    @property
    def app(self) -> App:
        if self._app is not None:
            return self._app
        if self.results:
            return self.results[0].app
        raise ValueError(f"{self!r} has no results and no app: give it one, ResultSet(results, app=app)")

    # -- membership ---------------------------------------------------------------------------

    def add(self, result: AsyncResult | GroupResult) -> None:
        """Add ``result`` unless it is a member already."""
        if result not in self.results:
            self.results.append(result)

    def remove(self, result: AsyncResult | GroupResult | str) -> None:
        """Remove a member (a result or a task id); KeyError when it is not one."""
        if isinstance(result, str):
            result = AsyncResult(result, self.app)
        try:
            self.results.remove(result)
        except ValueError:
            raise KeyError(result) from None

    def discard(self, result: AsyncResult | GroupResult | str) -> None:
        """Remove a member if it is one."""
        try:
            self.remove(result)
        except KeyError:
            pass

    def update(self, results: Sequence[AsyncResult | GroupResult]) -> None:
        self.results.extend(result for result in results if result not in self.results)

    def clear(self) -> None:
        self.results[:] = []

    # -- state ------------------------------------------------------------------------------------

    def successful(self) -> bool:
        """Every task succeeded."""
        return all(result.successful() for result in self.results)

    def failed(self) -> bool:
        """A task failed."""
        return any(result.failed() for result in self.results)

    def waiting(self) -> bool:
        """A task has not finished."""
        return any(not result.ready() for result in self.results)

    def ready(self) -> bool:
        """Every task finished (succeeded, failed or was revoked)."""
        return all(result.ready() for result in self.results)

    def completed_count(self) -> int:
        """How many tasks succeeded."""
        return sum(1 for result in self.results if result.successful())

    def maybe_throw(self, propagate: bool = True) -> None:
        """Raise the exception of the first failed task, if any (does not wait)."""
        for result in self.results:
            result.maybe_throw(propagate=propagate)

    # -- values -----------------------------------------------------------------------------------

    def join(self, timeout: float | None = None, propagate: bool = True, interval: float = 0.5,
             callback: Callable[[str | None, Any], None] | None = None) -> list[Any]:
        """Wait for every task and return their values in order.

        :param timeout: seconds for the whole set; ``ResultTimeout`` after that.
        :param propagate: re-raise the first failed task's exception (in order); otherwise its
            place holds the exception.
        :param callback: called with ``(task_id, value)`` for each instead of collecting them
            (the list returned is then empty).
        """
        started = time.monotonic()
        values: list[Any] = []
        for result in self.results:
            remaining = None if timeout is None else max(timeout - (time.monotonic() - started), 0.0)
            value = result.get(timeout=remaining, propagate=propagate, interval=interval)
            if callback is not None:
                callback(result.id, value)
            else:
                values.append(value)
        return values

    join_native = join

    def get(self, timeout: float | None = None, propagate: bool = True, interval: float = 0.5,
            callback: Callable[[str | None, Any], None] | None = None) -> list[Any]:
        """:meth:`join`."""
        return self.join(timeout=timeout, propagate=propagate, interval=interval, callback=callback)

    def forget(self) -> None:
        """Delete every task's stored result."""
        for result in self.results:
            result.forget()

    def revoke(self, terminate: bool = False, signal: str | int | None = None) -> None:
        """Ask every worker to discard all these tasks (see :meth:`AsyncResult.revoke`)."""
        ids = [result.id for result in self.results]
        broadcast(self.app, "revoke", {"task_id": ids, "terminate": terminate, "signal": signal}, reply=False)

    # -- a sequence of results ------------------------------------------------------------------

    def __iter__(self) -> Iterator[AsyncResult | GroupResult]:
        return iter(self.results)

    def __getitem__(self, index: int) -> AsyncResult | GroupResult:
        return self.results[index]

    def __len__(self) -> int:
        return len(self.results)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ResultSet):
            return other.results == self.results
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: [{', '.join(str(result.id) for result in self.results)}]>"


class GroupResult(ResultSet):
    """The results of a group's tasks, under the group's id: what ``group(...).apply_async()``
    returns. ``save()`` keeps it in the result backend so any client can ``restore()`` it by id,
    in Celery's format (Celery clients restore what this one saved and the reverse)."""

    #: The app of ``app.GroupResult``, a class bound to it.
    bound_app: ClassVar[App | None] = None

    def __init__(self, id: str | None = None, results: Sequence[AsyncResult | GroupResult] | None = None,
                 parent: AsyncResult | GroupResult | None = None, app: App | None = None) -> None:
        super().__init__(results, app=app or self.bound_app)
        self.id = id
        self.parent = parent

    def save(self) -> GroupResult:
        """Keep this group's id and its tasks' ids in the result backend (needs one that
        :class:`~worker_core.slots.SavesGroups`: the embedded or Redis backend)."""
        if not self.id:
            raise ValueError("a GroupResult needs an id to be saved")
        require_groups(self.app).save_group(self.id, self.as_tuple())
        return self

    @classmethod
    def restore(cls, id: str, app: App | None = None) -> GroupResult | None:
        """The group saved under ``id`` (by this client or a Celery one), or None."""
        app = app or cls.bound_app
        if app is None:
            raise ValueError(f"GroupResult.restore({id!r}) needs the app: GroupResult.restore(id, app=app) "
                             f"or app.GroupResult.restore(id)")
        saved = require_groups(app).restore_group(id)
        if saved is None:
            return None
        restored = result_from_tuple(saved, app)
        if not isinstance(restored, GroupResult):
            raise ValueError(f"the result saved as group {id!r} is not a group's: {saved!r}")
        return restored

    def delete(self) -> None:
        """Delete the saved group (the tasks' results stay)."""
        if self.id:
            require_groups(self.app).delete_group(self.id)

    def as_tuple(self) -> tuple[Any, ...]:
        """Celery's result tuple: ``((id, parent's tuple or None), [each result's tuple])``."""
        return ((self.id, self.parent.as_tuple() if self.parent is not None else None),
                [result.as_tuple() for result in self.results])

    def as_list(self) -> list[str]:
        ids = [str(self.id)]
        if self.parent is not None:
            ids.extend(self.parent.as_list())
        return ids

    @property
    def children(self) -> list[AsyncResult | GroupResult]:
        return self.results

    def __bool__(self) -> bool:
        return bool(self.id or self.results)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, GroupResult):
            return other.id == self.id and other.results == self.results and other.parent == self.parent
        if isinstance(other, str):
            return other == self.id
        return NotImplemented

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(self.id)

    def __str__(self) -> str:
        return str(self.id)

    def __repr__(self) -> str:
        return f"<GroupResult: {self.id} [{', '.join(str(result.id) for result in self.results)}]>"
