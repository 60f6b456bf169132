"""A typed place for plugins' state on the worker: each plugin keeps what it needs under a key of
its own instead of writing attributes onto objects it does not own (pytest's ``Stash``)::

    DISPATCHER = StashKey[EventDispatcher]()

    worker.stash[DISPATCHER] = EventDispatcher(...)
    dispatcher = worker.stash.get(DISPATCHER, None)
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar, cast

__all__ = ["Stash", "StashKey"]

T = TypeVar("T")
D = TypeVar("D")


class StashKey(Generic[T]):
    """A key of a :class:`Stash`; its type parameter is the type of the value stored under it.
    Keys compare by identity: create one per piece of state, at module level."""

    __slots__ = ()


class Stash:
    """A mapping from :class:`StashKey` to values of the key's type."""

    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items: dict[StashKey[Any], object] = {}

    def __setitem__(self, key: StashKey[T], value: T) -> None:
        self._items[key] = value

    def __getitem__(self, key: StashKey[T]) -> T:
        return cast(T, self._items[key])

    def get(self, key: StashKey[T], default: D) -> T | D:
        try:
            return self[key]
        except KeyError:
            return default

    def setdefault(self, key: StashKey[T], default: T) -> T:
        try:
            return self[key]
        except KeyError:
            self[key] = default
            return default

    def __delitem__(self, key: StashKey[T]) -> None:
        del self._items[key]

    def __contains__(self, key: StashKey[T]) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)
