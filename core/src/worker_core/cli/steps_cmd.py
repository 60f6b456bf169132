"""``workerctl steps``: the resolved bootstep order, or the graph as DOT, Mermaid, text or JSON."""

from __future__ import annotations

from typing import Any

import click

from ..bootsteps import FORMATS, render
from .common import PluginCommand, warn_failures, with_worker_options
from .preparation import prepared

__all__ = ["steps"]


@click.command(cls=PluginCommand)
@with_worker_options
@click.option("--graph", "as_graph", is_flag=True,
              help="Print the graph (Graphviz DOT unless --format says otherwise).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), help="dot, mermaid, text or json.")
@click.option("--all", "show_all", is_flag=True, help="Also show the steps these options leave out, and why.")
@click.pass_context
def steps(ctx: click.Context, /, as_graph: bool, fmt: str | None, show_all: bool, **params: Any) -> None:
    """Show the bootsteps the worker would start for these options.

    Without --graph: the start order with the plugin and distribution of every step. With
    --graph: the dependency graph; `workerctl steps --graph | dot -Tpng -o steps.png` draws it.
    """
    manager = ctx.obj
    _, plan = prepared(ctx, params)
    warn_failures(manager)
    chosen = fmt or ("dot" if as_graph else "text")
    click.echo(
        render(
            plan.graphs,
            plan.options,
            chosen,
            show_disabled=show_all,
            implementations=plan.implementations(),
        ),
        nl=False,
    )
