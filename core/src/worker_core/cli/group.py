"""The ``workerctl`` command group; each command's module is imported only when it runs."""

from __future__ import annotations

import importlib
from typing import Any

import click

from .globals import defaults_for, global_options
from .plugin_commands import plugin_commands

__all__ = ["main"]

COMMANDS = {
    "worker": ("worker_cmd", "worker"),
    "call": ("call_cmd", "call"),
    "inspect": ("control_cmd", "inspect"),
    "control": ("control_cmd", "control"),
    "steps": ("steps_cmd", "steps"),
    "plugins": ("plugins_cmd", "plugins"),
    "dead-letters": ("deadletters_cmd", "dead_letters"),
    "multi": ("multi", "multi"),
    "health": ("health_cmd", "health"),
}


class _Commands(click.Group):
    """Loads a command's module on first use, so ``workerctl worker`` starts without the others;
    a name that is not built in is looked for among the commands plugins contribute."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*COMMANDS, *sorted(plugin_commands(ctx.args, COMMANDS))]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        found = COMMANDS.get(name)
        if found is None:
            return plugin_commands(ctx.args, COMMANDS).get(name)
        module = importlib.import_module(f"{__package__}.{found[0]}")
        command: Any = getattr(module, found[1])
        return command  # type: ignore[no-any-return]


def _with_global_options(func: Any) -> Any:
    for option in reversed(global_options(group=True)):
        func = option(func)
    return func


@click.group(
    cls=_Commands, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100}
)
@click.version_option(package_name="worker-core", prog_name="workerctl")
@_with_global_options
@click.pass_context
def main(ctx: click.Context, /, **values: Any) -> None:
    """Run and inspect a task-queue worker built from plugins.

    It speaks Celery's message protocol v2: Celery clients can send it tasks and read results.
    Celery's global options (-A, -b, --result-backend, --loader, --config, --workdir, -C, -q,
    --skip-checks) may come before the command, as with celery: workerctl -A proj worker -l INFO.
    """
    name = ctx.invoked_subcommand
    command = ctx.command.get_command(ctx, name) if isinstance(ctx.command, click.Group) and name else None
    if command is not None and name:
        ctx.default_map = {name: defaults_for(command, values)}
