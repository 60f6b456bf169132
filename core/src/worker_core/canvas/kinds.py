"""Which class each kind of signature is (its ``subtask_type``), and signatures rebuilt from
the dicts a message carries: :func:`from_dict`, :func:`maybe_signature`, :func:`signature`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from ..exceptions import CanvasError
from .signatures import Signature

if TYPE_CHECKING:
    from ..app.base import App

__all__ = ["from_dict", "maybe_signature", "register_type", "signature"]

#: What the kwargs of each kind of signature hold, for error messages.
_LAYOUTS = {"chain": "'tasks', a list of signatures", "group": "'tasks', a list of signatures",
            "chord": "'header', a list of signatures, and 'body', a signature"}

#: The signature class of each ``subtask_type`` (filled by :func:`register_type`).
_TYPES: dict[str, type[Signature]] = {}

S = TypeVar("S", bound="Signature")


def register_type(name: str) -> Callable[[type[S]], type[S]]:
    """Class decorator: dicts whose ``subtask_type`` is ``name`` are rebuilt as this class."""
    def register(cls: type[S]) -> type[S]:
        _TYPES[name] = cls
        return cls

    return register


def from_dict(data: Mapping[str, Any], app: App | None = None) -> Signature:
    """The signature ``data`` describes, as the class its ``subtask_type`` names (a plain
    :class:`Signature` when it names none): for the dicts found in a message's embed.

    :raise CanvasError: ``data`` is not a signature's dict (no task name, an unknown kind).
    """
    if not isinstance(data, Mapping):
        raise CanvasError(f"a signature must be a mapping with a 'task' key (got {data!r} that is a "
                          f"{type(data).__name__})")
    kind = data.get("subtask_type")
    if kind:
        cls = _TYPES.get(kind)
        if cls is None:
            raise CanvasError(f"unknown signature kind subtask_type={kind!r} in {dict(data)!r}; the known "
                              f"kinds are {', '.join(sorted(_TYPES))}")
        try:
            return cls._from_dict(data, app)
        except (KeyError, TypeError, AttributeError) as exc:
            raise CanvasError(f"a signature of kind {kind!r} needs Celery's layout of one (its kwargs: "
                              f"{_LAYOUTS.get(kind, 'its members')}); got {dict(data)!r} ({exc!r})") from None
    if not isinstance(data.get("task"), str) or not data["task"]:
        raise CanvasError(f"a signature's dict needs a task name under 'task' (got {dict(data)!r})")
    for key, kind_of in (("args", (list, tuple)), ("kwargs", Mapping), ("options", Mapping)):
        if key in data and not isinstance(data[key], kind_of):
            raise CanvasError(f"the {key!r} of the signature of {data['task']!r} must be a "
                              f"{'list' if key == 'args' else 'mapping'} (got {data[key]!r})")
    return Signature(data, app=app)


def maybe_signature(data: Any, app: App | None = None, clone: bool = False) -> Any:
    """``data`` as a signature: None stays None, a signature stays itself (or a clone), a dict is
    rebuilt with :func:`from_dict`; with ``app``, the signature sends with that app."""
    if data is None:
        return None
    if isinstance(data, Signature):
        if clone:
            data = data.clone()
    else:
        data = from_dict(data)
    if app is not None:
        data._app = app
    return data


def signature(varies: Any, *args: Any, **kwargs: Any) -> Signature:
    """A new signature: a clone of a signature, one rebuilt from a dict, or made from a task (or
    task name) and ``args``, ``kwargs``, ``options``."""
    if isinstance(varies, Signature):
        return varies.clone()
    if isinstance(varies, Mapping):
        return from_dict(varies, app=kwargs.get("app"))
    return Signature(varies, *args, **kwargs)
