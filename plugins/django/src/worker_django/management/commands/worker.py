"""``manage.py worker [workerctl worker's options]``: the worker of ``workerctl worker -A
<this project's settings>``, started in this process (which it replaces) with this project's
settings and path."""

from __future__ import annotations

import os
import sys
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

#: manage.py's own options, applied by manage.py before the command runs
_MANAGE_OPTIONS = ("--settings", "--pythonpath")


def worker_argv(argv: list[str], settings_module: str) -> list[str]:
    """``workerctl worker``'s arguments for ``manage.py worker ARGS``: ARGS, less manage.py's own
    options, with ``-A`` naming the settings (unless ARGS give one)."""
    rest: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in _MANAGE_OPTIONS:
            skip = True
            continue
        if arg.startswith(tuple(option + "=" for option in _MANAGE_OPTIONS)):
            continue
        rest.append(arg)
    named = any(arg in ("-A", "--app") or arg.startswith(("-A", "--app=")) for arg in rest)
    return ["worker", *rest] if named else ["worker", "-A", settings_module, *rest]


class Command(BaseCommand):  # type: ignore[misc]
    help = ("Start this project's worker (the options of workerctl worker: -P prefork -c 8 -Q default, ...; "
            "manage.py worker --help lists them)")

    def run_from_argv(self, argv: list[str]) -> None:
        args = worker_argv(argv[2:], settings.SETTINGS_MODULE)
        env = dict(os.environ, DJANGO_SETTINGS_MODULE=settings.SETTINGS_MODULE)
        # the project's directory (manage.py's) on the path, wherever the command was run from
        paths = [path for path in sys.path[:1] if path] + [os.getcwd()]
        env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [os.environ.get("PYTHONPATH")])])
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, [sys.executable, "-m", "worker_core", *args], env)

    def handle(self, *args: Any, **options: Any) -> None:  # run_from_argv never returns
        raise NotImplementedError("manage.py worker runs from the command line")
