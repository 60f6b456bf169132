"""From options to a checked plan: validated options, chosen implementations, resolved graphs.

Both ``workerctl worker`` and ``workerctl steps`` go through :func:`make_plan`, so the graph a
user inspects is the graph the worker runs.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from .bootsteps import StepGraph, resolve
from .options import WorkerOptions
from .plugins.manager import PluginManager
from .selection import Selection, select

__all__ = ["BLUEPRINTS", "Plan", "make_plan"]

BLUEPRINTS = ("worker", "consumer")


@attrs.frozen
class Plan:
    """Everything decided before the worker starts."""

    selection: Selection
    graphs: tuple[StepGraph, ...]

    @property
    def options(self) -> WorkerOptions:
        return self.selection.options

    def graph(self, blueprint: str) -> StepGraph:
        for graph in self.graphs:
            if graph.blueprint == blueprint:
                return graph
        raise KeyError(blueprint)

    def implementations(self) -> Mapping[str, str]:
        """``{"pool": "threads (worker-pool-threads 0.1.0)", ...}`` for display."""
        shown = {}
        for kind, entry in self.selection.slots().items():
            where = f" ({entry.distribution} {entry.version})" if entry.distribution else ""
            shown[kind] = f"{entry.name}{where}"
        return shown


def make_plan(
    options: WorkerOptions,
    manager: PluginManager,
    *,
    broker_urls: tuple[str, ...] = (),
    result_url: str | None = None,
) -> Plan:
    """Validate options (core and plugins), choose implementations and resolve both blueprints."""
    selection = select(options, manager, broker_urls=broker_urls, result_url=result_url)
    for _ in manager.collect("worker_validate_options", options=selection.options):
        pass
    graphs = []
    for blueprint in BLUEPRINTS:
        steps, providers = manager.bootsteps(blueprint)
        graphs.append(resolve(blueprint, steps, selection.options, providers))
    return Plan(selection=selection, graphs=tuple(graphs))
