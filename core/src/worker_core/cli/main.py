"""The ``workerctl`` command group."""

from __future__ import annotations

import click

from .call_cmd import call
from .control_cmd import control, inspect
from .plugins_cmd import plugins
from .steps_cmd import steps
from .worker_cmd import worker

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="worker-core", prog_name="workerctl")
def main() -> None:
    """Run and inspect a task-queue worker built from plugins.

    It speaks Celery's message protocol v2: Celery clients can send it tasks and read results.
    """


main.add_command(worker)
main.add_command(call)
main.add_command(inspect)
main.add_command(control)
main.add_command(steps)
main.add_command(plugins)
