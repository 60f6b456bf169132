"""``DjangoApp``: a Django project's tasks as this worker's :class:`~worker_core.App` (a
:class:`~worker_core.slots.ForeignApp`): its settings are the ``OPTIONS`` of the project's
``WorkerBackend``, its queues the backend's ``QUEUES``, its tasks the project's ``@task``
functions, each run by :func:`worker_django.execution.execute`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from worker_core import App, Task

from . import discovery
from .configuration import default_result_backend
from .request import DjangoRequest

if TYPE_CHECKING:
    from worker_core import WorkerOptions

    from .backend import WorkerBackend

__all__ = ["DjangoApp", "DjangoTaskView", "DjangoTasks"]


class DjangoTaskView(Task):
    """A Django ``@task`` as the worker's main process sees it (the options the worker reads come
    from the settings); calling it calls the task."""

    def __init__(self, task: Any) -> None:
        super().__init__()
        #: the Django task itself
        self.django = task

    def run(self, *args: Any, **kwargs: Any) -> Any:
        return self.django.call(*args, **kwargs)

    @property
    def module(self) -> str:
        return str(self.django.func.__module__)


class DjangoTasks(dict[str, Task]):
    """The tasks by path: those found at start, and one more each time a message names a
    ``@task`` of an installed app's package that is not there yet (see :mod:`.discovery`)."""

    def __init__(self, app: DjangoApp) -> None:
        super().__init__()
        self._app = app
        self._absent: set[str] = set()
        self._adding: set[str] = set()

    def get(self, name: str, default: Any = None) -> Any:
        task = super().get(name)
        if task is None and name not in self._absent and name not in self._adding:
            found = discovery.find(name)
            if found is None:
                if len(self._absent) < 10_000:  # (bounded: names come from messages)
                    self._absent.add(name)
                return default
            task = self._app.add_django_task(name, found)
        return task if task is not None else default

    def add(self, name: str, register: Any) -> Any:
        """``register()`` the task ``name`` (which looks it up here: not found, not searched)."""
        self._adding.add(name)
        try:
            return register()
        finally:
            self._adding.discard(name)


class DjangoApp(App):
    """The Django project whose settings module ``-A`` named, its ``TASKS`` entry ``backend``."""

    request_class: ClassVar[type[Any]] = DjangoRequest

    def __init__(self, backend: WorkerBackend, settings_module: str, notes: list[str] | None = None) -> None:
        super().__init__(f"django:{settings_module}")
        settings = dict(backend.settings)
        default_result_backend(settings, self.plugins)
        self.conf.update(**settings)
        #: the project's ``WorkerBackend`` (its ``TASKS`` alias is ``backend.alias``)
        self.backend_of_tasks = backend
        #: the project's settings module
        self.settings_module = settings_module
        #: what ``manage.py check`` warns of this backend, logged as the worker starts
        self.notes: list[str] = list(notes or ())
        self.tasks: DjangoTasks = DjangoTasks(self)
        for name, task in sorted(discovery.autodiscover().items()):
            self.add_django_task(name, task)

    def add_django_task(self, name: str, task: Any) -> Task:
        """Register the view of a Django ``@task`` under its path."""
        view: Task = self.tasks.add(name, lambda: self.register_task(DjangoTaskView(task), name=name))
        return view

    def worker_defaults(self, defaults: WorkerOptions) -> WorkerOptions:
        """The queues: the backend's ``QUEUES`` (``default`` when it lists none, which lets tasks
        name any queue: give the others with ``-Q``)."""
        queues = tuple(sorted(self.backend_of_tasks.queues)) or ("default",)
        return defaults.replace(queues=queues)

    def __repr__(self) -> str:
        return f"<DjangoApp {self.settings_module}: {len(self.tasks)} tasks>"
