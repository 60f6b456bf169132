"""Choosing the implementation of every slot for a set of options, before anything starts."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

import attrs

from .exceptions import ConfigurationError
from .options import WorkerOptions, scheme_of
from .plugins.entrypoints import PluginEntry
from .plugins.manager import PluginManager
from .slots import FixedConcurrency, OffersResultBackend, Pool, Transport

__all__ = ["DEFAULT_BROKER", "Selection", "default_result_url", "select"]

logger = logging.getLogger("worker")

#: The transport used when no broker URL is configured: needs no server.
DEFAULT_BROKER = "embedded://"


@attrs.frozen
class Selection:
    """The implementation chosen for each slot, and the options with every default resolved."""

    options: WorkerOptions
    broker_urls: tuple[str, ...]
    result_url: str
    pool: PluginEntry
    transport: PluginEntry
    loop: PluginEntry
    autoscaler: PluginEntry | None
    failover: PluginEntry
    result_backend: PluginEntry

    def slots(self) -> Mapping[str, PluginEntry]:
        chosen = {
            "pool": self.pool,
            "transport": self.transport,
            "loop": self.loop,
            "failover": self.failover,
            "result_backend": self.result_backend,
        }
        if self.autoscaler is not None:
            chosen["autoscaler"] = self.autoscaler
        return chosen


def default_result_url(transport: type[Transport], broker_url: str) -> str:
    """The result backend to use when none is configured: the transport's own when it offers one
    (:class:`~worker_core.slots.OffersResultBackend`), else ``"disabled"``, as in Celery."""
    offered: object = transport  # a class carries its class methods: tested like an instance
    if isinstance(offered, OffersResultBackend):
        return offered.default_result_backend(broker_url) or "disabled"
    return "disabled"


def _fixed_concurrency(pool: type[Pool]) -> int | None:
    declared: object = pool  # a class carries its class attributes: tested like an instance
    return declared.fixed_concurrency if isinstance(declared, FixedConcurrency) else None


def select(
    options: WorkerOptions,
    manager: PluginManager,
    *,
    broker_urls: tuple[str, ...] = (),
    result_url: str | None = None,
) -> Selection:
    """Resolve defaults (pool, loop, concurrency) and check every chosen name is installed.

    :param broker_urls: from the app's settings, used when the options name no broker.
    :param result_url: the app's ``result_backend`` setting; empty picks the transport's own
        default result backend when it offers one (the embedded transport does) and otherwise
        ``"disabled"``, which stores nothing.
    """
    urls = options.brokers or broker_urls or (DEFAULT_BROKER,)
    schemes = {scheme_of(url) for url in urls}
    if len(schemes) > 1:
        raise ConfigurationError(
            f"all broker URLs must use one transport, got {', '.join(sorted(schemes))}: "
            f"failover switches between servers of the same kind"
        )
    transport_name = schemes.pop()
    transport = manager.slot_entry("transport", transport_name)

    pool_name = options.pool or manager.default_pool()
    pool = manager.slot_entry("pool", pool_name)
    fixed = _fixed_concurrency(manager.slot("pool", pool_name))
    concurrency = options.concurrency
    if fixed is not None:
        if concurrency not in (None, fixed):
            logger.warning("the %s pool always runs %d task(s) at a time; -c %d is ignored",
                           pool_name, fixed, concurrency)
        if options.autoscale is not None:
            raise ConfigurationError(
                f"--autoscale needs a pool that can grow; the {pool_name} pool always runs {fixed} task(s) "
                f"at a time. Use -P threads or -P prefork"
            )
        concurrency = fixed
    elif concurrency is None:
        concurrency = os.cpu_count() or 1

    transport_class = manager.slot("transport", transport_name)
    supports_async = transport_class.supports_async
    loop_name = options.loop
    if loop_name == "auto":
        loop_name = "async" if supports_async and "async" in manager.names("loop") else "sync"
    elif loop_name == "async" and not supports_async:
        raise ConfigurationError(
            f"--loop async needs a transport that supports it; the {transport_name!r} transport "
            f"does not. Use --loop sync (or leave --loop at auto)"
        )
    loop = manager.slot_entry("loop", loop_name)

    autoscaler = manager.slot_entry("autoscaler", options.autoscaler) if options.autoscale else None
    failover = manager.slot_entry("failover", options.failover)

    if not result_url:
        result_url = default_result_url(transport_class, urls[0])
    result_backend = manager.slot_entry("result_backend", scheme_of(result_url))

    resolved = options.replace(pool=pool_name, loop=loop_name, concurrency=concurrency, brokers=tuple(urls))
    return Selection(
        options=resolved,
        broker_urls=tuple(urls),
        result_url=result_url,
        pool=pool,
        transport=transport,
        loop=loop,
        autoscaler=autoscaler,
        failover=failover,
        result_backend=result_backend,
    )
