"""What a bootstep is: a named unit of start-up with requirements, an optional condition, and
start/stop/terminate behaviour."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import attrs

from ..exceptions import StepError

if TYPE_CHECKING:
    from ..options import WorkerOptions

__all__ = ["Condition", "ParentT", "Step"]

ParentT = TypeVar("ParentT")


@attrs.frozen
class Condition:
    """When a conditional step takes part, with a description for ``workerctl steps``.

    ``Condition("--autoscale is given", lambda options: options.autoscale is not None)``
    """

    description: str
    predicate: Callable[[WorkerOptions], bool] = attrs.field(eq=False, repr=False)

    def __call__(self, options: WorkerOptions) -> bool:
        return bool(self.predicate(options))


def _names(value: Iterable[str] | None, what: str, step: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        raise StepError(f"step {step!r}: {what} must be a sequence of step names, not the string {value!r}")
    names = tuple(value)
    for name in names:
        if not isinstance(name, str) or not name:
            raise StepError(f"step {step!r}: {what} must hold step names (got {name!r})")
    return names


class Step(Generic[ParentT]):
    """One unit of the worker's start-up.

    Declare a step as a subclass with class attributes, or build a simple one directly::

        class Metrics(Step[Worker]):
            name = "Metrics"
            requires = ("Pool",)
            def start(self, worker): ...

        Step("Synthetic", requires=("Pool",))

    :cvar name: unique in its blueprint; other steps refer to it by this name.
    :cvar requires: names of steps that must exist and start before this one. If a required step
        is disabled by its condition, this step is disabled too.
    :cvar after: names of steps that start before this one *if they are present*.
    :cvar last: this step starts after every other one (at most one per blueprint).
    :cvar condition: when given, the step takes part only if it holds for the options.
    :cvar label: a short description for ``workerctl steps``.
    :cvar slot: the slot whose chosen implementation this step runs (``"pool"``,
        ``"transport"``, ...), so ``workerctl steps`` can show which plugin provides it.
    """

    name: str = ""
    requires: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    last: bool = False
    condition: Condition | None = None
    label: str = ""
    slot: str | None = None

    def __init__(
        self,
        name: str | None = None,
        *,
        requires: Iterable[str] | None = None,
        after: Iterable[str] | None = None,
        last: bool | None = None,
        condition: Condition | None = None,
        label: str | None = None,
    ) -> None:
        # Instance attributes shadow the class-level declarations, so both styles read the same.
        step_name = type(self).name if name is None else name
        if not isinstance(step_name, str) or not step_name.strip():
            raise StepError(
                f"a step needs a non-empty name (got {step_name!r} from {type(self).__qualname__})"
            )
        self.name = step_name
        self.requires = _names(type(self).requires if requires is None else requires, "requires", step_name)
        self.after = _names(type(self).after if after is None else after, "after", step_name)
        self.last = bool(type(self).last if last is None else last)
        self.condition = type(self).condition if condition is None else condition
        self.label = type(self).label if label is None else label

    @property
    def conditional(self) -> bool:
        """Whether the step takes part only under a condition on the options."""
        return self.condition is not None

    def include_if(self, options: WorkerOptions) -> bool:
        """Whether the step takes part for these options."""
        return self.condition is None or self.condition(options)

    def describe(self, options: WorkerOptions) -> str:
        """What this step will do for these options, shown by ``workerctl steps``."""
        return self.label

    def start(self, parent: ParentT) -> None:
        """Start this step's component; raising stops the ones already started, in reverse."""

    def stop(self, parent: ParentT) -> None:
        """Stop gracefully (warm shutdown): let work in progress finish."""

    def terminate(self, parent: ParentT) -> None:
        """Stop now (cold shutdown). Defaults to :meth:`stop`."""
        self.stop(parent)

    def info(self, parent: ParentT) -> Mapping[str, Any]:
        """Statistics merged into ``workerctl inspect stats``."""
        return {}

    def __repr__(self) -> str:
        return f"<step {self.name}>"
