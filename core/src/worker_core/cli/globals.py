"""Celery's global options (``celery -A proj -b URL worker``): accepted before the command, as
Celery takes them, and by ``workerctl worker`` after it too.

Given before the command, each becomes the default of the command's option of the same long
name (the command line after the command wins); a command without such an option ignores it,
as Celery's commands ignore the global options they do not use. Like Celery, ``-b``,
``--result-backend``, ``--loader``, ``--config`` and ``--skip-checks`` also set the variables a
Celery app reads (``CELERY_BROKER_URL``, ...) while ``workerctl worker`` loads its app, kept
only when it is a Celery app; ``--workdir`` changes the directory before anything is imported.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import click

__all__ = ["CELERY_VARIABLES", "GLOBAL_LONG_FLAGS", "apply_environment", "defaults_for", "global_options",
           "restore_environment"]

F = TypeVar("F", bound=Callable[..., Any])

#: the variable a Celery app reads for each option, set as ``celery`` sets it
CELERY_VARIABLES: Mapping[str, str] = {
    "brokers": "CELERY_BROKER_URL",
    "result_backend": "CELERY_RESULT_BACKEND",
    "loader": "CELERY_LOADER",
    "config": "CELERY_CONFIG_MODULE",
    "skip_checks": "CELERY_SKIP_CHECKS",
}

#: the long flag of every global option, by the name of its value
GLOBAL_LONG_FLAGS: Mapping[str, str] = {
    "app": "--app", "brokers": "--broker", "result_backend": "--result-backend", "loader": "--loader",
    "config": "--config", "workdir": "--workdir", "no_color": "--no-color", "quiet": "--quiet",
    "skip_checks": "--skip-checks",
}


def _chdir(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value:
        try:
            os.chdir(value)
        except OSError as exc:
            raise click.BadParameter(f"cannot change to {value!r}: {exc.strerror}", ctx=ctx,
                                     param=param) from None
        return os.getcwd()
    return value


def global_options(*, group: bool = False) -> list[Callable[[F], F]]:
    """The options: those ``workerctl worker`` and ``workerctl steps`` already have (``-A``,
    ``-b``) only when ``group`` is true, for the command group."""
    options: list[Callable[[F], F]] = []
    if group:
        options += [
            click.option("-A", "--app", help="Tasks module: module or module:attribute (for the command)."),
            click.option("-b", "--broker", "brokers", multiple=True,
                         help="Broker URL; repeat or separate with ';' for failover."),
        ]
    options += [
        click.option("--result-backend", help="Result backend URL (Celery's result_backend)."),
        click.option("--loader", help="A Celery app's loader class (CELERY_LOADER); a Celery app only."),
        click.option("--config", help="Module whose settings the app reads (config_from_object)."),
        click.option("--workdir", callback=_chdir, is_eager=True,
                     help="Change to this directory before the app is imported."),
        click.option("-C", "--no-color", is_flag=True, default=None,
                     help="No colours (this program prints none)."),
        click.option("-q", "--quiet", is_flag=True, default=None, help="No start-up banner."),
        click.option("--skip-checks", is_flag=True, default=None,
                     help="Skip Django's checks when a Celery app sets Django up."),
    ]
    return options


def apply_environment(values: Mapping[str, Any]) -> dict[str, str | None]:
    """Set the variables a Celery app reads for the options given, as ``celery`` sets them;
    returns what they were (see :func:`restore_environment`)."""
    previous: dict[str, str | None] = {}
    for name, variable in CELERY_VARIABLES.items():
        value = values.get(name)
        if not value:
            continue
        if name == "brokers":
            value = ";".join(value)
        elif name == "skip_checks":
            value = "true"
        previous[variable] = os.environ.get(variable)
        os.environ[variable] = str(value)
    return previous


def restore_environment(previous: Mapping[str, str | None]) -> None:
    """Put back the variables :func:`apply_environment` set (an app of this project reads none
    of them: they would only reach what this process runs next)."""
    for variable, value in previous.items():
        if value is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = value


def defaults_for(command: click.Command, values: Mapping[str, Any]) -> dict[str, Any]:
    """The defaults ``values`` (the group's options) give ``command``: one per option of the
    command with the same long flag (``default_map`` style, nested for a command group)."""
    if isinstance(command, click.Group):
        return {name: defaults_for(sub, values) for name, sub in command.commands.items()}
    defaults: dict[str, Any] = {}
    for param in command.params:
        if not isinstance(param, click.Option) or param.name is None:
            continue
        for name, flag in GLOBAL_LONG_FLAGS.items():
            value = values.get(name)
            if value in (None, False, ()) or flag not in param.opts:
                continue
            if param.multiple and not isinstance(value, (list, tuple)):
                value = [value]
            elif not param.multiple and isinstance(value, (list, tuple)):
                value = ";".join(value)
            defaults[param.name] = value
    return defaults
