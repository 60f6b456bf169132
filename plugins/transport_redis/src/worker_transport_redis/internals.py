"""Every private name of kombu and redis-py the Redis transport uses, the checks that guard the
fast paths built on them, and the small functions through which the rest of the plugin reaches
them. Checked against kombu 5.7.0 with redis-py 8.1.0 and 6.1.0 (the pins: ``kombu>=5.7,<5.8``,
``redis>=6.1,<8.2``; kombu 5.6 gives up the Redis behaviour the transport documents).

==================================================  ==================================================
name                                                used for
==================================================  ==================================================
**the batched fetch** (``fetch``)
``Channel._brpop_start(self, timeout=None)``        overridden: sends the fetch script, or BRPOP
``Channel._brpop_read(self, **options)``            overridden: reads the script's or BRPOP's reply
``Channel._in_poll``, ``Channel._brpop_sent_at``    set as kombu's reader sets them: the poller, the
                                                    BRPOP health check and ``close`` read them
``Channel._queue_cycle``                            kombu's round-robin order, followed by the script
``Channel._flush_brpop_reauth(self)``               called after each reply, as kombu does (kombu's
                                                    streaming re-authentication, when it has one)
``Transport._deliver(self, message, queue)``        hands a fetched envelope to the consumer
``Channel._do_restore_message(...)``                puts a copy back (requeue of a message whose
                                                    record is still on its way)
``Message._raw``                                    the envelope that copy is made of (the core's
                                                    message keeps it where kombu's does)
``QoS._delivered``                                  a held message replaced by its packed form
                                                    (``park_message``); without it, kept whole
``MultiChannelPoller._chan_to_sock``,               whether a fetch in flight is read soon, so the
``MultiChannelPoller._paused_brpop``                buffered acks may wait for it
``MultiChannelPoller._in_protected_read``           whether a cancel comes from inside kombu's read
                                                    (kombu defers it; the reply is read there)
redis-py ``Connection._sock``                       the BRPOP socket's identity (``CLIENT UNBLOCK`` on
                                                    close)
**the acknowledgement batching** (``acks``)
``QoS._remove_from_indices(self, delivery_tag,      kombu's reject and restore, which the batching
pipe=None)``                                        leaves to kombu (acknowledgements go by script)
``Channel._consumers``                              whether the channel is being consumed
``MultiChannelPoller._channels``                    the channels whose acks each loop turn writes
``Channel._create_client(self, asynchronous=False)``  one client per channel instead of one per call
**the hub registration of each socket once** (``hub``)
kombu's ``register_with_event_loop.<locals>.        found among the hub's per-turn callbacks and
on_poll_start``                                     replaced by one that adds only new sockets
**the leases** (on every path, fast or stock; nothing to fall back to)
``Transport._collect(self, connection)``            defined: kombu's ``Connection.collect`` (a lost
                                                    connection) calls it instead of closing
                                                    politely; the channels close without restoring
                                                    what the worker keeps (if kombu stopped calling
                                                    it, they would be restored, as by kombu)
``Channel._q_for_pri(self, queue, pri)``,           the list a message sent once is pushed onto by
``Channel._get_message_priority(...)``              the lease's script, named as kombu's ``_put``
                                                    names it (:func:`priority_list`)
**the result wait outside the subscriber's lock** (``listener``)
redis-py ``Connection._sock``                       the subscriber's socket, waited on outside the lock
==================================================  ==================================================

The fast paths fall back one by one, except that the batched fetch works only with the
acknowledgement batching: the script records what it takes and carries the acks on one
connection, in order, where kombu's QoS would write acks on another, possibly before the records.
Publishing, the queue layout and ``queue_depth`` use kombu's and redis-py's public API only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from types import CodeType
from typing import Any

import kombu as _kombu_package
import redis as _redis_package
import redis.connection as _redis_connection
from kombu.asynchronous import hub as _hub
from kombu.transport import redis as _kombu_redis
from kombu.transport import virtual as _virtual

from worker_core.fastpaths import Check, FastPath, FastPaths, Library, reads, signature

__all__ = ["KOMBU", "PATHS", "REDIS", "FetchHooks", "brpop_socket", "channels_of", "current", "deliverer",
           "envelope_of", "flush_reauth", "forget", "has_consumers", "in_protected_read", "kombus_poll_start",
           "new_client", "paused", "priority_list", "queue_cycle", "restore_message", "send_brpop",
           "set_waiting", "socket_of", "waiting"]

logger = logging.getLogger(__name__)

# kombu is not annotated: its modules are typed as Any here, once.
kombu_redis: Any = _kombu_redis
virtual: Any = _virtual
hub: Any = _hub
KombuChannel: Any = kombu_redis.Channel
KombuQoS: Any = kombu_redis.QoS
Poller: Any = kombu_redis.MultiChannelPoller
RedisConnection: Any = _redis_connection.Connection

KOMBU = Library(_kombu_package, "kombu", (5, 7), (5, 8))
REDIS = Library(_redis_package, "redis", (6, 1), (8, 2))

#: how kombu's per-turn callback is named (registered by its ``register_with_event_loop``)
KOMBUS_POLL_START = "register_with_event_loop.<locals>.on_poll_start"


def _no_poll_start(owner: Any, name: str) -> str | None:
    code = getattr(getattr(owner, name, None), "__code__", None)
    nested = {const.co_name for const in code.co_consts if isinstance(const, CodeType)} if code else set()
    if KOMBUS_POLL_START.rpartition(".")[2] in nested:
        return None
    return f"kombu {KOMBU.version}'s {owner.__qualname__}.{name} no longer defines on_poll_start"


PATHS: Mapping[str, FastPath] = {
    "acks": FastPath(
        "the acknowledgement batching", "each acknowledgement is written at once (ZREM and HDEL), as kombu "
        "does, and one made while Redis is unreachable is not written later (its message comes back after "
        "the visibility timeout)", (KOMBU, REDIS), (
            signature(KombuQoS, "_remove_from_indices", "(self, delivery_tag, pipe=None)"),
            signature(KombuQoS, "ack", "(self, delivery_tag)"),
            signature(KombuQoS, "reject", "(self, delivery_tag, requeue=False)"),
            signature(KombuQoS, "restore_unacked_once", "(self, stderr=None)"),
            reads(virtual.Channel, "basic_consume", "_consumers"),
            signature(Poller, "on_poll_start", "(self)"),
            reads(Poller, "on_poll_start", "_channels"),
            signature(KombuChannel, "conn_or_acquire", "(self, client=None)"),
            signature(KombuChannel, "_create_client", "(self, asynchronous=False)"),
        )),
    "fetch": FastPath(
        "the batched fetch", "messages are taken one BRPOP at a time and recorded by kombu's own QoS",
        (KOMBU, REDIS), (
            signature(KombuChannel, "_brpop_start", "(self, timeout=None)"),
            reads(KombuChannel, "_brpop_start", "_queue_cycle", "_in_poll", "_brpop_sent_at"),
            signature(KombuChannel, "_brpop_read", "(self, **options)"),
            reads(KombuChannel, "_brpop_read", "_in_poll", "_deliver", "_queue_cycle"),
            reads(KombuChannel, "close", "_in_poll"),
            reads(KombuChannel, "basic_cancel", "_in_protected_read"),
            signature(KombuChannel, "_do_restore_message",
                      "(self, payload, exchange, routing_key, pipe, leftmost=False)"),
            signature(virtual.Transport, "_deliver", "(self, message, queue)"),
            signature(virtual.QoS, "append", "(self, message, delivery_tag)"),
            reads(Poller, "_register", "_chan_to_sock"),
            reads(Poller, "on_readable", "_paused_brpop"),
            reads(Poller, "maybe_check_brpop_health", "_in_poll", "_brpop_sent_at"),
            reads(RedisConnection, "disconnect", "_sock"),
        ), needs=("acks",)),
    "hub": FastPath(
        "the hub registration of each socket once", "kombu adds every Redis socket to the hub again at "
        "every loop turn",
        (KOMBU,), (
            Check(kombu_redis.Transport, "register_with_event_loop", _no_poll_start),
            signature(kombu_redis.Transport, "register_with_event_loop", "(self, connection, loop)"),
            reads(hub.Hub, "add", "readers"),  # (as (callback, args), which the replacement compares)
        )),
    "listener": FastPath(
        "the result wait outside the subscriber's lock", "a waiting client reads with redis-py's "
        "get_message, holding the lock 50 ms at a time", (REDIS,), (
            reads(RedisConnection, "disconnect", "_sock"),
        ), still="results still arrive at once, and a thread subscribing meanwhile may wait up to 50 ms"),
}

_fast_paths = FastPaths(PATHS, "Redis transport", logger)
#: which fast paths are on in this process: decided at the first call, said once in the log
current = _fast_paths.current
#: decide again at the next :func:`current` (after the environment or a library changed)
forget = _fast_paths.forget


# -- batched fetch ---------------------------------------------------------------------------------


class FetchHooks:
    """kombu's reader hooks, bound to the batched channel's own methods."""

    def _brpop_start(self, timeout: float | None = None) -> None:
        self.start_read(timeout)  # type: ignore[attr-defined]

    def _brpop_read(self, **options: Any) -> bool:
        return self.read_reply(**options)  # type: ignore[attr-defined,no-any-return]


def send_brpop(channel: Any, timeout: float | None) -> None:
    """kombu's own BRPOP (after the batched channel's choice not to fetch)."""
    KombuChannel._brpop_start(channel, timeout)


def waiting(channel: Any) -> Any:
    """The connection a reply is awaited on, or None."""
    return channel._in_poll


def in_protected_read(channel: Any) -> bool:
    """Whether kombu's poller is reading now (it defers a cancel made meanwhile)."""
    return bool(channel.connection.cycle._in_protected_read)


def set_waiting(channel: Any, connection: Any, sent_at: float | None = None) -> None:
    """Mark a command sent on ``connection`` (None: its reply was read), as kombu's reader does."""
    channel._in_poll = connection
    if sent_at is not None:
        channel._brpop_sent_at = sent_at


def flush_reauth(channel: Any) -> None:
    """What kombu does once a reply was read (a pending re-authentication), if it does anything."""
    flush = getattr(channel, "_flush_brpop_reauth", None)
    if flush is not None:
        flush()


def queue_cycle(channel: Any) -> Any:
    """kombu's queue cycle (``consume(n)``, ``rotate(queue)``)."""
    return channel._queue_cycle


def deliverer(channel: Any) -> Callable[[Any, str], Any]:
    """The function handing an envelope and its queue to the channel's consumer."""
    return channel.connection._deliver  # type: ignore[no-any-return]


def restore_message(channel: Any, payload: Any, exchange: Any, routing_key: Any, pipe: Any,
                    leftmost: bool) -> None:
    channel._do_restore_message(payload, exchange, routing_key, pipe, leftmost=leftmost)


def envelope_of(message: Any) -> Any:
    """The envelope a message was built from (kept by the core's message as kombu's keeps it,
    or packed by a held message's stand-in)."""
    from .parked import Parked

    if isinstance(message, Parked):
        return message.unpacked
    return message._raw


def priority_list(channel: Any, queue: str, message: Any) -> str:
    """The Redis list kombu's ``_put`` pushes ``message`` onto: ``queue``, or its list for the
    message's priority."""
    name: str = channel._q_for_pri(queue, channel._get_message_priority(message, reverse=False))
    return name


def replace_delivered(qos: Any, delivery_tag: str, stand_in: Any) -> None:
    """Keep ``stand_in`` instead of the message the QoS counts under ``delivery_tag`` (nothing
    when it counts none, or when kombu keeps its messages elsewhere: they stay whole)."""
    delivered = getattr(qos, "_delivered", None)
    if isinstance(delivered, dict) and delivery_tag in delivered:
        delivered[delivery_tag] = stand_in


def brpop_socket(poller: Any, channel: Any) -> Any:
    """The socket the poller watches for ``channel``'s reader, or None."""
    return poller._chan_to_sock.get((channel, channel.client, "BRPOP"))


def paused(poller: Any, fileno: int) -> bool:
    """Whether the poller holds back this socket's reply (no prefetch room)."""
    return fileno in poller._paused_brpop


def socket_of(connection: Any) -> Any:
    """A redis-py connection's socket, or None when it is not connected."""
    return connection._sock


# -- batched acknowledgements ------------------------------------------------------------------------


def has_consumers(channel: Any) -> bool:
    return bool(channel._consumers)


def new_client(channel: Any) -> Any:
    """A client on the channel's pool, made as kombu makes them."""
    return channel._create_client()


def channels_of(poller: Any) -> Any:
    return poller._channels


# -- the hub -----------------------------------------------------------------------------------------


def kombus_poll_start(loop: Any) -> Any:
    """kombu's per-turn callback on ``loop``, or None when there is not exactly one."""
    found = [tick for tick in loop.on_tick if getattr(tick, "__qualname__", "").endswith(KOMBUS_POLL_START)]
    return found[0] if len(found) == 1 else None
