"""Which Django tasks a worker runs: those of the ``tasks`` module of every installed app, found
at start, and any other module-level ``@task`` of an installed app's package, found the first time
a message names it (its module imported then). A name outside the installed apps is never
imported: a message cannot make the worker import what it likes."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from . import framework

__all__ = ["allowed", "app_packages", "autodiscover", "find", "tasks_in", "tasks_module"]

logger = logging.getLogger("worker.django")


def app_packages() -> list[str]:
    from django.apps import apps

    return [config.name for config in apps.get_app_configs()]


def allowed(module: str) -> bool:
    """Whether ``module`` may be imported to find a task: an installed app's package or one of
    its modules."""
    return any(module == package or module.startswith(package + ".") for package in app_packages())


def tasks_module(package: str) -> ModuleType | None:
    """``package.tasks``, imported, or None when the package has none (an error inside it is
    raised, not taken for its absence)."""
    name = f"{package}.tasks"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            return None
        raise


def tasks_in(module: ModuleType) -> Iterator[tuple[str, Any]]:
    """Each ``@task`` defined in ``module`` (not one it imported from elsewhere), by its path."""
    for value in vars(module).values():
        if isinstance(value, framework.Task) and value.func.__module__ == module.__name__:
            yield value.module_path, value


def autodiscover() -> dict[str, Any]:
    """Every ``@task`` of the installed apps' ``tasks`` modules, by path."""
    found: dict[str, Any] = {}
    for package in app_packages():
        module = tasks_module(package)
        if module is not None:
            found.update(tasks_in(module))
    return found


def find(path: str) -> Any | None:
    """The ``@task`` at ``path`` (``module.function``) when its module belongs to an installed
    app, else None."""
    module_name, _, attribute = path.rpartition(".")
    if not module_name or not allowed(module_name):
        return None
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        logger.warning("A message names the task %s, whose module cannot be imported: %s", path, exc)
        return None
    task = getattr(module, attribute, None)
    return task if isinstance(task, framework.Task) else None
