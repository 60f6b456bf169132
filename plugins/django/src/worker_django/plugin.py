"""The ``django`` plugin: while the worker runs a Django project's tasks, its main process says so
and holds no database connection when the pool forks, and each executor (a prefork child, a pool
thread, the solo pool) drops what it inherited and closes its connections as it ends (for other
apps every hook returns at once, without importing Django)."""

from __future__ import annotations

import logging
import os
import sys
from types import ModuleType
from typing import TYPE_CHECKING

from worker_core.hookspecs import hookimpl

if TYPE_CHECKING:
    from worker_core import Worker

__all__: list[str] = []

logger = logging.getLogger("worker.django")


def _execution() -> ModuleType | None:
    """The executor's module, in a process that runs a Django project's tasks."""
    module = sys.modules.get(f"{__package__}.execution")
    return module if module is not None and module.installed() is not None else None


@hookimpl
def worker_init(worker: Worker) -> None:
    if f"{__package__}.app" not in sys.modules:
        return
    from . import connections, execution
    from .app import DjangoApp

    app = worker.app
    if not isinstance(app, DjangoApp):
        return
    execution.install(app, worker.hostname)
    logger.info("Django project %s: TASKS[%r], %d tasks found in the installed apps", app.settings_module,
                app.backend_of_tasks.alias, len(app.tasks))
    for line in app.notes:
        logger.warning("Django tasks: %s", line)
    connections.close_all()  # nothing the pool's children could inherit and share


@hookimpl
def worker_process_init(pid: int) -> None:
    execution = _execution()
    if execution is None:
        return
    from . import connections

    if execution.is_pool_process():
        connections.forget_inherited()


@hookimpl
def worker_process_shutdown(pid: int, exitcode: int) -> None:
    if _execution() is None:
        return
    from . import connections

    connections.close_all()


@hookimpl
def worker_stopped(worker: Worker, how: str) -> None:
    if _execution() is None or os.getpid() != worker.pid:
        return
    from . import connections

    connections.close_all()
