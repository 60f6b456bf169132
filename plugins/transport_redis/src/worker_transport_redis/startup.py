"""Keep ``import redis`` cheap: redis-py imports its asyncio client eagerly, which pulls in the
whole of :mod:`asyncio` (tens of milliseconds at worker start-up) although neither kombu nor this
plugin uses it. Registering ``redis.asyncio`` as a lazily loaded module before redis-py is
imported keeps the name bound for anyone who does use it (first attribute access loads it
fully) without paying for it otherwise.
"""

from __future__ import annotations

import importlib.util
import os
import sys

__all__ = ["defer_redis_asyncio"]


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
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules["redis.asyncio"] = module
    spec.loader.exec_module(module)
