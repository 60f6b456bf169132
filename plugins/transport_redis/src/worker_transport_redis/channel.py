"""kombu's Redis channel with batched fetches (and acknowledgements, see :mod:`.acking`), on
Celery's wire format.

Stock kombu costs three round trips per message: BRPOP one message, ZADD+HSET it into
``unacked``, ZREM+HDEL it on ack. This channel, while the prefetch window has room and the queues
may hold messages, sends one script (:data:`~.scripts.FETCH`) that writes the acknowledgements
buffered since the last one, then pops up to the window's room in kombu's priority and
round-robin order and records each message in ``unacked``/``unacked_index`` in the same atomic
step (no message can be lost between the pop and the record). The script is sent and read on the
BRPOP connection through kombu's poller, so the hub and ``drain_events`` drive it unchanged.
When a fetch comes back short the queues are empty and the channel falls back to the blocking
BRPOP, so an idle worker wakes at once. The message BRPOP returns is handed to the consumer
straight away while the next fetch, sent first on the same connection, records it (kombu waits a
round trip for that record before delivering): acknowledgements travel on that connection or
after its reply, so Redis never sees an ack before the record it removes.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from queue import Empty
from time import monotonic
from typing import Any

from kombu.transport import redis as _redis
from kombu.utils import encoding as _encoding
from kombu.utils.scheduling import round_robin_cycle
from redis.exceptions import NoScriptError

from worker_core.protocol.fastjson import dumps as fast_dumps
from worker_core.protocol.fastjson import loads as fast_loads
from worker_core.transports import message as _message
from worker_core.transports.message import Unreadable, envelope_problem, fresh_tag, tag_problem

from . import internals
from .acking import AckingChannel
from .options import DEFAULT_FETCH_LIMIT
from .qos import FetchingQoS
from .refusals import refusal
from .scripts import FETCH, FETCH_SHA, RECORD, run
from .stock import not_json, priority_lists

__all__ = ["Channel", "SentinelChannel"]

logger = logging.getLogger(__name__)

# kombu is not annotated: its modules are typed as Any here, once.
redis: Any = _redis
CoreMessage: Any = _message.Message
#: kombu's JSON, on the C decoder/encoder unless kombu's tagged types are present.
loads: Callable[[str], Any] = fast_loads
dumps: Callable[[Any], str] = fast_dumps
bytes_to_str: Callable[[Any], str] = _encoding.bytes_to_str


#: a payload BRPOP took, to be recorded as unacked: its delivery tag, the JSON of its exchange
#: and routing key, and the payload as it came
Booking = tuple[str, str, str, bytes]


class _Fetch:
    """A fetch script in flight: what it asked for, the acknowledgements it carries, and the
    payloads BRPOP took that it records."""

    __slots__ = ("acks", "booked", "booked_tags", "queues", "want")

    def __init__(self, queues: list[str], want: int, acks: list[str], booked: list[Booking]) -> None:
        self.queues = queues
        self.want = want
        self.acks = acks
        self.booked = booked
        self.booked_tags = frozenset(booking[0] for booking in booked)


class Channel(internals.FetchHooks, AckingChannel):
    """A Redis channel that fetches in batches (see the module docstring)."""

    QoS = FetchingQoS
    #: the core's own message: this channel checks envelopes itself (no stand-ins reach it)
    Message = CoreMessage
    from_transport_options = (*redis.Channel.from_transport_options, "fetch_limit")
    fetch_limit = DEFAULT_FETCH_LIMIT
    #: the channel reads BRPOP's replies itself (and checks their envelopes)
    checks_brpop_replies = False
    qos: FetchingQoS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Without ack emulation there is nothing to record: kombu's plain BRPOP path is used.
        self._batching = bool(self.ack_emulation)
        self._script_loaded = False
        #: Whether the queues may hold messages: a fetch (non-blocking) is tried, else BRPOP.
        self._maybe_ready = True
        self._fetch: _Fetch | None = None
        #: Fetched, not yet handed to the consumer: the queue, the envelope (or what makes it
        #: unreadable), the tag the fetch recorded it under (None: not recorded) and the score of
        #: that record.
        self._undelivered: deque[tuple[str, Any, str | None, str]] = deque()
        self._client_id: int | None = None
        self._client_id_sock: Any = None
        #: Acknowledgements sent just before the BRPOP in flight, whose reply comes first.
        self._ack_reply: list[str] | None = None
        #: The reply in flight is read before a cancel or a close: nothing more is fetched.
        self._finishing = False
        #: What BRPOP took that a fetch Redis refused was to record: the next fetch records it.
        self._rebook: list[Booking] = []

    def basic_consume(self, queue: str, no_ack: bool, *args: Any, **kwargs: Any) -> Any:
        if no_ack:
            # The fetch script records every message it takes as unacked; kombu records none of
            # a queue read without acknowledgements (a client's reply queue). Such a channel
            # reads by BRPOP, as kombu's, so no record is left to be restored.
            self._batching = False
        return super().basic_consume(queue, no_ack, *args, **kwargs)

    @property
    def fetch_in_flight(self) -> bool:
        return self._fetch is not None

    @property
    def recording_in_flight(self) -> bool:
        """Whether the fetch in flight records messages BRPOP took: acks written on another
        connection meanwhile could reach Redis before the records they remove."""
        fetch = self._fetch
        return fetch is not None and bool(fetch.booked)

    # -- fetching (kombu's reader hooks call these) ---------------------------------------------

    def start_read(self, timeout: float | None = None) -> None:
        """Send the next fetch, or BRPOP when the queues looked empty (kombu's ``_brpop_start``)."""
        queues = internals.queue_cycle(self).consume(len(self.active_queues))
        if not queues:
            return
        if self._batching and (self._maybe_ready or self._rebook):
            room = self._room()
            if (room > 0 or self._rebook) and self._ensure_script():
                booked, self._rebook = self._rebook, []
                self._send_fetch(list(queues), room, booked)
                return
        self._learn_client_id()
        # BRPOP may block for brpop_timeout: acknowledgements must not wait behind it. They go
        # first on the same connection (a fetch of nothing), without waiting for their reply.
        acks = self.acks.take() if self.acks else []
        if acks and self._batching and self._script_loaded:
            self._send_acks_before_brpop(list(queues), acks)
        elif acks:
            self.acks.put_back(acks)
            self.flush_acks()
        internals.send_brpop(self, timeout)

    def _send_acks_before_brpop(self, queues: list[str], acks: list[str]) -> None:
        try:
            self.client.connection.send_command(*self._fetch_command(queues, 0, acks, []))
        except BaseException:
            self.acks.put_back(acks)
            raise
        self._ack_reply = acks

    def _learn_client_id(self) -> None:
        """Remember the server's id for the BRPOP connection (once per socket), so that closing
        can end a BRPOP in flight at once with CLIENT UNBLOCK instead of waiting it out."""
        connection = self.client.connection
        sock = internals.socket_of(connection)
        if sock is None or self._client_id_sock is sock:
            return
        try:
            connection.send_command("CLIENT", "ID")
            self._client_id = int(connection.read_response())
            self._client_id_sock = sock
        except self.ResponseError:  # a server without CLIENT ID (Redis < 5): wait it out on close
            self._client_id = None
            self._client_id_sock = sock

    def _room(self) -> int:
        if self._finishing:  # the consumer goes: a fetch now only records what BRPOP took
            return 0
        estimate = self.qos.can_consume_max_estimate()
        return int(self.fetch_limit if estimate is None else min(estimate, self.fetch_limit))

    def _ensure_script(self) -> bool:
        if not self._script_loaded:
            try:
                with self.conn_or_acquire() as client:
                    client.script_load(FETCH)
            except self.ResponseError as exc:
                # A server without scripting (or refusing it): kombu's BRPOP path still works.
                logger.warning("Redis refused the fetch script (%s); using one BRPOP per message", exc)
                self._batching = False
                return False
            self._script_loaded = True
        return True

    def _fetch_command(self, queues: list[str], want: int, acks: list[str],
                       booked: list[Booking]) -> list[Any]:
        prefix = self.global_keyprefix
        # kombu's BRPOP order: priority step major, queue minor
        lists = [priority_lists(queue, self.priority_steps, self.sep) for queue in queues]
        keys = [prefix + each[step] for step in range(len(self.priority_steps)) for each in lists]
        rotate = isinstance(internals.queue_cycle(self), round_robin_cycle)
        return ["EVALSHA", FETCH_SHA, len(keys) + 2, prefix + self.unacked_key,
                prefix + self.unacked_index_key, *keys, want, len(queues), int(rotate),
                len(acks), *acks, len(booked), *(part for booking in booked for part in booking)]

    def recording(self, delivery_tag: str) -> bool:
        """Whether the unacked record of this delivered message is still on its way to Redis."""
        fetch = self._fetch
        return fetch is not None and delivery_tag in fetch.booked_tags

    def requeue_copy(self, message: Any) -> None:
        """Put a copy of ``message`` back at the end of its queue, as kombu's requeue does."""
        info = message.delivery_info
        with self.conn_or_acquire() as client, client.pipeline() as pipe:
            internals.restore_message(self, loads(dumps(internals.envelope_of(message))), info["exchange"],
                                      info["routing_key"], pipe, leftmost=True)
            pipe.execute()

    def _send_fetch(self, queues: list[str], want: int, booked: list[Booking]) -> None:
        acks = self.acks.take()
        connection = self.client.connection
        self._fetch = _Fetch(queues, want, acks, booked)
        internals.set_waiting(self, connection, monotonic())
        try:
            connection.send_command(*self._fetch_command(queues, want, acks, booked))
        except BaseException:
            self._fetch = None
            internals.set_waiting(self, None)
            self.acks.put_back(acks)
            raise

    def read_reply(self, **options: Any) -> bool:
        """Read the reply awaited: the fetch script's, or BRPOP's (kombu's ``_brpop_read``)."""
        if self._fetch is None:
            return self._read_brpop(**options)
        return self._read_fetch()

    def _read_fetch(self) -> bool:
        fetch, self._fetch = self._fetch, None
        assert fetch is not None
        try:
            reply = self.client.parse_response(self.client.connection, "EVALSHA")
        except NoScriptError:
            # The server lost its script cache (restart, SCRIPT FLUSH): nothing ran.
            self._script_loaded = False
            self.acks.put_back(fetch.acks)
            self._record_now(fetch.booked)
            raise Empty() from None
        except Exception as exc:
            self.acks.put_back(fetch.acks)
            reason = refusal(exc)
            if reason is None:
                if isinstance(exc, self.connection_errors):
                    # Whether the script ran is unknown: the acks are written again (idempotent),
                    # and messages it may have taken are in ``unacked``, restored after the
                    # visibility timeout.
                    self.client.connection.disconnect()
                raise
            # Redis refused the script before it changed anything (see FETCH): all of it again,
            # once Redis takes writes.
            self._rebook = fetch.booked + self._rebook
            self.leases.refused(reason)
            raise Empty() from None
        except BaseException:
            self.acks.put_back(fetch.acks)
            raise
        finally:
            internals.set_waiting(self, None)
            internals.flush_reauth(self)
        score = bytes_to_str(reply[0])
        if fetch.booked:
            self.leases.recorded(fetch.booked_tags, score)
        taken = self._accept(reply, fetch, score)
        self._maybe_ready = taken >= fetch.want
        if not self._undelivered:
            raise Empty()
        self._deliver_fetched()
        return True

    def _accept(self, reply: list[Any], fetch: _Fetch, score: str) -> int:
        """Queue the fetched messages for delivery, mirroring the script's round-robin turns."""
        queues, nqueues = fetch.queues, len(fetch.queues)
        rotate = internals.queue_cycle(self).rotate
        for position in range(1, len(reply), 3):
            index, tag = int(reply[position]), bytes_to_str(reply[position + 1])
            raw = bytes_to_str(reply[position + 2])
            queue = queues[(abs(index) - 1) % nqueues]
            rotate(queue)
            if index > 0:  # recorded as unacked under the tag the script read
                payload = _read(raw, queue, tag)
                if isinstance(payload, Unreadable) or payload["properties"]["delivery_tag"] == tag:
                    self._undelivered.append((queue, payload, tag, score))
                    continue
                # The script read another tag than the one the envelope's properties carry (it
                # reads the tag kombu writes last, from the end): the record moves to the tag
                # the consumer will acknowledge, as the message is delivered.
                self.acks.add(tag)
                self._undelivered.append((queue, payload, None, score))
                continue
            # The script found no tag, and recorded nothing: nothing can acknowledge it.
            payload = _read(raw, queue, None)
            reason = payload.reason if isinstance(payload, Unreadable) else (
                "Redis could not read its delivery tag, so it was not recorded as unacknowledged")
            self._undelivered.append((queue, Unreadable(reason, fresh_tag(), queue), None, score))
        return len(reply) // 3

    def _deliver_fetched(self) -> None:
        deliver = internals.deliverer(self)
        qos = self.qos
        pending = self._undelivered
        while pending and not self.closing:
            queue, payload, recorded, score = pending.popleft()
            unreadable = isinstance(payload, Unreadable)
            qos.prebooked = payload.delivery_tag if unreadable else recorded
            # (an unreadable message is never recorded: the consumer rejects it at once)
            qos.prebooked_score = None if unreadable else score
            try:
                deliver(payload, queue)
            except BaseException:
                qos.prebooked = None
                qos.prebooked_score = None
                self._restore_undelivered()
                raise
        qos.prebooked = None
        qos.prebooked_score = None

    def _restore_undelivered(self) -> None:
        """Put back, first in line, the fetched messages a failing consumer callback left."""
        pending = self._undelivered
        while pending:
            _, payload, recorded, _score = pending.pop()  # the last taken goes back first: order is kept
            if isinstance(payload, Unreadable):
                self._drop_unreadable(payload)
                continue
            try:
                self.qos.restore_by_tag(recorded)
            except Exception as exc:
                logger.error("Could not restore message %s (%r); it comes back after the visibility "
                             "timeout (%ss)", recorded, exc, self.visibility_timeout)

    def _drop_unreadable(self, unreadable: Unreadable) -> None:
        """Reject an unreadable message the consumer will not see (the channel is closing, or a
        callback failed): restored, it would come back as the same unreadable message."""
        logger.error("Rejected message delivery %s from queue %s: %s", unreadable.delivery_tag,
                     unreadable.queue, unreadable.reason)
        self.acks.add(unreadable.delivery_tag)

    def _read_ack_reply(self) -> bool:
        """Read the reply of the acknowledgements sent before the BRPOP; False if the BRPOP's
        own reply has not arrived yet (the channel keeps waiting for it)."""
        acks, self._ack_reply = self._ack_reply, None
        assert acks is not None
        connection = self.client.connection
        try:
            self.client.parse_response(connection, "EVALSHA")
        except NoScriptError:
            self._script_loaded = False
            self.acks.put_back(acks)
        except Exception as exc:
            self.acks.put_back(acks)
            reason = refusal(exc)
            if reason is not None:
                self.leases.refused(reason)  # (the BRPOP behind it is read as usual)
                return bool(connection.can_read(timeout=0))
            if isinstance(exc, self.connection_errors):
                internals.set_waiting(self, None)
                connection.disconnect()
            raise
        except BaseException:
            self.acks.put_back(acks)
            raise
        return bool(connection.can_read(timeout=0))

    def _read_brpop(self, **options: Any) -> bool:
        if self._ack_reply is not None and not self._read_ack_reply():
            raise Empty()
        try:
            try:
                reply = self.client.parse_response(self.client.connection, "BRPOP", **options)
            except Exception as exc:
                reason = refusal(exc)
                if reason is not None:  # nothing was taken: try again once Redis takes writes
                    self.leases.refused(reason)
                    raise Empty() from None
                if isinstance(exc, self.connection_errors):
                    self.client.connection.disconnect()
                raise
        finally:
            internals.set_waiting(self, None)
            internals.flush_reauth(self)
        if not reply:
            raise Empty()
        key, item = bytes_to_str(reply[0]), reply[1]
        if self.closing:
            # Not recorded yet and nobody will process it: back where it was, untouched.
            with self.conn_or_acquire() as client:
                client.rpush(key, item)
            return False
        queue = key.rsplit(self.sep, 1)[0]
        internals.queue_cycle(self).rotate(queue)
        self._maybe_ready = True
        payload = _read(bytes_to_str(item), queue, None)
        if isinstance(payload, Unreadable):
            # Nothing records it (no fetch books it): the consumer rejects it, and that is all.
            self.qos.prebooked = payload.delivery_tag
        elif self._batching and self._script_loaded:
            # Record it (and look for more) with a fetch sent now, before delivering: the record
            # reaches Redis as soon as kombu's would, without a round trip before the delivery.
            queues = list(internals.queue_cycle(self).consume(len(self.active_queues))) or [queue]
            booking = _booking(payload, item)
            self._send_fetch(queues, max(self._room() - 1, 0), [booking])
            self.qos.prebooked = booking[0]  # (its score comes with the fetch's reply)
        try:
            internals.deliverer(self)(payload, queue)
        finally:
            self.qos.prebooked = None
        return True

    def _record_now(self, booked: list[Booking]) -> None:
        """Record in ``unacked``, as kombu does, messages whose recording fetch did not run."""
        if not booked:
            return
        prefix = self.global_keyprefix
        entries = [part for tag, exchange, routing_key, item in booked
                   for part in (tag, f"[{bytes_to_str(item)}, {exchange}, {routing_key}]")]
        with self.conn_or_acquire() as client:
            score = run(client, RECORD, [prefix + self.unacked_key, prefix + self.unacked_index_key], entries)
        self.leases.recorded((booking[0] for booking in booked), bytes_to_str(score))

    # -- closing ---------------------------------------------------------------------------------

    def before_restore(self) -> None:
        """Called by the QoS just before it restores unacknowledged messages (on close): the
        fetched ones not handed to the consumer are restored with them."""
        while self._undelivered:
            _, payload, _recorded, _score = self._undelivered.popleft()
            if isinstance(payload, Unreadable):
                self._drop_unreadable(payload)
            else:
                self.qos.track(self.Message(payload, channel=self))
        super().before_restore()

    def basic_cancel(self, consumer_tag: str) -> Any:
        """kombu's cancel, once the reply in flight is read: what it took reaches the consumer
        still there (a stopping worker gives it back with the rest of what it holds, instead of
        kombu requeueing it message by message after the cancel), and no BRPOP left waiting
        takes a message the worker gives back. Inside kombu's read, kombu defers the cancel."""
        if internals.waiting(self) and not internals.in_protected_read(self):
            self._finish_read("cancelling the consumer")
        return super().basic_cancel(consumer_tag)

    def before_close(self) -> None:
        if internals.waiting(self):
            # A reply in flight may hold messages already recorded as unacked: read it, so
            # they are restored now rather than after the visibility timeout.
            self._finish_read("closing")

    def _finish_read(self, why: str) -> None:
        """Read the reply in flight now, fetching nothing more; a BRPOP is told to return now
        (with its message, if it just took one)."""
        self._unblock()
        self._finishing = True
        try:
            while internals.waiting(self):  # the acks' reply may come before the BRPOP's
                try:
                    self.read_reply()
                except Empty:
                    pass
                except Exception as exc:
                    logger.debug("lost the reply in flight while %s: %r", why, exc)
                    break
        finally:
            self._finishing = False

    def _unblock(self) -> None:
        connection = internals.waiting(self)
        if self._fetch is not None or self._client_id is None or connection is None:
            return
        if internals.socket_of(connection) is not self._client_id_sock:
            return
        try:
            with self.conn_or_acquire() as client:
                client.client_unblock(self._client_id)
        except Exception as exc:  # the BRPOP then ends by itself within brpop_timeout
            logger.debug("could not unblock the BRPOP connection: %r", exc)


class SentinelChannel(Channel, redis.SentinelChannel):  # type: ignore[misc]
    """The batched channel, finding the master through Redis Sentinel."""

    from_transport_options = (*redis.SentinelChannel.from_transport_options, "fetch_limit")


def _booking(payload: Any, item: bytes) -> Booking:
    """How the fetch script records a payload BRPOP took: under the tag the consumer will
    acknowledge, with its exchange and routing key, as kombu's ``unacked`` entries hold them."""
    properties = payload["properties"]
    info = properties.get("delivery_info")
    info = info if isinstance(info, dict) else {}
    return properties["delivery_tag"], dumps(info.get("exchange")), dumps(info.get("routing_key")), item


def _read(raw: str, queue: str, recorded: str | None) -> Any:
    """The envelope of a message taken from ``queue`` (its JSON text), or an :class:`Unreadable`
    saying why it is none: anything wrong reaches the consumer as a message to reject, never as
    an exception. ``recorded`` is the tag Redis holds it under (None: nothing holds it yet)."""
    try:
        payload = loads(raw)
    except Exception as exc:  # not JSON, nested too deeply, a kombu type tag it cannot read
        return Unreadable(not_json(raw, exc), fresh_tag() if recorded is None else recorded, queue)
    problem = envelope_problem(payload) or tag_problem(payload)
    if problem is not None:
        return Unreadable(problem, fresh_tag() if recorded is None else recorded, queue)
    return payload

