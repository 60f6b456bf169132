"""Resolving contributed steps into a checked, deterministic start order."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from ..exceptions import StepConflictError, StepCycleError, StepMissingError
from ..options import did_you_mean
from .step import Step

if TYPE_CHECKING:
    from ..options import WorkerOptions

__all__ = ["Edge", "Provider", "StepGraph", "resolve"]


@attrs.frozen
class Provider:
    """The plugin (and its distribution) that contributed a step.

    A plugin found through its entry point names its distribution through ``lookup``, asked only
    when the distribution is shown: finding it reads every installed distribution's metadata,
    which a worker's start does without.
    """

    plugin: str
    _distribution: str | None = None
    _version: str | None = None
    _lookup: Callable[[], tuple[str, str] | None] | None = attrs.field(
        default=None, eq=False, repr=False
    )

    @property
    def distribution(self) -> str | None:
        return self._found()[0]

    @property
    def version(self) -> str | None:
        return self._found()[1]

    def _found(self) -> tuple[str | None, str | None]:
        if self._lookup is None:
            return self._distribution, self._version
        return self._lookup() or (None, None)

    def __str__(self) -> str:
        if self.distribution is None:
            return self.plugin
        version = f" {self.version}" if self.version else ""
        return f"{self.plugin} ({self.distribution}{version})"


@attrs.frozen
class Edge:
    """``source`` starts after ``target``; ``kind`` is ``requires``, ``after`` or ``last``."""

    source: str
    target: str
    kind: str


@attrs.frozen
class StepGraph:
    """A resolved blueprint: the enabled steps in start order, and why the others are left out."""

    blueprint: str
    order: tuple[Step[Any], ...]
    disabled: tuple[tuple[Step[Any], str], ...]
    edges: tuple[Edge, ...]
    providers: Mapping[str, Provider]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(step.name for step in self.order)

    def provider(self, step: Step[Any]) -> Provider | None:
        return self.providers.get(step.name)

    def __iter__(self) -> Any:
        return iter(self.order)


def _who(name: str, providers: Mapping[str, Provider]) -> str:
    provider = providers.get(name)
    return f"step {name!r} from plugin {provider}" if provider else f"step {name!r}"


def resolve(
    blueprint: str,
    steps: Sequence[Step[Any]],
    options: WorkerOptions,
    providers: Sequence[Provider | None] | None = None,
) -> StepGraph:
    """Check the steps of one blueprint and order them.

    The order is a topological sort of ``requires``/``after`` edges (plus the ``last`` step after
    everything); among steps that are ready at the same time the one contributed first goes first,
    so the same plugins and options always give the same order.

    :raise StepConflictError: two steps share a name, or more than one is ``last``.
    :raise StepMissingError: a step requires a name no step has.
    :raise StepCycleError: the requirements form a cycle (the message shows its path).
    """
    given = list(providers) if providers is not None else [None] * len(steps)
    if len(given) != len(steps):
        raise ValueError("providers must have one entry per step")
    index: dict[str, int] = {}
    for position, step in enumerate(steps):
        if step.name in index:
            first = index[step.name]
            raise StepConflictError(
                f"two steps are named {step.name!r} in the {blueprint} blueprint, one from "
                f"{given[first] or 'an unnamed plugin'} and one from "
                f"{given[position] or 'an unnamed plugin'}; a step name must be unique, so "
                f"rename one of them or block one plugin with -p no:NAME"
            )
        index[step.name] = position
    providers_by_name = {step.name: p for step, p in zip(steps, given, strict=True) if p is not None}

    lasts = [step.name for step in steps if step.last]
    if len(lasts) > 1:
        raise StepConflictError(
            f"the {blueprint} blueprint has more than one last step: "
            + ", ".join(_who(name, providers_by_name) for name in lasts)
            + "; only one step may be last"
        )

    # Edges point from a step to the steps that must start before it.
    before: list[list[int]] = [[] for _ in steps]
    edges: list[Edge] = []
    for position, step in enumerate(steps):
        for required in step.requires:
            target = index.get(required)
            if target is None:
                raise StepMissingError(
                    f"{_who(step.name, providers_by_name)} requires {required!r}, which no plugin provides "
                    f"in the {blueprint} blueprint.{did_you_mean(required, index)} "
                    f"Install the plugin that provides it or remove the requirement."
                )
            before[position].append(target)
            edges.append(Edge(step.name, required, "requires"))
        for wanted in step.after:
            target = index.get(wanted)
            if target is not None:
                before[position].append(target)
                edges.append(Edge(step.name, wanted, "after"))
    if lasts:
        last = index[lasts[0]]
        for step in steps:
            if lasts[0] in step.requires or lasts[0] in step.after:
                raise StepCycleError(
                    f"{_who(step.name, providers_by_name)} wants to start after {lasts[0]!r}, but "
                    f"{lasts[0]!r} is the last step of the {blueprint} blueprint and starts after "
                    f"every other step. Remove that requirement."
                )
        for position in range(len(steps)):
            if position != last and last not in before[position]:
                before[last].append(position)
                edges.append(Edge(lasts[0], steps[position].name, "last"))

    order = _toposort(blueprint, steps, before, providers_by_name)

    # Disable steps whose condition fails, then everything that requires a disabled step.
    disabled: dict[int, str] = {}
    for position in order:
        step = steps[position]
        if not step.include_if(options):
            assert step.condition is not None
            disabled[position] = f"only when {step.condition.description}"
            continue
        for required in step.requires:
            if index[required] in disabled:
                disabled[position] = f"requires {required!r}, which is disabled"
                break

    return StepGraph(
        blueprint=blueprint,
        order=tuple(steps[p] for p in order if p not in disabled),
        disabled=tuple((steps[p], reason) for p, reason in disabled.items()),
        edges=tuple(edges),
        providers=providers_by_name,
    )


def _toposort(
    blueprint: str,
    steps: Sequence[Step[Any]],
    before: list[list[int]],
    providers: Mapping[str, Provider],
) -> list[int]:
    """Kahn's algorithm, taking the earliest-contributed ready step first."""
    count = len(steps)
    waiting = [len(set(deps)) for deps in before]
    unlocks: list[list[int]] = [[] for _ in range(count)]
    for position, deps in enumerate(before):
        for dep in set(deps):
            unlocks[dep].append(position)
    ready = [position for position in range(count) if waiting[position] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        position = heapq.heappop(ready)
        order.append(position)
        for follower in unlocks[position]:
            waiting[follower] -= 1
            if waiting[follower] == 0:
                heapq.heappush(ready, follower)
    if len(order) < count:
        cycle = _find_cycle(before, {p for p in range(count) if waiting[p] > 0})
        path = " -> ".join(steps[p].name for p in cycle)
        raise StepCycleError(
            f"the steps of the {blueprint} blueprint require each other in a cycle: {path} "
            f"(each step requires the next; {_who(steps[cycle[0]].name, providers)}). "
            f"Remove one of these requirements."
        )
    return order


def _find_cycle(before: list[list[int]], stuck: set[int]) -> list[int]:
    """Return a cycle among the stuck steps as a path whose first and last element are equal."""
    # Every stuck step waits on at least one stuck step, so following those edges must revisit.
    start = min(stuck)
    seen: dict[int, int] = {}
    path: list[int] = []
    node = start
    while node not in seen:
        seen[node] = len(path)
        path.append(node)
        node = min(dep for dep in before[node] if dep in stuck)
    return [*path[seen[node]:], node]
