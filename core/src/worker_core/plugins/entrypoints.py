"""Finding plugins: the entry-point groups, listing them through stevedore's cache, and the
distribution each one comes from."""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Mapping

import attrs

__all__ = [
    "HOOKS_GROUP",
    "KNOWN_DISTRIBUTIONS",
    "REPOSITORY_PATHS",
    "SCHEME_SLOTS",
    "SLOT_CHOICE",
    "SLOT_GROUPS",
    "PluginEntry",
    "distribution_of",
    "install_hint",
    "list_entries",
]

#: Plugins that take part in the run through hooks (bootsteps, options, events).
HOOKS_GROUP = "worker.plugins"

#: One entry-point group per single-implementation slot; the entry point's name is what the
#: user chooses (``-P prefork``) or, for transports and result backends, the URL scheme.
SLOT_GROUPS: Mapping[str, str] = {
    "pool": "worker.pools",
    "transport": "worker.transports",
    "loop": "worker.loops",
    "autoscaler": "worker.autoscalers",
    "failover": "worker.failover_strategies",
    "result_backend": "worker.result_backends",
    "app_loader": "worker.app_loaders",
}

#: The slots chosen by a URL's scheme; a scheme with ``+`` (``db+postgresql``) falls back to the
#: entry point named after its part before ``+`` (``db``) when none is named after all of it.
SCHEME_SLOTS = frozenset({"transport", "result_backend"})

#: How a user chooses an implementation of each slot, for error messages.
SLOT_CHOICE: Mapping[str, str] = {
    "pool": "-P/--pool",
    "transport": "the broker URL's scheme (-b/--broker)",
    "loop": "--loop",
    "autoscaler": "--autoscaler",
    "failover": "--failover",
    "result_backend": "the result_backend URL's scheme",
    "app_loader": "-A/--app",
}

#: Which distribution provides the names this project publishes, to say what to install.
KNOWN_DISTRIBUTIONS: Mapping[tuple[str, str], str] = {
    ("pool", "prefork"): "worker-pool-prefork",
    ("pool", "threads"): "worker-pool-threads",
    ("transport", "redis"): "worker-transport-redis",
    ("transport", "rediss"): "worker-transport-redis",
    ("transport", "sentinel"): "worker-transport-redis",
    ("result_backend", "redis"): "worker-transport-redis",
    ("result_backend", "rediss"): "worker-transport-redis",
    ("result_backend", "sentinel"): "worker-transport-redis",
    ("transport", "amqp"): "worker-transport-amqp",
    ("transport", "amqps"): "worker-transport-amqp",
    ("transport", "pyamqp"): "worker-transport-amqp",
    ("app_loader", "celery"): "worker-celery",
    ("app_loader", "django"): "worker-django",
    **{(slot, scheme): "worker-transport-postgres" for slot, scheme in [
        ("transport", "postgresql"), ("transport", "postgres"), ("transport", "sqla+postgresql"),
        ("result_backend", "postgresql"), ("result_backend", "postgres"),
        ("result_backend", "db+postgresql")]},
}


#: Where each of this project's distributions is in its repository: install hints name these
#: paths (``pip install ./plugins/pool_prefork``, run from a checkout), never a package name
#: on the package index.
REPOSITORY_PATHS: Mapping[str, str] = {
    "worker-core": "./core",
    "worker-pool-prefork": "./plugins/pool_prefork",
    "worker-pool-threads": "./plugins/pool_threads",
    "worker-pool-asyncio": "./plugins/pool_asyncio",
    "worker-transport-redis": "./plugins/transport_redis",
    "worker-transport-amqp": "./plugins/transport_amqp",
    "worker-autoscale-backlog": "./plugins/autoscale_backlog",
    "worker-celery": "./plugins/celery_app",
    "worker-metrics-prometheus": "./plugins/metrics_prometheus",
    "worker-transport-postgres": "./plugins/transport_postgres",
    "worker-beat": "./plugins/beat",
    "worker-transport-redis-cluster": "./plugins/transport_redis_cluster",
    "worker-otel": "./plugins/otel",
    "worker-django": "./plugins/django",
}


def install_hint(distribution: str) -> str:
    """``pip install ./plugins/celery_app (worker-celery, from a checkout of this repository)``
    for one of this project's distributions; for another, how to find it."""
    path = REPOSITORY_PATHS.get(distribution)
    if path is None:
        return f"install the distribution {distribution}"
    return f"pip install {path} ({distribution}, from a checkout of this repository)"


@attrs.frozen
class PluginEntry:
    """One entry point of one of the worker's groups, not yet imported."""

    kind: str  # "hooks" or a slot name from SLOT_GROUPS
    name: str
    group: str
    value: str  # "package.module:attribute"

    @property
    def module(self) -> str:
        return self.value.partition(":")[0].strip()

    @property
    def distribution(self) -> str | None:
        found = distribution_of(self)
        return found[0] if found else None

    @property
    def version(self) -> str | None:
        found = distribution_of(self)
        return found[1] if found else None

    def describe(self) -> str:
        """``'prefork' (worker-pool-prefork 0.1.0, entry point worker.pools: prefork = x:Y)``"""
        found = distribution_of(self)
        where = f"{found[0]} {found[1]}, " if found else ""
        return f"{self.name!r} ({where}entry point {self.group}: {self.name} = {self.value})"

    def load(self) -> object:
        return importlib.metadata.EntryPoint(self.name, self.value, self.group).load()


def _group_kind(group: str) -> str:
    if group == HOOKS_GROUP:
        return "hooks"
    for kind, slot_group in SLOT_GROUPS.items():
        if slot_group == group:
            return kind
    raise KeyError(group)


def list_entries(group: str) -> list[PluginEntry]:
    """Every entry point in ``group``, read through stevedore (which caches the scan), in a
    stable order: by name, then by target."""
    from stevedore.named import NamedExtensionManager

    # A NamedExtensionManager with no names lists the group without importing anything.
    manager: NamedExtensionManager[object] = NamedExtensionManager(
        group, names=(), on_missing_entrypoints_callback=None
    )
    kind = _group_kind(group)
    entries = {
        PluginEntry(kind=kind, name=ep.name, group=group, value=ep.value)
        for ep in manager.list_entry_points()
    }
    return sorted(entries, key=lambda e: (e.name, e.value))


@functools.lru_cache(maxsize=1)
def _distribution_index() -> dict[tuple[str, str, str], tuple[str, str]]:
    groups = {HOOKS_GROUP, *SLOT_GROUPS.values()}
    index: dict[tuple[str, str, str], tuple[str, str]] = {}
    for dist in importlib.metadata.distributions():
        try:
            eps = [ep for ep in dist.entry_points if ep.group in groups]
        except Exception:  # a broken dist-info must not break the listing
            continue
        if eps:
            found = (dist.metadata["Name"], dist.version)  # (parsed once per distribution)
            for ep in eps:
                index.setdefault((ep.group, ep.name, ep.value), found)
    return index


def distribution_of(entry: PluginEntry) -> tuple[str, str] | None:
    """``(distribution name, version)`` that declares this entry point, if any."""
    return _distribution_index().get((entry.group, entry.name, entry.value))


def forget_distributions() -> None:
    """Drop the cached distribution index (after installing a plugin in this process)."""
    _distribution_index.cache_clear()
