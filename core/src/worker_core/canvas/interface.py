"""What canvas needs of the app a signature sends with, and of its tasks: small Protocols that
:class:`~worker_core.App` and :class:`~worker_core.Task` satisfy (mypy checks it), so canvas
depends on these and not on the app's module."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..app.settings import Settings
    from ..slots import ResultBackend

__all__ = ["CanvasApp", "CanvasTask", "RunningTask"]


class CanvasTask(Protocol):
    """A registered task, as a signature of it sends or calls it."""

    @property
    def name(self) -> str:
        """The task's name."""

    @property
    def bind(self) -> bool:
        """Whether the task's function takes the task as its first argument."""

    @property
    def fun(self) -> Callable[..., Any]:
        """The task's function (an errback's arguments are read from it)."""

    @property
    def queue(self) -> str | None:
        """The queue the task is sent to by default."""

    @property
    def priority(self) -> int | None:
        """The task's default priority."""

    def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        """Send the task with ``args`` and ``kwargs``; returns its result handle."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the task here and now."""


class RunningTask(Protocol):
    """The task a worker runs, as ``replace`` and ``add_to_chord`` hand over its place in its
    workflow."""

    @property
    def name(self) -> str:
        """The task's name."""

    @property
    def app(self) -> CanvasApp:
        """Its app."""

    @property
    def request(self) -> Any:
        """Its request (``TaskContext``): its id, callbacks, errbacks, chain, chord, group."""


class CanvasApp(Protocol):
    """An app as canvas uses it: its tasks and settings, sending a task by name, its result
    backend, and the handles of results."""

    @property
    def tasks(self) -> Mapping[str, Any]:
        """The registered tasks by name (each a :class:`CanvasTask`)."""

    @property
    def settings(self) -> Settings:
        """The app's settings."""

    @property
    def backend(self) -> ResultBackend:
        """This process's result backend."""

    @property
    def thread_oid(self) -> str:
        """This thread's id as a client: the ``reply_to`` of what it freezes."""

    @property
    def GroupResult(self) -> Any:
        """The class of a group's result, bound to this app: ``GroupResult(group_id, results)``,
        ``GroupResult.restore(group_id)``."""

    def result_url(self) -> str:
        """The result backend's URL, for messages."""

    def send_task(self, name: str, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        """Send task ``name`` (it need not be registered here); returns its result handle."""

    def AsyncResult(self, task_id: str) -> Any:
        """The handle of task ``task_id``'s result."""
