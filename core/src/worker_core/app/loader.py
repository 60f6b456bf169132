"""Finding the app a user names with ``-A module`` or ``-A module:attribute``: this project's
:class:`App`, else one an app loader plugin adapts (see :class:`~worker_core.slots.AppLoader`)."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from ..exceptions import AppImportError, ConfigurationError
from ..plugins.entrypoints import KNOWN_DISTRIBUTIONS, install_hint
from ..plugins.manager import PluginManager
from .base import App

if TYPE_CHECKING:
    from ..plugins.manager import PluginManager

__all__ = ["FOREIGN_APPS", "import_modules", "load_app"]

#: Apps of other frameworks a loader plugin can adapt, by the module and name of their class:
#: the loader's entry-point name and what it is called, to name the distribution to install
#: when no loader took the app (the classes are recognised without importing the framework).
FOREIGN_APPS: Mapping[tuple[str, str], tuple[str, str]] = {
    ("celery.app.base", "Celery"): ("celery", "a Celery app"),
}


def load_app(spec: str, plugins: PluginManager | None = None) -> App:
    """Import ``module`` (with the current directory on the path) and return its app.

    Without ``:attribute`` the module's ``app`` is used, or its only :class:`App`. When the spec
    names no :class:`App`, each installed app loader (``plugins``' ``app_loader`` slot) is asked
    for one it adapts.
    """
    module_name, _, attribute = spec.partition(":")
    module = _import(spec)
    if attribute:
        app = getattr(module, attribute, None)
        if isinstance(app, App):
            return app
        return _foreign(spec, plugins, [app], lambda: (
            f"{module_name}:{attribute} is not an App (got {type(app).__name__}); "
            + (f"apps in {module_name}: {', '.join(found)}" if (found := _apps_in(module))
               else f"{module_name} defines no App")
        ))
    default = getattr(module, "app", None)
    if isinstance(default, App):
        return default
    found = _apps_in(module)
    if len(found) == 1:
        return getattr(module, found[0])  # type: ignore[no-any-return]
    if found:
        raise ConfigurationError(
            f"module {module_name!r} defines several apps ({', '.join(found)}); choose one with "
            f"-A {module_name}:NAME"
        )
    return _foreign(spec, plugins, list(vars(module).values()), lambda: (
        f"module {module_name!r} defines no App; create one there, e.g. app = App({module_name!r})"
    ))


def _import(spec: str) -> object:
    module_name = spec.partition(":")[0]
    if not module_name:
        raise ConfigurationError(f"-A needs a module name, as module or module:attribute (got {spec!r})")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise ConfigurationError(
                f"cannot import the app module {module_name!r}: no such module in {os.getcwd()} or on "
                f"the Python path; run from the directory that holds it or give its dotted path"
            ) from None
        raise AppImportError.of(f"the app module {module_name!r}", exc) from exc
    except Exception as exc:
        raise AppImportError.of(f"the app module {module_name!r}", exc) from exc


def import_modules(names: Sequence[str]) -> None:
    """Import the modules ``-I``/``--include`` names (their tasks register with the app), with
    the current directory on the path."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    for name in names:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and name.startswith(exc.name):
                raise ConfigurationError(
                    f"--include {name}: no such module in {os.getcwd()} or on the Python path"
                ) from None
            raise AppImportError.of(f"the module {name!r} (--include)", exc) from exc
        except Exception as exc:
            raise AppImportError.of(f"the module {name!r} (--include)", exc) from exc


def _foreign(spec: str, plugins: PluginManager | None, values: list[object],
             no_app: Callable[[], str]) -> App:
    """The app an installed app loader makes of ``spec``, else the error: ``no_app()``, or which
    distribution to install when one of ``values`` is a known framework's app."""
    manager = plugins if plugins is not None else PluginManager(autoload=False)
    for name in manager.names("app_loader"):
        app = manager.slot("app_loader", name).load(spec)
        if app is not None:
            return app
    for value in values:
        for cls in type(value).__mro__:
            known = FOREIGN_APPS.get((cls.__module__, cls.__qualname__))
            if known is None:
                continue
            loader, what = known
            if loader in manager.blocked:
                fix = f"its app loader {loader!r} is blocked by {manager.blocked_by(loader)}: remove that"
            else:
                distribution = KNOWN_DISTRIBUTIONS.get(("app_loader", loader), f"a {loader} app loader")
                fix = f"to run it with this worker, install its app loader: {install_hint(distribution)}"
            raise ConfigurationError(f"-A {spec} names {what} ({cls.__module__}.{cls.__qualname__}); {fix}")
    raise ConfigurationError(no_app())


def _apps_in(module: object) -> list[str]:
    return sorted(name for name, value in vars(module).items() if isinstance(value, App))

