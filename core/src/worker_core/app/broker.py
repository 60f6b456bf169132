"""Broker connections through the transport plugins, and the queue of a name as the settings
declare it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import kombu

from ..options import parse_brokers, scheme_of
from ..plugins.manager import PluginManager
from ..selection import DEFAULT_BROKER
from ..slots import RewritesUrls
from .queues import Topology
from .settings import Settings

if TYPE_CHECKING:
    from kombu.connection import Connection
    from kombu.entity import Queue
    from kombu.messaging import Producer

    from ..slots import Transport
    from .base import App

__all__ = ["broker_urls", "connect", "connect_for_publishing", "connection_for", "connection_through",
           "kombu_url", "task_queue", "transport_for"]


def transport_for(plugins: PluginManager, url: str, settings: Settings) -> Transport:
    """The transport plugin object serving ``url`` (chosen by its scheme)."""
    transport: Transport = plugins.slot("transport", scheme_of(url))(url, settings)
    return transport


def connection_for(plugins: PluginManager, url: str, settings: Settings, **extra: Any) -> Connection:
    """A (not yet connected) kombu connection to ``url`` through its transport plugin."""
    return connection_through(transport_for(plugins, url, settings), url, settings, **extra)


def connection_through(transport: Transport, url: str, settings: Settings, **extra: Any) -> Connection:
    """A (not yet connected) kombu connection to ``url`` through the transport plugin object
    ``transport``; ``extra`` overrides its connection options."""
    options = dict(transport.connection_options())
    options.setdefault("connect_timeout", settings.broker_connection_timeout)
    options.update(extra)
    return kombu.Connection(  # type: ignore[attr-defined,no-untyped-call]
        kombu_url(transport, url), transport=transport.kombu_transport(), **options
    )


def kombu_url(transport: Transport, url: str) -> str:
    """The URL kombu is given for ``url``: the transport's rewriting of it when it
    :class:`~worker_core.slots.RewritesUrls`, else ``url``."""
    return transport.kombu_url(url) if isinstance(transport, RewritesUrls) else url


def _failover(plugins: PluginManager, name: str) -> Any:
    strategy = plugins.slot("failover", name)
    return lambda urls: iter(strategy(list(urls)))


def broker_urls(settings: Settings) -> tuple[str, ...]:
    """The broker URLs the settings name (``broker_url``, ``;``-separated for failover), else the
    embedded transport's."""
    return parse_brokers(settings.broker_url) if settings.broker_url else (DEFAULT_BROKER,)


def connect(plugins: PluginManager, urls: Sequence[str], settings: Settings, **extra: Any) -> Connection:
    """A (not yet connected) kombu connection to the brokers ``urls`` through the first one's
    transport plugin, failing over between them with the ``broker_failover_strategy``;
    ``extra`` overrides the transport's connection options."""
    transport = transport_for(plugins, urls[0], settings)
    options = dict(transport.connection_options())
    options.setdefault("connect_timeout", settings.broker_connection_timeout)
    if len(urls) > 1:
        options["failover_strategy"] = _failover(plugins, settings.broker_failover_strategy)
    options.update(extra)
    return kombu.Connection(  # type: ignore[attr-defined,no-untyped-call]
        ";".join(kombu_url(transport, url) for url in urls), transport=transport.kombu_transport(),
        **options
    )


def connect_for_publishing(app: App) -> tuple[Connection, Producer]:
    """A connection and producer for this thread, failing over between the broker URLs."""
    connection = connect(app.plugins, app.broker_urls, app.settings)
    return connection, kombu.Producer(connection)  # type: ignore[attr-defined,no-untyped-call]


def task_queue(name: str, settings: Settings) -> Queue:
    """The task queue ``name`` as the settings declare it: from ``task_queues``, else made as
    Celery makes a queue (a durable queue bound to a direct exchange of its name), so Celery and
    this worker can share it on RabbitMQ."""
    queue: Queue = Topology.from_settings(settings).queue(name)
    return queue
