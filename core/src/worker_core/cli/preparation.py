"""From a command line to a checked plan, for ``workerctl worker`` and ``workerctl steps``:
the environment Celery's global options set, the app with its ``-I`` modules and the
settings ``--config`` and ``--result-backend`` give, the options and the plan."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Mapping
from typing import Any

import click

from ..app.loader import import_modules
from ..exceptions import AppImportError, ConfigurationError, WorkerError
from ..options import parse_queues
from ..plan import Plan, make_plan
from ..slots import ForeignApp
from .common import (
    PluginCommand,
    check_endpoints,
    fail,
    options_from_params,
    plugin_values,
    prepare_app,
    use_broker,
)
from .globals import apply_environment, restore_environment

__all__ = ["prepared", "report_failure"]


def report_failure(exc: WorkerError, params: Mapping[str, Any]) -> click.ClickException:
    """The one-line error for ``exc``; with ``-l DEBUG``, the traceback of its cause first."""
    cause = exc.__cause__
    if cause is not None and str(params.get("loglevel") or "").upper() == "DEBUG":
        traceback.print_exception(type(cause), cause, cause.__traceback__, file=sys.stderr)
    return fail(exc)


def _config_module(name: str) -> Any:
    import importlib

    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and name.startswith(exc.name):
            raise ConfigurationError(f"--config {name}: no such module on the Python path") from None
        raise AppImportError.of(f"the configuration module {name!r} (--config)", exc) from exc
    except Exception as exc:
        raise AppImportError.of(f"the configuration module {name!r} (--config)", exc) from exc


def _apply_app_options(app: Any, params: Mapping[str, Any]) -> None:
    foreign = isinstance(app, ForeignApp)  # a Celery app read the CELERY_* variables as it loaded
    if params.get("loader") and not foreign:
        raise ConfigurationError(
            f"--loader {params['loader']}: names a Celery loader class, which only a Celery app has; "
            f"this app ({type(app).__name__}) loads its settings itself: leave --loader out"
        )
    if params.get("config") and not foreign:
        app.config_from_object(_config_module(params["config"]))
    if params.get("brokers"):
        use_broker(app, ";".join(params["brokers"]))
    if params.get("result_backend") and not foreign:
        app.conf.update(result_backend=params["result_backend"])


def prepared(ctx: click.Context, params: Mapping[str, Any]) -> tuple[Any, Plan]:
    """The app (None without ``-A``) and the plan the command line gives; a ``WorkerError``
    is the command's one-line error (see :func:`report_failure`)."""
    manager = ctx.obj
    command = ctx.command
    assert isinstance(command, PluginCommand)
    app = None
    broker_urls: tuple[str, ...] = ()
    result_url = None
    defaults = None
    settings = None
    try:
        if params.get("app"):
            previous = apply_environment(params)  # what a Celery app reads as it loads, as celery sets it
            try:
                if params.get("include"):
                    import_modules(parse_queues(params["include"]))  # comma-separated, as -Q
                declared = {name.lower() for name in command.plugin_options}
                app, defaults = prepare_app(params["app"], declared, manager,
                                            configure=lambda loaded: _apply_app_options(loaded, params))
            finally:
                if not isinstance(app, ForeignApp):  # an app of this project read none of them
                    restore_environment(previous)
            app.use_plugins(manager)  # one set of hooks: the installed plugins' and the app's
            broker_urls, result_url, settings = app.broker_urls, app.settings.result_backend, app.settings
        values = plugin_values(command, params, manager, settings)
        options = options_from_params(params, manager, plugin_values=values, defaults=defaults)
        plan = make_plan(options, manager, broker_urls=broker_urls, result_url=result_url)
        if app is not None:
            check_endpoints(manager, app.settings, plan.selection)
    except WorkerError as exc:
        raise report_failure(exc, params) from None
    return app, plan
