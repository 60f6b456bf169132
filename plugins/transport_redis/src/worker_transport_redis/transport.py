"""The Redis transport slot: ``redis://``, ``rediss://`` (TLS) and ``sentinel://`` through kombu's
Redis transport, with batched fetches and acknowledgements on Celery's exact wire format."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from .options import DEFAULT_VISIBILITY_TIMEOUT, check_options, check_urls
from .tls import TLS, broker_tls

#: kombu's default ``priority_steps``
DEFAULT_PRIORITY_STEPS = (0, 3, 6, 9)

if TYPE_CHECKING:
    from kombu.connection import Connection

    from worker_core import Settings
    from worker_core.slots import (
        AcksSurviveReconnect,
        BrokerStatus,
        ConnectFailure,
        CountsDeliveries,
        ElectsLeaders,
        ExplainsConnectFailures,
        FansOutEvents,
        KeepsRecords,
        OrdersByPriority,
        ReportsRefusals,
        TellsTime,
        Transport,
    )

    from .election import RedisLease, RedisRecords

__all__ = ["RedisTransport"]


class RedisTransport:
    """Queues are Redis lists named as Celery names them (``celery``, ``celery\\x06\\x163``, ...),
    unacknowledged messages live in kombu's ``unacked`` hash, so Celery workers can share them.

    ``broker_transport_options`` are kombu's Redis options, plus ``fetch_limit`` (the most
    messages one round trip takes, 100) and ``ssl`` (redis-py SSL arguments, as ``broker_use_ssl``).
    TLS (``rediss://``, or ``broker_use_ssl``) needs ``ssl_cert_reqs``: see :mod:`.tls`.
    """

    supports_async: ClassVar[bool] = True
    #: Acknowledgements name the message, not the connection: tasks received before a lost
    #: connection still run and are acknowledged after the reconnect.
    acks_survive_reconnect: ClassVar[bool] = True
    #: While the worker holds a message, its entry in kombu's ``unacked_index`` is renewed every
    #: quarter of ``visibility_timeout`` (see :mod:`.leases`): no restore takes it.
    renews_leases: ClassVar[bool] = True
    #: kombu's topic exchanges on Redis reach only the process that declared them: Celery's
    #: monitors bind to a fanout ``celeryev``.
    fans_out_events: ClassVar[bool] = True

    @classmethod
    def lease_timeout(cls, settings: Settings) -> float:
        return float(settings.broker_transport_options.get("visibility_timeout", DEFAULT_VISIBILITY_TIMEOUT))

    @classmethod
    def default_result_backend(cls, broker_url: str) -> str | None:
        # As in Celery: results are off unless result_backend is set.
        return None

    @classmethod
    def priority_order(cls, settings: Settings) -> tuple[int, int] | None:
        """kombu's priority lists: the lowest step is served first (0, then 3, 6 and 9 by
        default; a priority between two steps goes to the lower one)."""
        steps = settings.broker_transport_options.get("priority_steps", DEFAULT_PRIORITY_STEPS)
        return (min(steps), max(steps)) if len(set(steps)) > 1 else None

    def __init__(self, url: str, settings: Settings) -> None:
        self.url = url
        self.scheme, self.urls = check_urls(url)
        options = check_options(self.scheme, settings.broker_transport_options)
        self.tls: TLS | None = broker_tls(url, self.scheme, settings.broker_use_ssl, options.pop("ssl", None))
        self.options = options

    def __repr__(self) -> str:
        return f"<RedisTransport {self.scheme}>"

    def info(self) -> dict[str, Any]:
        """What ``workerctl inspect`` shows about the broker."""
        shown = {"transport": "redis", "scheme": self.scheme,
                 **{name: value for name, value in self.options.items() if "password" not in name}}
        if self.tls is not None:
            shown["ssl"] = self.tls.info()
        return shown

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
        if self.tls is not None:
            # kombu lets ssl_* parameters in the URL replace Connection(ssl=...) whole; the kombu
            # transport puts back the arguments resolved from every source (see kombu_transport)
            options["ssl"] = dict(self.tls.arguments)
            transport_options["ssl"] = dict(self.tls.arguments)
        return options

    @classmethod
    def refusal(cls, exc: BaseException) -> str | None:
        """Redis refusing work on a connection that still works (out of memory, a read-only
        replica, a busy script, loading its data): what it means; else None."""
        from .refusals import refusal

        reason = refusal(exc)
        return None if reason is None else f"Redis refuses work: {reason}"

    @classmethod
    def watch_refusals(cls, connection: Connection, status: BrokerStatus) -> None:
        """Tell ``status`` when Redis starts and stops refusing writes on ``connection``'s channels."""
        connection.transport.broker_status = status

    @classmethod
    def broker_time(cls, connection: Connection) -> float:
        """Redis's clock (``TIME``), seconds since the epoch."""
        channel: Any = connection.default_channel  # a kombu Redis channel (kombu is not annotated)
        with channel.conn_or_acquire() as client:
            seconds, microseconds = client.time()
        return float(seconds) + float(microseconds) / 1e6

    def queue_depth(self, connection: Connection, queue: str) -> int:
        """Messages waiting in ``queue``: LLEN summed over its priority lists."""
        from .stock import priority_lists

        channel: Any = connection.default_channel  # a kombu Redis channel (kombu is not annotated)
        with channel.conn_or_acquire() as client, client.pipeline() as pipe:
            for name in priority_lists(queue, channel.priority_steps, channel.sep):
                pipe.llen(name)
            return int(sum(pipe.execute()))

    def count_delivery(self, connection: Connection, key: str, expires: float) -> int:
        """INCR and EXPIRE ``key`` (under the channel's ``global_keyprefix``) in one transaction on
        the broker: the poison cap's count of a message delivered again, just before it starts.

        The acknowledgements buffered so far are written first: a task that takes the worker down
        then cannot take along those of the tasks that finished before it (they would run again,
        and count)."""
        from .acking import AckingChannel

        channel: Any = connection.default_channel  # a kombu Redis channel (kombu is not annotated)
        if isinstance(channel, AckingChannel) and channel.acks and not channel.recording_in_flight:
            channel.flush_acks()  # (not while a fetch's records are on their way: acks must follow them)
        name = channel.global_keyprefix + key
        with channel.conn_or_acquire() as client, client.pipeline(transaction=True) as pipe:
            pipe.incr(name)
            pipe.expire(name, max(1, round(expires)))
            count, _ = pipe.execute()
        return int(count)

    def explain_connect_failure(self, exc: BaseException) -> ConnectFailure | None:
        """A password refused or missing, in one line with the fix; not retried (it stays wrong)."""
        from redis.exceptions import AuthenticationError

        from worker_core.slots import ConnectFailure

        if not isinstance(exc, AuthenticationError):
            return None
        text = " ".join(str(exc).split()).rstrip(".")
        if "required" in text.lower():
            return ConnectFailure(f"Redis asks for a password and the broker URL gives none ({text}): write "
                                  "it in the URL, redis://:PASSWORD@host:port/db", retry=False)
        return ConnectFailure(f"Redis refused the login ({text}): check the user name and password in the "
                              "broker URL (redis://[USER]:PASSWORD@host:port/db)", retry=False)

    def lease(self, name: str, holder: str, *, ttl: float) -> RedisLease:
        """A key with a deadline the server keeps (``SET NX PX``), a counter for its fencing
        tokens, and a script that sends a message under it once (see :mod:`.election`)."""
        from .election import RedisLease

        return RedisLease(self.url, self.scheme == "sentinel", self.connection_options(), name, holder, ttl)

    def record_table(self, name: str) -> RedisRecords:
        """A hash and its version counter."""
        from .election import RedisRecords

        return RedisRecords(self.url, self.scheme == "sentinel", self.connection_options(), name)


if TYPE_CHECKING:
    # mypy proves the class satisfies its slot's Protocol and the capabilities it offers.
    _TRANSPORT: type[Transport] = RedisTransport
    _ACKS: type[AcksSurviveReconnect] = RedisTransport
    _COUNTS: type[CountsDeliveries] = RedisTransport
    _FANOUT: type[FansOutEvents] = RedisTransport
    _ELECTS: type[ElectsLeaders] = RedisTransport
    _RECORDS: type[KeepsRecords] = RedisTransport
    _REFUSALS: type[ReportsRefusals] = RedisTransport
    _TIME: type[TellsTime] = RedisTransport
    _EXPLAINS: type[ExplainsConnectFailures] = RedisTransport
    _PRIORITIES: type[OrdersByPriority] = RedisTransport
