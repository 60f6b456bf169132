"""Plugin discovery, loading, blocking and reporting.

Internal to worker-core (see :mod:`worker_core` for the public API).
"""

from .entrypoints import HOOKS_GROUP, SLOT_GROUPS, PluginEntry
from .manager import ESSENTIAL, PluginManager, PluginStatus

__all__ = ["ESSENTIAL", "HOOKS_GROUP", "SLOT_GROUPS", "PluginEntry", "PluginManager", "PluginStatus"]
