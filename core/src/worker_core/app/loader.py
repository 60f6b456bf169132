"""Finding the app a user names with ``-A module`` or ``-A module:attribute``."""

from __future__ import annotations

import importlib
import os
import sys
import traceback

from ..exceptions import ConfigurationError
from .base import App

__all__ = ["load_app"]


def load_app(spec: str) -> App:
    """Import ``module`` (with the current directory on the path) and return its app.

    Without ``:attribute`` the module's ``app`` is used, or its only :class:`App`.
    """
    module_name, _, attribute = spec.partition(":")
    if not module_name:
        raise ConfigurationError(f"-A needs a module name, as module or module:attribute (got {spec!r})")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise ConfigurationError(
                f"cannot import the app module {module_name!r}: no such module in {os.getcwd()} or on "
                f"the Python path; run from the directory that holds it or give its dotted path"
            ) from None
        raise ConfigurationError(
            f"the app module {module_name!r} failed to import: {_last_line(exc)}"
        ) from None
    except Exception as exc:
        raise ConfigurationError(
            f"the app module {module_name!r} failed to import: {_last_line(exc)}"
        ) from None
    if attribute:
        app = getattr(module, attribute, None)
        if not isinstance(app, App):
            found = _apps_in(module)
            raise ConfigurationError(
                f"{module_name}:{attribute} is not an App (got {type(app).__name__}); "
                + (f"apps in {module_name}: {', '.join(found)}" if found else f"{module_name} defines no App")
            )
        return app
    default = getattr(module, "app", None)
    if isinstance(default, App):
        return default
    found = _apps_in(module)
    if len(found) == 1:
        return getattr(module, found[0])  # type: ignore[no-any-return]
    if not found:
        raise ConfigurationError(
            f"module {module_name!r} defines no App; create one there, e.g. app = App({module_name!r})"
        )
    raise ConfigurationError(
        f"module {module_name!r} defines several apps ({', '.join(found)}); choose one with "
        f"-A {module_name}:NAME"
    )


def _apps_in(module: object) -> list[str]:
    return sorted(name for name, value in vars(module).items() if isinstance(value, App))


def _last_line(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"
