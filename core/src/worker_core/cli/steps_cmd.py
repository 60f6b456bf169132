"""``workerctl steps``: the resolved bootstep order, or the graph as DOT, Mermaid, text or JSON."""

from __future__ import annotations

from typing import Any

import click

from ..bootsteps import FORMATS, render
from ..exceptions import WorkerError
from ..plan import make_plan
from .common import (
    PluginCommand,
    check_endpoints,
    fail,
    options_from_params,
    plugin_values,
    prepare_app,
    warn_failures,
    with_worker_options,
)

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
    command = ctx.command
    assert isinstance(command, PluginCommand)
    try:
        broker_urls: tuple[str, ...] = ()
        result_url = None
        defaults = None
        settings = None
        if params.get("app"):
            app, defaults = prepare_app(
                params["app"], {name.lower() for name in command.plugin_options}, manager)
            app.use_plugins(manager)  # one set of hooks: the installed plugins' and the app's
            broker_urls, result_url, settings = app.broker_urls, app.settings.result_backend, app.settings
        values = plugin_values(command, params, manager, settings)
        options = options_from_params(params, manager, plugin_values=values, defaults=defaults)
        plan = make_plan(options, manager, broker_urls=broker_urls, result_url=result_url)
        if params.get("app"):
            check_endpoints(manager, app.settings, plan.selection)
    except WorkerError as exc:
        raise fail(exc) from None
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
