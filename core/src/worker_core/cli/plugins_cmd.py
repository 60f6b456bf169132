"""``workerctl plugins``: every discovered plugin with its distribution, kind, hooks and status."""

from __future__ import annotations

import json

import click

from .common import PluginCommand

__all__ = ["plugins"]


class _PluginsCommand(PluginCommand):
    takes_plugin_options = False


@click.command(cls=_PluginsCommand)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("-p", "--plugin", "plugin_switches", multiple=True, metavar="no:NAME",
              help="Block a plugin by name.")
@click.pass_context
def plugins(ctx: click.Context, as_json: bool, plugin_switches: tuple[str, ...]) -> None:
    """List every plugin found through entry points and whether it loads.

    Every slot implementation is imported to check it, so a broken one shows as failed with the
    reason. Status is one of: loaded, available, blocked, failed, conflict.
    """
    manager = ctx.obj
    manager.load_all_slots()
    statuses = manager.statuses()
    if as_json:
        click.echo(json.dumps([status.as_dict() for status in statuses], indent=2))
        return
    rows = [("NAME", "KIND", "DISTRIBUTION", "VERSION", "STATUS", "HOOKS / REASON")]
    for status in statuses:
        detail = ", ".join(status.hooks) if status.status == "loaded" else (status.reason or "")
        if status.status == "loaded" and status.entry.kind != "hooks":
            detail = status.entry.value
        rows.append(
            (
                status.entry.name,
                status.entry.kind,
                status.entry.distribution or "?",
                status.entry.version or "?",
                status.status,
                detail,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    for row in rows:
        cells = zip(row, widths, strict=False)  # the last column, row[5], is not padded
        click.echo("  ".join(cell.ljust(width) for cell, width in cells) + "  " + row[5])
