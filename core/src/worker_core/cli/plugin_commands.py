"""The ``workerctl`` commands plugins contribute (the ``workerctl_commands`` hook)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

import click

from ..exceptions import PluginConflictError, PluginError, WorkerError
from ..plugins.manager import PluginManager
from .common import blocked_from_args, fail

__all__ = ["plugin_commands"]


def plugin_commands(args: Sequence[str], taken: Collection[str]) -> dict[str, click.Command]:
    """The commands the installed plugins contribute, by name, with the plugins blocked by
    ``args`` (``-p no:NAME``) or ``WORKER_DISABLE_PLUGINS`` left out; ``taken`` names the built-in
    commands. A name taken twice, or anything but a click command, is an error."""
    try:
        manager = PluginManager(blocked_from_args(args))
        found: dict[str, click.Command] = {}
        owners: dict[str, object] = {}  # (shown only in errors: a provider names its distribution lazily)
        for contributed, provider in manager.collect("workerctl_commands"):
            for name, command in (contributed or {}).items():
                if name in taken or name in found:
                    owner = f"plugin {owners[name]}" if name in owners else "worker-core"
                    raise PluginConflictError(f"the workerctl command {name!r} is provided by {owner} and by "
                                              f"plugin {provider}; rename one of them")
                if not isinstance(command, click.Command):
                    raise PluginError(f"plugin {provider} returned {command!r} for the workerctl command "
                                      f"{name!r}; it must be a click.Command")
                found[name] = command
                owners[name] = provider
    except WorkerError as exc:
        raise fail(exc) from None
    return found
