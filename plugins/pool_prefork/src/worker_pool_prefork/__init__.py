"""The prefork pool for worker: tasks run in child processes forked on billiard."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .pool import PreforkPool

__all__ = ["PreforkPool"]


def __getattr__(name: str) -> Any:
    # The hooks plugin (``--child-scheduler``) is loaded for every worker; the pool, billiard
    # with it, only when -P prefork chooses it.
    if name == "PreforkPool":
        from .pool import PreforkPool

        return PreforkPool
    raise AttributeError(f"module 'worker_pool_prefork' has no attribute {name!r}")
