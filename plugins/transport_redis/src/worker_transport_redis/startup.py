"""Keep ``import redis`` cheap: redis-py imports its asyncio client eagerly, which pulls in the
whole of :mod:`asyncio` (tens of milliseconds at worker start-up) although neither kombu nor this
plugin uses it.

``redis.asyncio`` is registered, before redis-py is imported, as a package whose body has not run
yet: its ``__path__`` is there, so a submodule (redis-py 8's sync commands import
``redis.asyncio.observability.recorder``) imports on its own without the client, and the first
use of any other name runs the package body, so ``from redis.asyncio import Redis`` keeps working.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from importlib.machinery import ModuleSpec
from typing import Any

__all__ = ["defer_redis_asyncio"]


class _DeferredPackage(types.ModuleType):
    """A package whose ``__init__`` runs on the first access to a name it does not have yet."""

    __loading = False

    def __getattr__(self, name: str) -> Any:
        spec: ModuleSpec = self.__spec__  # type: ignore[assignment]
        if _DeferredPackage.__loading or spec.loader is None:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        _DeferredPackage.__loading = True
        try:
            spec.loader.exec_module(self)
        finally:
            _DeferredPackage.__loading = False
        self.__class__ = types.ModuleType  # type: ignore[assignment]  # an ordinary module from now on
        return getattr(self, name)


def defer_redis_asyncio() -> None:
    if "redis" in sys.modules or "redis.asyncio" in sys.modules:
        return
    parent = importlib.util.find_spec("redis")  # locates the package without importing it
    if parent is None or not parent.submodule_search_locations:
        return
    package_dir = next(iter(parent.submodule_search_locations))
    path = os.path.join(package_dir, "asyncio", "__init__.py")
    if not os.path.exists(path):
        return
    spec = importlib.util.spec_from_file_location(
        "redis.asyncio", path, submodule_search_locations=[os.path.dirname(path)]
    )
    if spec is None or spec.loader is None:
        return
    module = _DeferredPackage(spec.name)
    module.__spec__ = spec
    module.__loader__ = spec.loader
    module.__file__ = spec.origin
    module.__path__ = list(spec.submodule_search_locations or ())
    module.__package__ = spec.name
    sys.modules[spec.name] = module
