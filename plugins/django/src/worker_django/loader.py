"""The ``django`` app loader: ``-A`` naming a Django project, by its settings module
(``-A proj.settings``), by the package that holds it (``-A proj``), or as ``manage.py`` finds it
(``-A django``: ``DJANGO_SETTINGS_MODULE``, else the module ``./manage.py`` sets it to). A
``:alias`` after it chooses the ``TASKS`` entry when the project has several of this backend."""

from __future__ import annotations

import ast
import importlib
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from worker_core.exceptions import AppImportError, ConfigurationError

if TYPE_CHECKING:
    from .app import DjangoApp
    from .backend import WorkerBackend

__all__ = ["DjangoLoader", "backend_for", "manage_py_settings", "settings_module_of"]

logger = logging.getLogger("worker.django")

#: the projects loaded in this process, by the spec that named them
_loaded: dict[str, DjangoApp] = {}


def manage_py_settings(directory: Path) -> str | None:
    """The settings module ``manage.py`` in ``directory`` sets by default
    (``os.environ.setdefault("DJANGO_SETTINGS_MODULE", "...")``), read without running it."""
    path = directory / "manage.py"
    try:
        tree = ast.parse(path.read_text(), str(path))
    except (OSError, SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "setdefault" and len(node.args) == 2
                and all(isinstance(arg, ast.Constant) for arg in node.args)):
            name, value = (arg.value for arg in node.args)  # type: ignore[attr-defined]
            if name == "DJANGO_SETTINGS_MODULE" and isinstance(value, str):
                return value
    return None


def _is_settings(module_name: str) -> bool:
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            return False
        raise
    return hasattr(module, "INSTALLED_APPS")


def settings_module_of(spec: str) -> str | None:
    """The settings module ``spec`` names (see the module's docstring), or None."""
    from django.conf import settings

    if spec == "django":
        if settings.configured and getattr(settings, "SETTINGS_MODULE", None):
            return str(settings.SETTINGS_MODULE)
        return os.environ.get("DJANGO_SETTINGS_MODULE") or manage_py_settings(Path.cwd())
    try:
        if _is_settings(spec):
            return spec
        if _is_settings(f"{spec}.settings"):
            return f"{spec}.settings"
    except Exception as exc:
        raise AppImportError.of(f"the Django settings module {spec!r}", exc) from exc
    return None


def backend_for(alias: str | None) -> WorkerBackend:
    """The project's ``WorkerBackend``: the ``TASKS`` entry ``alias``, else ``default`` when it is
    one, else the only one."""
    from . import framework
    from .backend import WorkerBackend

    handler = framework.task_backends()
    entries = handler.settings
    ours = [name for name, entry in entries.items() if _is_ours(entry.get("BACKEND"), WorkerBackend)]
    if alias is not None:
        if alias not in entries:
            raise ConfigurationError(f"TASKS has no entry {alias!r}; its entries: "
                                     f"{', '.join(entries) or 'none'}")
        if alias not in ours:
            raise ConfigurationError(f"TASKS[{alias!r}] is {entries[alias].get('BACKEND')!r}, not "
                                     f"worker_django.WorkerBackend: nothing of it is sent to this worker")
        chosen = alias
    elif "default" in ours or len(ours) == 1:
        chosen = "default" if "default" in ours else ours[0]
    elif ours:
        raise ConfigurationError(f"TASKS has several entries of worker_django.WorkerBackend "
                                 f"({', '.join(ours)}): choose one with -A SETTINGS:ALIAS")
    else:
        raise ConfigurationError(
            "no TASKS entry of the Django settings has BACKEND 'worker_django.WorkerBackend': set "
            "TASKS = {'default': {'BACKEND': 'worker_django.WorkerBackend', 'OPTIONS': {'broker_url': ...}}}")
    backend: WorkerBackend = handler[chosen]
    return backend


def _is_ours(path: object, cls: type) -> bool:
    if not isinstance(path, str):
        return False
    from django.utils.module_loading import import_string

    try:
        found = import_string(path)
    except ImportError:
        return False
    return isinstance(found, type) and issubclass(found, cls)


class DjangoLoader:
    """Adapts the Django project a spec names (see :class:`worker_core.slots.AppLoader`)."""

    adapts: ClassVar[str] = "a Django project (its settings module)"

    @classmethod
    def load(cls, spec: str) -> DjangoApp | None:
        if spec in _loaded:
            return _loaded[spec]
        try:
            import django
            from django.conf import settings
        except ImportError:
            return None
        module_spec, _, alias = spec.partition(":")
        settings_module = settings_module_of(module_spec)
        if settings_module is None:
            return None
        configured = getattr(settings, "SETTINGS_MODULE", None) if settings.configured else None
        if configured and configured != settings_module:
            raise ConfigurationError(f"-A {spec}: Django is set up with the settings {configured!r} already, "
                                     f"not {settings_module!r}")
        os.environ["DJANGO_SETTINGS_MODULE"] = settings_module
        try:
            django.setup()
        except Exception as exc:
            raise AppImportError.of(f"the Django project of {settings_module!r} (django.setup())",
                                    exc) from exc
        from .app import DjangoApp
        from .checks import errors_and_warnings

        backend = backend_for(alias or None)
        errors, warnings = errors_and_warnings(backend)
        if errors:
            raise ConfigurationError(f"TASKS[{backend.alias!r}]: {errors[0]}")
        try:
            app = DjangoApp(backend, settings_module, notes=warnings)
        except ConfigurationError:
            raise
        except Exception as exc:
            raise AppImportError.of("a tasks module of the Django project's installed apps", exc) from exc
        _loaded[spec] = app
        return app
