"""Leases on RabbitMQ: a lease is the one message of a single-active-consumer quorum queue,
held unacknowledged by its holder.

RabbitMQ has no keys with deadlines, but it has two things that make a lease:
``x-single-active-consumer`` delivers a queue's messages to one consumer at a time and hands
them to the next consumer when that one's channel goes, and a message held unacknowledged goes
back to the queue when its holder's connection does. So the queue ``worker.lease.<name>`` holds
one message, ``{"token", "holder", "records", "sent"}``; whoever RabbitMQ delivers it to holds
the lease, and takes it by publishing the next state (token + 1) and acknowledging the one it
got, in one AMQP transaction. Every send under the lease is a transaction too: the task, the next
state (the key and the record added) and the acknowledgement commit together or not at all, on
the holder's own channel. An old holder cannot commit once RabbitMQ has closed its connection,
and RabbitMQ gives the message to another only after closing it: there is no moment when two
holders can write.

**The bound.** The lease lasts as long as the holder's connection does: a killed holder's socket
closes at once (the takeover takes one delivery); a paused or cut-off holder is dropped when its
heartbeats stop, after two missed heartbeats, and its connection heartbeats every ``ttl // 2``
seconds (at least 1, RabbitMQ's unit): the lease is free within about ``ttl`` seconds of the
holder's last sign of life (:data:`bound` adds one second for RabbitMQ's check).

**The first message.** The queue starts empty: a process holding the exclusive queue
``worker.lease.<name>.init`` (one process at a time) publishes the first state when the lease
queue has neither a message nor a consumer (while it has a consumer, the message may be held).
A lease queue emptied by hand while schedulers consume it stays empty: delete the queue and
restart them.

Quorum queues (RabbitMQ 3.8 or later) replicate the lease across a cluster's nodes.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from kombu.connection import Connection
from kombu.messaging import Producer
from kombu.transport import pyamqp as _pyamqp

from worker_core.election import check_lease
from worker_core.exceptions import ConfigurationError, LeaseLost
from worker_core.slots import LeaseState

from .kombu_transport import SSLTransport, Transport

if TYPE_CHECKING:
    from worker_core.slots import Lease, SendsOnce

__all__ = ["AmqpLease"]

# kombu is not annotated: its module is typed as Any here, once.
pyamqp: Any = _pyamqp

#: AMQP reply codes: an exclusive queue another connection holds; a queue that does not exist
RESOURCE_LOCKED = 405
NOT_FOUND = 404
#: seconds RabbitMQ's heartbeat check may take beyond two missed heartbeats
CHECK_MARGIN = 1.0


class LeaseChannel(pyamqp.Channel):  # type: ignore[misc]
    """kombu's py-amqp channel, counting what is published while a message is sent once, and
    declaring queues and exchanges on a channel beside it: RabbitMQ closes the channel that asked
    for a declaration it refuses (a queue that exists with other arguments), and this one holds
    the lease's message."""

    publishes: int | None = None
    #: set on the lease's own channel: its declarations go to the channel beside it
    declares_beside = False
    _beside: Any = None

    def basic_publish(self, *args: Any, **kwargs: Any) -> Any:
        if self.publishes is not None:
            self.publishes += 1
        return super().basic_publish(*args, **kwargs)

    def _side(self) -> Any:
        beside = self._beside
        if beside is None or not beside.is_open:
            beside = self._beside = self.connection.channel()
        return beside

    def queue_declare(self, *args: Any, **kwargs: Any) -> Any:
        if not self.declares_beside:
            return super().queue_declare(*args, **kwargs)
        return self._side().queue_declare(*args, **kwargs)

    def exchange_declare(self, *args: Any, **kwargs: Any) -> Any:
        if not self.declares_beside:
            return super().exchange_declare(*args, **kwargs)
        return self._side().exchange_declare(*args, **kwargs)

    def queue_bind(self, *args: Any, **kwargs: Any) -> Any:
        if not self.declares_beside:
            return super().queue_bind(*args, **kwargs)
        return self._side().queue_bind(*args, **kwargs)


class LeaseConnection(pyamqp.Connection):  # type: ignore[misc]
    Channel = LeaseChannel


class LeaseTransport(Transport):
    """The plugin's py-amqp transport without its fast paths (a lease reads a message a term)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.Connection = LeaseConnection
        self._reads_all = self._batches_acks = False


class LeaseSSLTransport(SSLTransport):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.Connection = LeaseConnection
        self._reads_all = self._batches_acks = False


def _state_message(channel: Any, state: Mapping[str, Any]) -> Any:
    return channel.prepare_message(json.dumps(state).encode(), content_type="application/json",
                                   content_encoding="utf-8", properties={"delivery_mode": 2})


class AmqpLease:
    """A :class:`~worker_core.slots.Lease` (and :class:`~worker_core.slots.SendsOnce`) on
    RabbitMQ."""

    def __init__(self, url: str, tls: bool, options: Mapping[str, Any], name: str, holder: str,
                 ttl: float) -> None:
        check_lease(name, ttl)
        if ttl < 2:
            raise ConfigurationError(f"a lease on RabbitMQ lasts 2 seconds or more (got ttl={ttl!r}): "
                                     f"it follows its connection's heartbeats, whose unit is a second")
        self.name = name
        self.holder = f"{holder}#{secrets.token_hex(3)}"
        self.ttl = float(ttl)
        self.heartbeat = max(1, int(ttl // 2))
        self.queue = f"worker.lease.{name}"
        self._url = url
        self._transport = LeaseSSLTransport if tls else LeaseTransport
        self._options = {**options, "heartbeat": self.heartbeat}
        self._connection: Any = None
        self._channel: Any = None
        self._consuming = False
        self._arrived: list[Any] = []
        self._in_hand: Any = None  # the state message this holder holds, unacknowledged
        self._state: dict[str, Any] | None = None
        self._token: int | None = None

    def __repr__(self) -> str:
        return f"<AmqpLease {self.name!r} {self.holder}>"

    @property
    def bound(self) -> float:
        return 2 * self.heartbeat + CHECK_MARGIN

    @property
    def token(self) -> int | None:
        return self._token

    # -- the connection --------------------------------------------------------------------------

    def _connect(self) -> Any:
        if self._connection is None:
            connection = Connection(self._url, transport=self._transport, **self._options)
            connection.connect()
            self._connection = connection
            channel = connection.channel()
            channel.basic_qos(0, 1, False)
            channel.tx_select()
            channel.queue_declare(self.queue, durable=True, auto_delete=False,
                                  arguments={"x-queue-type": "quorum", "x-single-active-consumer": True})
            channel.declares_beside = True
            self._channel = channel
        return self._connection

    def _drop(self) -> None:
        """Forget the connection (and with it the lease: RabbitMQ gives the message back)."""
        connection, self._connection, self._channel = self._connection, None, None
        self._consuming, self._arrived, self._in_hand, self._state, self._token = False, [], None, None, None
        if connection is not None:
            try:
                connection.release()
            except Exception:  # a connection the broker or the network closed already
                pass

    def _pump(self, timeout: float) -> None:
        """Read what arrives for up to ``timeout`` seconds (at least once), heartbeating."""
        connection = self._connection
        deadline = time.monotonic() + timeout
        while True:
            connection.heartbeat_check(rate=4)
            try:
                left = deadline - time.monotonic()
                connection.drain_events(timeout=max(0.0, min(left, self.heartbeat / 4)))
            except TimeoutError:
                pass
            if self._arrived or time.monotonic() >= deadline:
                return

    def _initialize(self) -> None:
        """Publish the first state if the queue has neither a message nor a consumer, holding the
        exclusive ``.init`` queue meanwhile (see the module's docstring)."""
        channel = self._connection.channel()
        try:
            try:
                channel.queue_declare(f"{self.queue}.init", exclusive=True, auto_delete=True)
            except self._connection.channel_errors as exc:
                if getattr(exc, "reply_code", None) == RESOURCE_LOCKED:
                    return  # another process is initializing it
                raise
            found = channel.queue_declare(self.queue, passive=True)
            if found.message_count == 0 and found.consumer_count == 0:
                first = {"token": 0, "holder": "", "records": {}, "sent": {}}
                channel.basic_publish(_state_message(channel, first), exchange="", routing_key=self.queue)
            channel.queue_delete(f"{self.queue}.init")
        finally:
            try:
                channel.close()
            except Exception:  # closed by a refusal
                pass

    def _commit_state(self, state: dict[str, Any]) -> None:
        """Publish ``state`` and acknowledge the message in hand, then commit (the caller's
        publishes on the channel commit with them)."""
        channel = self._channel
        channel.basic_publish(_state_message(channel, state), exchange="", routing_key=self.queue)
        channel.basic_ack(self._in_hand.delivery_tag)
        channel.tx_commit()
        self._in_hand = None

    def _take_back(self, token: int) -> None:
        """Wait for the state just committed (``token``) to come back to this holder; stale
        copies that come first (there should be none) are dropped."""
        deadline = time.monotonic() + self.ttl
        while self._in_hand is None:
            left = deadline - time.monotonic()
            if left <= 0:
                self._drop()
                raise LeaseLost(f"the lease {self.name!r}: its state did not come back to {self.holder}")
            self._pump(left)
            while self._arrived:
                message = self._arrived.pop(0)
                state = json.loads(message.body)
                if int(state["token"]) == token:
                    self._in_hand, self._state = message, state
                else:
                    self._channel.basic_ack(message.delivery_tag)
                    self._channel.tx_commit()

    # -- the lease -------------------------------------------------------------------------------

    def acquire(self, wait: float = 0.0) -> int | None:
        if self._token is not None:
            return self._token if self.renew() else None
        try:
            self._connect()
            if not self._consuming:
                self._initialize()
                self._channel.basic_consume(self.queue, callback=self._arrived.append)
                self._consuming = True
            self._pump(wait)
            if not self._arrived:
                return None
            message = self._arrived.pop(0)
            self._in_hand = message
            state = json.loads(message.body)
            token = max(int(state.get("token", 0)), 0) + 1
            taken = {**state, "token": token, "holder": self.holder}
            self._commit_state(taken)
            self._take_back(token)
        except LeaseLost:
            return None
        except Exception:
            self._drop()
            raise
        self._token = token
        return token

    def renew(self) -> bool:
        if self._token is None:
            return False
        try:
            self._pump(0.0)
        except Exception:
            self._drop()  # the connection is gone, and the lease with it
            return False
        return self._in_hand is not None

    def release(self) -> None:
        if self._token is not None:
            self._drop()  # the message goes back, to the next consumer at once

    def current(self) -> LeaseState | None:
        if self._token is not None:
            return LeaseState(self.holder, self._token)
        channel = self._connect().channel()
        try:
            found = channel.queue_declare(self.queue, passive=True)
        finally:
            channel.close()
        if found.message_count == 0 and found.consumer_count > 0:
            return LeaseState(None)  # held by a consumer, which RabbitMQ does not name
        return None

    def close(self) -> None:
        self._drop()

    # -- sending once ----------------------------------------------------------------------------

    def send_once(self, key: str, publish: Callable[[Any], None], *, record: tuple[str, str] | None = None,
                  keep: float) -> bool:
        state = self._state
        if self._token is None or state is None or self._in_hand is None:
            raise LeaseLost(f"the lease {self.name!r} is not held by {self.holder}; nothing was sent")
        now = time.time()
        sent = {name: until for name, until in state.get("sent", {}).items() if until > now}
        if key in sent:
            return False
        channel = self._channel
        channel.publishes = 0
        try:
            try:
                publish(Producer(channel))
            except BaseException:
                channel.tx_rollback()  # what the publish did not finish is not sent (the lease stays)
                raise
            count = channel.publishes
            if count != 1:
                channel.tx_rollback()
                raise ValueError(f"send_once({key!r}) sends one message; the publish sent {count}")
            records = dict(state.get("records", {}))
            if record is not None:
                records[record[0]] = record[1]
            self._commit_state({**state, "records": records, "sent": {**sent, key: now + keep}})
            self._take_back(self._token)
        except (ValueError, TypeError, LeaseLost):
            raise
        except Exception as exc:
            self._drop()
            raise LeaseLost(f"the lease {self.name!r} was lost by {self.holder} while sending {key!r} "
                            f"({type(exc).__name__}: {exc}); the lease's records say whether it was "
                            f"sent") from exc
        finally:
            channel.publishes = None
        return True

    def records(self) -> dict[str, str] | None:
        if self._state is None:
            return None
        return dict(self._state.get("records", {}))

    def write_records(self, changes: Mapping[str, str | None]) -> None:
        state = self._state
        if self._token is None or state is None or self._in_hand is None:
            raise LeaseLost(f"the lease {self.name!r} is not held by {self.holder}; nothing was written")
        records = dict(state.get("records", {}))
        for field, value in changes.items():
            if value is None:
                records.pop(field, None)
            else:
                records[field] = value
        try:
            self._commit_state({**state, "records": records})
            self._take_back(self._token)
        except LeaseLost:
            raise
        except Exception as exc:
            self._drop()
            raise LeaseLost(f"the lease {self.name!r} was lost by {self.holder} while writing records "
                            f"({type(exc).__name__}: {exc})") from exc


if TYPE_CHECKING:
    _LEASE: type[Lease] = AmqpLease
    _ONCE: type[SendsOnce] = AmqpLease
