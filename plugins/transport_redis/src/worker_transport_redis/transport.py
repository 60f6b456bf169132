"""The Redis transport slot: ``redis://``, ``rediss://`` (TLS) and ``sentinel://`` through kombu's
Redis transport, with batched fetches and acknowledgements on Celery's exact wire format."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from worker_core.exceptions import TransportError

from .options import check_options, check_urls

if TYPE_CHECKING:
    from kombu.connection import Connection

    from worker_core.app.settings import Settings

__all__ = ["RedisTransport"]

logger = logging.getLogger(__name__)


class RedisTransport:
    """Queues are Redis lists named as Celery names them (``celery``, ``celery\\x06\\x163``, ...),
    unacknowledged messages live in kombu's ``unacked`` hash, so Celery workers can share them.

    ``broker_transport_options`` are kombu's Redis options, plus ``fetch_limit`` (the most
    messages one round trip takes, 100) and ``ssl`` (redis-py SSL arguments for ``rediss://``).
    """

    supports_async: ClassVar[bool] = True
    #: Acknowledgements name the message, not the connection: tasks received before a lost
    #: connection still run and are acknowledged after the reconnect.
    acks_survive_reconnect: ClassVar[bool] = True

    @classmethod
    def default_result_backend(cls, broker_url: str) -> str | None:
        # As in Celery: results are off unless result_backend is set.
        return None

    def __init__(self, url: str, settings: Settings) -> None:
        self.url = url
        self.scheme, self.urls = check_urls(url)
        options = check_options(self.scheme, settings.broker_transport_options)
        self.ssl: Mapping[str, Any] | None = options.pop("ssl", None)
        self.options = options

    def __repr__(self) -> str:
        return f"<RedisTransport {self.scheme}>"

    def info(self) -> dict[str, Any]:
        """What ``workerctl inspect`` shows about the broker."""
        return {"transport": "redis", "scheme": self.scheme,
                **{name: value for name, value in self.options.items() if "password" not in name}}

    def kombu_transport(self) -> type:
        from .kombu_transport import SentinelTransport, Transport  # imports kombu's Redis transport

        return SentinelTransport if self.scheme == "sentinel" else Transport

    def connection_options(self) -> dict[str, Any]:
        transport_options = dict(self.options)
        # kombu scans for the unacked messages of dead workers on every tenth check only (one
        # check every 10 s on the hub), so they could wait 100 s past their visibility timeout;
        # a scan is one ZRANGE, so scan at every check.
        transport_options.setdefault("unacked_restore_throttle", 1)
        options: dict[str, Any] = {"transport_options": transport_options}
        if self.ssl is not None:
            options["ssl"] = dict(self.ssl)
        elif self.scheme == "rediss" and "ssl_" not in self.url:
            # What kombu does for rediss:// without SSL options (it only does it for its own
            # 'rediss' alias, not for a transport class): encrypt, but do not verify.
            logger.warning("Secure redis scheme specified (rediss) with no ssl options, defaulting to "
                           "insecure SSL behaviour. Set broker_transport_options={'ssl': "
                           "{'ssl_cert_reqs': 'required', 'ssl_ca_certs': ...}} to verify the server.")
            options["ssl"] = {"ssl_cert_reqs": "none"}
        return options

    def queue_depth(self, connection: Connection, queue: str) -> int:
        """Messages waiting in ``queue``: LLEN summed over its priority lists."""
        from .channel import Channel

        channel = connection.default_channel
        if not isinstance(channel, Channel):
            raise TransportError(
                f"queue_depth() needs a connection made with this transport's kombu_transport() "
                f"(got a channel of {type(channel).__module__}.{type(channel).__qualname__})"
            )
        return int(channel._size(queue))
