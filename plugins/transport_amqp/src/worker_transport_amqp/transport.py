"""The AMQP transport slot: ``amqp://``, ``amqps://`` (TLS) and ``pyamqp://`` through py-amqp
(``kombu.transport.pyamqp``), with AMQP heartbeats on by default as in Celery."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from .options import check_options, check_urls
from .tls import TLS, broker_tls

if TYPE_CHECKING:
    from kombu.connection import Connection

    from worker_core.app.settings import Settings
    from worker_core.slots import Transport

__all__ = ["AmqpTransport"]

#: AMQP's reply code for a queue that does not exist (passive declare).
NOT_FOUND = 404


class AmqpTransport:
    """RabbitMQ through py-amqp. Queues are declared by the worker exactly as Celery declares them
    (durable, bound to a direct exchange of the same name, global QoS), so both share a queue.

    ``broker_transport_options`` are py-amqp's connection arguments (``confirm_publish``,
    ``client_properties``, ``read_timeout``, ...), kombu's reconnect schedule, and ``ssl``
    (``True`` or SSL arguments, as ``broker_use_ssl``). Over TLS the server's certificate and
    host name are checked unless turned off explicitly: see :mod:`.tls`.
    """

    supports_async: ClassVar[bool] = True
    #: Delivery tags belong to the channel: after a reconnect RabbitMQ delivers again what was
    #: not acknowledged, so tasks received but not started are dropped rather than run twice.
    acks_survive_reconnect: ClassVar[bool] = False

    @classmethod
    def default_result_backend(cls, broker_url: str) -> str | None:
        # As in Celery: results are off unless result_backend is set.
        return None

    def __init__(self, url: str, settings: Settings) -> None:
        self.url = url
        self.scheme, self.urls = check_urls(url)
        options = check_options(settings.broker_transport_options)
        self.tls: TLS | None = broker_tls(url, self.scheme, settings.broker_use_ssl, options.pop("ssl", None))
        self.options = options
        #: Seconds between heartbeats (0: off); py-amqp agrees the smaller one with the server.
        self.heartbeat = float(settings.broker_heartbeat)

    def __repr__(self) -> str:
        return f"<AmqpTransport {self.scheme}>"

    def info(self) -> dict[str, Any]:
        """What ``workerctl inspect`` shows about the broker."""
        return {"transport": "amqp", "scheme": self.scheme, "heartbeat": self.heartbeat,
                "ssl": self.tls.info() if self.tls is not None else False}

    def kombu_transport(self) -> type:
        from .kombu_transport import SSLTransport, Transport  # imports kombu's py-amqp transport

        return SSLTransport if self.tls is not None else Transport

    def connection_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"heartbeat": self.heartbeat, "transport_options": dict(self.options)}
        if self.tls is not None:
            options["ssl"] = dict(self.tls.arguments)  # a copy each time: kombu writes into it
        return options

    def queue_depth(self, connection: Connection, queue: str) -> int:
        """Messages ready in ``queue`` (a passive declare); 0 when the queue does not exist."""
        # A failed passive declare closes its channel: never risk the consumer's own channel.
        channel = connection.channel()
        try:
            return int(channel.queue_declare(queue=queue, passive=True).message_count)
        except connection.channel_errors as exc:
            if getattr(exc, "reply_code", None) == NOT_FOUND:
                return 0
            raise
        finally:
            try:
                channel.close()
            except Exception:  # already closed by the broker after a failed declare
                pass


if TYPE_CHECKING:
    # mypy proves the class satisfies its slot's Protocol and the capabilities it offers.
    _TRANSPORT: type[Transport] = AmqpTransport
