"""The Redis Cluster transport slot: ``redis-cluster://host:port,host:port/`` and ``rediss-cluster://``
(TLS), each queue's keys in one hash slot, queues spread over the slots, batched fetches, leases
renewed while held, fanout through sharded pub/sub."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from worker_core.exceptions import TransportError
from worker_core.redaction import redact_url

from .options import BROKER_OPTIONS, check_broker

if TYPE_CHECKING:
    from kombu.connection import Connection

    from worker_core import Settings
    from worker_core.slots import (
        AcksSurviveReconnect,
        BrokerStatus,
        CountsDeliveries,
        ElectsLeaders,
        FansOutEvents,
        KeepsRecords,
        LeasesMessages,
        ReportsRefusals,
        TellsTime,
        Transport,
    )

    from .channel import Channel
    from .election import ClusterLease, ClusterRecords

__all__ = ["RedisClusterTransport"]


class RedisClusterTransport:
    """``redis-cluster://[user:password@]host:port[,host:port...]/`` (any one node is enough to
    find the rest; list several so that one down at start-up does not matter) and the TLS form
    ``rediss-cluster://`` (``ssl_cert_reqs`` and the CA in the query, ``broker_use_ssl`` or the
    transport option ``ssl``). ``broker_transport_options``: see :data:`.options.BROKER_OPTIONS`.
    """

    supports_async: ClassVar[bool] = True
    #: Acknowledgements name the message and this process, not the connection.
    acks_survive_reconnect: ClassVar[bool] = True
    #: The leases of held messages are renewed every quarter of ``visibility_timeout``.
    renews_leases: ClassVar[bool] = True
    #: Monitoring events go to a fanout exchange (pub/sub), as on Redis.
    fans_out_events: ClassVar[bool] = True

    @classmethod
    def lease_timeout(cls, settings: Settings) -> float:
        default = BROKER_OPTIONS["visibility_timeout"][0]
        return float(settings.broker_transport_options.get("visibility_timeout", default))

    @classmethod
    def default_result_backend(cls, broker_url: str) -> str | None:
        # As in Celery: results are off unless result_backend is set.
        return None

    @classmethod
    def refusal(cls, exc: BaseException) -> str | None:
        """A node refusing work on a connection that still works (out of memory, too few replicas
        for ``min-replicas-to-write``, a busy script, loading its data): what it means; else None."""
        from .cluster import refusal

        return refusal(exc)

    @classmethod
    def watch_refusals(cls, connection: Connection, status: BrokerStatus) -> None:
        """Tell ``status`` when a node starts and stops refusing the work of ``connection``."""
        connection.transport.watch(status)

    @classmethod
    def broker_time(cls, connection: Connection) -> float:
        """The cluster's clock (``TIME`` on a primary), seconds since the epoch: the clock the
        leases run by is each queue's primary's, and primaries agree as well as their hosts do."""
        router = connection.transport.router
        client = router.client
        seconds, microseconds = client.get_redis_connection(client.get_default_node()).time()
        return float(seconds) + float(microseconds) / 1e6

    def __init__(self, url: str, settings: Settings) -> None:
        self.url = url
        self.settings = settings
        self.config = check_broker(url, settings.broker_transport_options, settings.broker_use_ssl)

    def __repr__(self) -> str:
        return f"<RedisClusterTransport {redact_url(self.url)}>"

    def info(self) -> dict[str, Any]:
        """What ``workerctl inspect`` shows about the broker."""
        return self.config.info()

    def kombu_transport(self) -> type:
        from .kombu_transport import Transport  # imports redis-py's cluster client: only when connecting

        return Transport

    def connection_options(self) -> dict[str, Any]:
        from .kombu_transport import CONFIG

        return {"transport_options": {CONFIG: self.config, **self.config.passed}}

    def _channel(self, connection: Connection) -> Channel:
        from .channel import Channel

        channel = connection.default_channel
        if not isinstance(channel, Channel):
            raise TransportError(
                f"needs a connection made with this transport's kombu_transport() (got a channel of "
                f"{type(channel).__module__}.{type(channel).__qualname__})"
            )
        return channel

    def queue_depth(self, connection: Connection, queue: str) -> int:
        """Messages waiting in ``queue`` (its shards too): LLEN summed over its priority lists."""
        return int(self._channel(connection)._size(queue))

    def count_delivery(self, connection: Connection, key: str, expires: float) -> int:
        """The poison cap's counter (one key, INCR and PEXPIRE in one script). The acknowledgements
        kept so far are written first, so a task that takes the worker down cannot take along those
        of the tasks that finished before it."""
        from .keys import key_slot
        from .scripts import COUNT

        channel = self._channel(connection)
        transport = channel.connection
        if channel.location.unwritten:
            transport.flush_acks()
        name = self.config.key_prefix + key
        router = transport.router
        sent = router.run(
            key_slot(name), [router.script(COUNT, [name], [max(1, round(expires * 1000))])], write=False
        )
        return int(sent.replies[0])

    def lease(self, name: str, holder: str, *, ttl: float) -> ClusterLease:
        """A key with a deadline the primary keeps (``SET NX PX``), a counter for its fencing
        tokens and an outbox, all in the lease's slot (see :mod:`.election`)."""
        from .election import ClusterLease

        return ClusterLease(self.config, name, holder, ttl)

    def record_table(self, name: str) -> ClusterRecords:
        """A hash and its version counter, in one slot."""
        from .election import ClusterRecords

        return ClusterRecords(self.config, name)


if TYPE_CHECKING:
    # mypy proves the class satisfies its slot's Protocol and the capabilities it offers.
    _TRANSPORT: type[Transport] = RedisClusterTransport
    _ACKS: type[AcksSurviveReconnect] = RedisClusterTransport
    _LEASES: type[LeasesMessages] = RedisClusterTransport
    _COUNTS: type[CountsDeliveries] = RedisClusterTransport
    _FANOUT: type[FansOutEvents] = RedisClusterTransport
    _ELECTS: type[ElectsLeaders] = RedisClusterTransport
    _RECORDS: type[KeepsRecords] = RedisClusterTransport
    _REFUSALS: type[ReportsRefusals] = RedisClusterTransport
    _TIME: type[TellsTime] = RedisClusterTransport
