"""The AMQP transport slot: ``amqp://``, ``amqps://`` (TLS) and ``pyamqp://`` through py-amqp
(``kombu.transport.pyamqp``), with AMQP heartbeats on by default as in Celery."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from .options import check_options, check_urls
from .tls import TLS, broker_tls

if TYPE_CHECKING:
    from kombu.connection import Connection

    from worker_core import Settings
    from worker_core.slots import (
        AdoptsQueues,
        BrokerStatus,
        BuffersDeliveries,
        ConnectFailure,
        DelaysOnBroker,
        ElectsLeaders,
        ExplainsConnectFailures,
        OrdersByPriority,
        ReportsRefusals,
        Transport,
    )

    from .election import AmqpLease

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
    #: py-amqp reads every frame up to the reply it waits for (to a window change, say): the
    #: deliveries among them wait in its buffer, unseen by the loop's poller.
    buffers_deliveries: ClassVar[bool] = True

    @classmethod
    def default_result_backend(cls, broker_url: str) -> str | None:
        # As in Celery: results are off unless result_backend is set.
        return None

    @classmethod
    def priority_order(cls, settings: Settings) -> tuple[int, int] | None:
        """RabbitMQ serves the higher priority first, up to the queue's ``x-max-priority``:
        ``task_queue_max_priority`` (a queue without it takes no priorities)."""
        highest = settings.task_queue_max_priority
        return (highest, 0) if highest else None

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

    def declare_queue(self, connection: Connection, queue: Any) -> Any:
        """Declare ``queue`` on a channel of its own, adopting the arguments of a queue that
        exists with others where that is safe (see :mod:`.declare`)."""
        from .declare import declare_queue

        return declare_queue(connection, queue).queue

    def declaration_differs(self, exc: BaseException) -> bool:
        """Whether ``exc`` is RabbitMQ's ``PRECONDITION_FAILED`` for an inequivalent argument."""
        from .inequivalent import mismatch_of

        return mismatch_of(exc) is not None

    def declare_delays(self, connection: Connection, queue_type: str) -> None:
        """The levels of Celery's native delayed delivery (see :mod:`.delays`)."""
        from .delays import declare_delays

        declare_delays(connection, queue_type)

    def bind_to_delays(self, connection: Connection, queue: Any) -> None:
        from .delays import bind_to_delays

        bind_to_delays(connection, queue)

    def delayed_route(self, seconds: float, routing_key: str) -> tuple[str, str]:
        from .delays import ENTRY_EXCHANGE, delayed_routing_key

        return ENTRY_EXCHANGE, delayed_routing_key(seconds, routing_key)

    def explain_connect_failure(self, exc: BaseException) -> ConnectFailure | None:
        """A login refused (stops the worker) or a virtual host missing or not allowed (retried),
        in one line with the fix (see :mod:`.connect_failures`)."""
        from .connect_failures import explain

        return explain(exc, self.url)

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

    def lease(self, name: str, holder: str, *, ttl: float) -> AmqpLease:
        """The one message of a single-active-consumer quorum queue, held unacknowledged by its
        holder; free again within about ``ttl`` seconds of the holder's last heartbeat (see
        :mod:`.election`)."""
        from .election import AmqpLease

        return AmqpLease(self.url, self.tls is not None, self.connection_options(), name, holder, ttl)

    @classmethod
    def refusal(cls, exc: BaseException) -> str | None:
        """RabbitMQ refuses work by blocking the connection (``connection.blocked``), not with an
        error: no error is a refusal."""
        return None

    @classmethod
    def watch_refusals(cls, connection: Connection, status: BrokerStatus) -> None:
        """Tell ``status`` when RabbitMQ blocks ``connection`` (a memory or disk alarm, once the
        connection publishes: an event, a remote-control reply, a task a task sends) and unblocks it."""
        connection.transport.broker_status = status


if TYPE_CHECKING:
    # mypy proves the class satisfies its slot's Protocol and the capabilities it offers.
    _TRANSPORT: type[Transport] = AmqpTransport
    _BUFFERS: type[BuffersDeliveries] = AmqpTransport
    _ADOPTS: type[AdoptsQueues] = AmqpTransport
    _DELAYS: type[DelaysOnBroker] = AmqpTransport
    _ELECTS: type[ElectsLeaders] = AmqpTransport
    _REFUSALS: type[ReportsRefusals] = AmqpTransport
    _EXPLAINS: type[ExplainsConnectFailures] = AmqpTransport
    _PRIORITIES: type[OrdersByPriority] = AmqpTransport
