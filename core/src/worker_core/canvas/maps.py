"""``xmap``, ``xstarmap`` and ``chunks``: one task applied to many arguments in one message.

``add.map([1, 2])`` sends Celery's built-in task ``celery.map`` with the signature and the
arguments (``celery.starmap`` calls it with ``*args``); the worker runs them one after another.
``add.chunks(pairs, 10)`` sends a group of ``celery.starmap`` tasks of ten arguments each. The
messages are routed as the task applied would be.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from itertools import islice
from typing import Any, ClassVar

from ..protocol.message import safe_repr_as_built
from .groups import group as Group
from .interface import CanvasApp
from .signatures import Signature, register_type

__all__ = ["chunks", "xmap", "xstarmap"]


def _listed(it: Iterable[Any]) -> Any:
    return it if isinstance(it, (list, tuple)) else list(it)


def _task_name(task: Any) -> Any:
    if isinstance(task, Mapping):
        return task.get("task")
    return getattr(task, "name", task)


class _Map(Signature):
    """``task`` applied to each item of ``it``, as the built-in task :attr:`builtin`."""

    builtin: ClassVar[str]

    def __init__(self, task: Any, it: Iterable[Any], **options: Any) -> None:
        super().__init__(self.builtin, (), {"task": task, "it": _listed(it)}, immutable=True, **options)

    @classmethod
    def _from_dict(cls, data: Mapping[str, Any], app: CanvasApp | None) -> Signature:
        kwargs = data["kwargs"]
        return cls(kwargs["task"], kwargs["it"], app=app, **data["options"])

    def apply_async(self, args: Iterable[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
                    route_name: str | None = None, **options: Any) -> Any:
        given = {key: value for key, value in options.items() if value is not None}
        _, _, merged = self._merge(options=given)
        route = route_name or merged.pop("route_name", None) or _task_name(self.kwargs.get("task"))
        arguments = {"task": self.kwargs["task"], "it": list(self.kwargs["it"])}
        merged.setdefault("reply_to", self.app.thread_oid)
        merged.setdefault("argsrepr", "()")
        merged.setdefault("kwargsrepr", safe_repr_as_built(arguments))
        builtin = self.type
        if builtin is not None:  # an app that registers Celery's built-in tasks itself
            return builtin.apply_async((), arguments, route_name=route, **merged)
        return self.app.send_task(self.builtin, (), arguments, route_name=route, **merged)

    def __repr__(self) -> str:
        star = "*" if self.builtin == "celery.starmap" else ""
        return f"[{_task_name(self.kwargs['task'])}({star}x) for x in {self.kwargs['it']!r}]"


@register_type("xmap")
class xmap(_Map):
    """``task(x)`` for each ``x``, run one after another by one worker (``add.map(it)``)."""

    builtin = "celery.map"


@register_type("xstarmap")
class xstarmap(_Map):
    """``task(*x)`` for each ``x``, run one after another by one worker (``add.starmap(it)``)."""

    builtin = "celery.starmap"


def _parts(it: Iterable[Any], n: int) -> Iterator[list[Any]]:
    items = iter(it)
    for first in items:
        yield [first, *islice(items, n - 1)]


@register_type("chunks")
class chunks(Signature):
    """``task(*x)`` for each ``x``, in parts of ``n`` sent as a group of ``celery.starmap`` tasks
    (``add.chunks(zip(a, b), 10)``); returns the group's result, one list per part."""

    def __init__(self, task: Any, it: Iterable[Any], n: int, **options: Any) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"chunks need a whole number of items per part, 1 or more (got {n!r})")
        super().__init__("celery.chunks", (), {"task": task, "it": _listed(it), "n": n}, immutable=True,
                         **options)

    @classmethod
    def _from_dict(cls, data: Mapping[str, Any], app: CanvasApp | None) -> Signature:
        kwargs = data["kwargs"]
        return cls(kwargs["task"], kwargs["it"], kwargs["n"], app=app, **data["options"])

    def __call__(self, **options: Any) -> Any:
        return self.apply_async(**options)

    def apply_async(self, args: Iterable[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
                    **options: Any) -> Any:
        return self.group().apply_async(args, kwargs, route_name=_task_name(self.kwargs.get("task")),
                                        **options)

    def group(self) -> Group:
        """The group of ``celery.starmap`` tasks this sends."""
        task, it, n = self.kwargs["task"], self.kwargs["it"], self.kwargs["n"]
        return Group([xstarmap(task, part, app=self._app) for part in _parts(it, n)], app=self._app)
