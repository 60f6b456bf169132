"""``CeleryApp``: a ``celery.Celery`` app as this worker's :class:`~worker_core.App`, its
settings translated and its tasks listed, whose tasks run through Celery's own machinery (a
:class:`~worker_core.slots.ForeignApp`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from worker_core import App

from .request import CeleryRequest
from .settings import configuration, translate, unsupported
from .tasks import register_views

if TYPE_CHECKING:
    from celery import Celery

    from worker_core.options import WorkerOptions

__all__ = ["CeleryApp"]


class CeleryApp(App):
    """The Celery app ``-A SPEC`` named, adapted.

    Settings come from the Celery app's configuration (the values it sets; Celery's defaults are
    the worker's), then ``WORKER_*`` variables, then the command line, which wins. Results go
    through the Celery app's own backend (``result_backend`` is ``celery://SPEC``).
    """

    request_class: ClassVar[type[Any]] = CeleryRequest

    def __init__(self, celery: Celery, spec: str) -> None:
        settings, notes = translate(celery, spec)
        super().__init__(celery.main, config_source=settings)
        #: the Celery app itself
        self.celery = celery
        #: what ``-A`` named
        self.spec = spec
        #: one line per setting of the Celery app this worker does not honour as Celery does
        self.notes: list[str] = [*notes, *unsupported(celery)]
        own = settings["result_backend"]
        if self.settings.result_backend != own:  # WORKER_RESULT_BACKEND: Celery's backend stores anyway
            self.notes.append(
                f"result_backend={self.settings.result_backend!r} (from WORKER_RESULT_BACKEND) is not "
                f"used: the Celery app's own backend stores the results; set result_backend in its "
                f"configuration")
            self.conf.update(result_backend=own)
        #: one line per task option the worker takes otherwise than given (the task still runs)
        self.task_notes: list[str] = register_views(self, dict(celery.tasks))

    def worker_defaults(self, defaults: WorkerOptions) -> WorkerOptions:
        """The queues: every queue of ``task_queues`` (by name) when the app lists them, as
        ``celery worker`` consumes them without ``-Q``; else ``task_default_queue``."""
        queues = self.celery.conf.task_queues
        names = tuple(dict.fromkeys(queue.name for queue in queues or ()))
        return defaults.replace(queues=names) if names else defaults

    def configuration(self, with_defaults: bool) -> dict[str, Any]:
        """``inspect conf``: the Celery app's configuration, as ``celery worker`` lists it, with
        the worker's own settings (a :class:`~worker_core.slots.ListsConfiguration`)."""
        table = configuration(self.celery, self.settings, with_defaults)
        # what celery worker adds to the configuration as it starts: the modules it imported
        # (the app's, then Celery's built-in tasks) and its --disable-prefetch, off here
        module = self.spec.partition(":")[0]
        table.setdefault("include", list(dict.fromkeys([*(self.celery.conf.include or ()), module,
                                                        "celery.app.builtins"])))
        table.setdefault("worker_disable_prefetch", False)
        return table

    def __repr__(self) -> str:
        return f"<CeleryApp {self.spec}: {len(self.tasks)} tasks>"
