"""kombu's own Redis channel, as the transport runs it when its fast paths are off: kombu takes
every message with BRPOP, records it and acknowledges it, through public hooks only. The leases
on held messages (:mod:`.leases`) are kept on this path too.

kombu decodes what BRPOP returns before any message is built, so an envelope that is not JSON
would raise out of ``drain_events`` (and stop the worker). A response callback on the channel's
client (redis-py's ``set_response_callback``) gives kombu, in its place, a stand-in envelope
carrying the reason, from which :class:`Message` builds a message to reject.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kombu.transport import redis as _redis
from kombu.utils import encoding as _encoding

from worker_core.protocol.fastjson import dumps as fast_dumps
from worker_core.protocol.fastjson import loads as fast_loads
from worker_core.transports import message as _message
from worker_core.transports.message import Unreadable, fresh_tag

from .acks import owe, take_owed
from .leases import Leases, leases_at
from .qos import LeasingQoS
from .refusals import refusal
from .scripts import ACK, RENEW, run

if TYPE_CHECKING:
    from worker_core.slots import BrokerStatus

__all__ = ["Message", "StockChannel", "StockSentinelChannel", "not_json", "priority_lists", "read_envelope"]

# kombu is not annotated: its modules are typed as Any here, once.
redis: Any = _redis
CoreMessage: Any = _message.Message
loads: Callable[[str], Any] = fast_loads
dumps: Callable[[Any], str] = fast_dumps
bytes_to_str: Callable[[Any], str] = _encoding.bytes_to_str

logger = logging.getLogger(__name__)

#: the key of a stand-in envelope: ``{"reason": ..., "queue": ...}`` of an item that was not one
STAND_IN = "worker-unreadable"
#: how much of an unreadable item a reason quotes
_QUOTED = 120


def priority_lists(queue: str, steps: Sequence[int], sep: str) -> list[str]:
    """The Redis lists of ``queue``, one per priority step, served in this order (Celery's
    layout, which kombu writes: ``queue`` for step 0, ``queue`` + ``sep`` + step for the others)."""
    return [f"{queue}{sep}{step}" if step else queue for step in steps]


def not_json(raw: str, exc: Exception) -> str:
    """Why the envelope ``raw`` cannot be read (``exc``: what decoding it raised)."""
    return f"its envelope is not JSON ({type(exc).__name__}: {exc}): {raw[:_QUOTED]!r}"


def read_envelope(raw: str, queue: str) -> Any:
    """The decoded envelope ``raw`` (as kombu decodes it), or why it is none."""
    try:
        return loads(raw)
    except Exception as exc:  # not JSON, nested too deeply, a kombu type tag it cannot read
        return Unreadable(not_json(raw, exc), fresh_tag(), queue)


class Message(CoreMessage):  # type: ignore[misc]
    """The core's message for kombu's virtual transports, which also reads stand-in envelopes."""

    delivery_info: Mapping[str, Any]

    def __init__(self, payload: Any, channel: Any = None, **kwargs: Any) -> None:
        # (kombu decodes envelopes into dicts: the common case costs one type check)
        if type(payload) is dict and STAND_IN in payload and isinstance(payload[STAND_IN], Mapping):
            described = payload[STAND_IN]
            payload = Unreadable(str(described.get("reason")), fresh_tag(), str(described.get("queue")))
        super().__init__(payload, channel, **kwargs)
        info = self.delivery_info
        if "exchange" not in info or "routing_key" not in info:
            # kombu's QoS records a delivered message under its exchange and routing key: one
            # that came without them (to be rejected: see ``errors``) is recorded under empty ones
            self.delivery_info = {"exchange": "", "routing_key": "", **info}


def _checking(original: Callable[..., Any], channel: Any) -> Callable[..., Any]:
    """``original`` (redis-py's BRPOP response callback), whose item is replaced by a stand-in
    when it is not JSON."""
    def check(response: Any, **options: Any) -> Any:
        reply = original(response, **options)
        if not reply:
            return reply
        key, item = reply
        queue = bytes_to_str(key).removeprefix(channel.global_keyprefix).rsplit(channel.sep, 1)[0]
        found = read_envelope(bytes_to_str(item), queue)
        if isinstance(found, Unreadable):
            return key, dumps({STAND_IN: {"reason": found.reason, "queue": queue}})
        return reply

    return check


class StockChannel(redis.Channel):  # type: ignore[misc]
    """kombu's Redis channel, with the core's message and envelopes checked at BRPOP."""

    Message = Message
    QoS = LeasingQoS
    #: False for a channel reading BRPOP's replies itself (it checks them there)
    checks_brpop_replies = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        conninfo = self.connection.client
        #: where this channel's ``unacked`` records live: acknowledgements and leases are kept
        #: per location, beyond the life of one channel
        self.location: Hashable = (
            conninfo.hostname, conninfo.port, str(conninfo.virtual_host), self.global_keyprefix,
            self.unacked_key, self.unacked_index_key,
        )
        self.leases: Leases = leases_at(self.location)
        #: set when the connection was lost: closing keeps what the worker holds (see keep_held)
        self.keeps_held = False
        if self.checks_brpop_replies:
            client = self.client
            client.set_response_callback("BRPOP", _checking(client.response_callbacks["BRPOP"], self))
        if self.ack_emulation:
            self.leases.attach(self)
            self.write_owed()

    @property
    def broker_status(self) -> BrokerStatus | None:
        """The worker's broker status, when a worker watches this connection (see
        :meth:`~.transport.RedisTransport.watch_refusals`)."""
        status: BrokerStatus | None = self.connection.broker_status
        return status

    def write_owed(self) -> None:
        """Write the acknowledgements a closed channel to this Redis could not (see :mod:`.acks`)."""
        owed = take_owed(self.location)
        if not owed:
            return
        try:
            self.remove_records(owed)
        except Exception as exc:
            owe(self.location, owed)
            reason = refusal(exc)
            if reason is not None:
                self.leases.refused(reason)
                return
            logger.warning("could not write %d acknowledgement(s) owed to Redis (%r); the next "
                           "connection tries again", len(owed), exc)

    def park_message(self, delivery_tag: str, envelope: bytes) -> None:
        """Keep a message the worker holds for its ETA packed (:class:`~worker_core.slots.ParksMessages`)."""
        self.qos.park(delivery_tag, envelope)

    def lost_leases(self) -> frozenset[str] | None:
        """The held messages whose lease this process lost (:class:`~worker_core.slots.FencesLeases`):
        see :meth:`.leases.Leases.lost_leases`."""
        return self.leases.lost_leases()

    def maybe_refresh_binding_expiry(self) -> None:
        """kombu's refresh of expiring queues' bindings, except while Redis refuses writes (kombu
        logs each refusal with its traceback): told to the leases instead, which try again."""
        refresh = getattr(super(), "maybe_refresh_binding_expiry", None)
        if refresh is None or self.leases.refusing():
            return
        try:
            refresh()
        except Exception as exc:
            reason = refusal(exc)
            if reason is None:
                raise
            self.leases.refused(reason)

    def keep_held(self) -> None:
        """The connection was lost and the worker keeps the messages it holds (it acknowledges
        them on the next connection, which renews their leases): closing must not restore them."""
        self.keeps_held = True

    def renew_leases(self, groups: Mapping[str, Sequence[str]]) -> tuple[bool, str, list[str], list[str]]:
        """Renew the leases this process holds (:data:`~.scripts.RENEW`; see
        :meth:`.leases.LeaseRenewer.renew_leases`)."""
        prefix = self.global_keyprefix
        keys = [prefix + self.unacked_index_key, prefix + self.unacked_mutex_key]
        args = [part for score, tags in groups.items() for part in (score, len(tags), *tags)]
        with self.conn_or_acquire() as client:
            reply = run(client, RENEW, keys, args)
        tags = [bytes_to_str(tag) for tag in reply[3:]]
        lost = int(reply[2])
        return int(reply[0]) == 0, bytes_to_str(reply[1]), tags[:lost], tags[lost:]

    def remove_records(self, tags: Sequence[str]) -> None:
        """Acknowledge ``tags``: drop their ``unacked`` records (as kombu's QoS does, in one round
        trip; a script, which Redis out of memory still runs, where it refuses a MULTI)."""
        prefix = self.global_keyprefix
        with self.conn_or_acquire() as client:
            run(client, ACK, [prefix + self.unacked_key, prefix + self.unacked_index_key], tags)

    def basic_consume(self, queue: str, no_ack: bool, callback: Callable[[Any], Any], consumer_tag: str,
                      **kwargs: Any) -> Any:
        if not no_ack:
            callback = self._dropping_copies(callback)
        return super().basic_consume(queue, no_ack, callback, consumer_tag, **kwargs)

    def _dropping_copies(self, callback: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """``callback``, except for a copy of a message this process still holds (see
        :class:`~.qos.LeasingQoS`): running it would run the task twice."""
        def deliver(message: Any) -> Any:
            if self.qos.take_copy(message.delivery_tag):
                logger.warning(
                    "Message %s came back from Redis while this worker still holds it (its lease "
                    "lapsed: the worker stood still for more than the visibility timeout of %gs, or "
                    "something restored it): the copy is dropped, the message runs once",
                    message.delivery_tag, float(self.visibility_timeout))
                return None
            return callback(message)

        return deliver

    def close(self) -> None:
        try:
            try:
                super().close()
            except Exception as exc:
                if not self.keeps_held:
                    raise
                self._close_without_redis(exc)
        finally:
            self.leases.detach(self)

    def _close_without_redis(self, exc: Exception) -> None:
        """Finish closing a channel whose connection was lost, after kombu's close failed on what
        it still had to say to Redis (a reply in flight, the bindings of an auto-delete queue).
        The channel counts as closed all the same: the acknowledgements of the messages the worker
        keeps then go through the next connection, and the transport closes its other channels."""
        logger.debug("closing a channel of the lost connection without Redis (%s: %s)",
                     type(exc).__name__, exc)
        self.closed = True
        try:
            self.qos.restore_unacked_once()  # (keeps_held: only what the consumer never saw)
        except Exception as restore_exc:
            logger.debug("could not restore on the lost connection: %r", restore_exc)
        for pool in (self.pool, self.async_pool):
            pool.disconnect()
        self.connection.cycle.discard(self)
        self.connection.close_channel(self)


class StockSentinelChannel(StockChannel, redis.SentinelChannel):  # type: ignore[misc]
    """The same, finding the master through Redis Sentinel."""
