"""The kombu transport handed to ``kombu.Connection(transport=...)``, and the one a Celery client or
Celery worker loads (``broker_transport = "worker_transport_redis_cluster.kombu_transport:Transport"``):
a redis-py cluster client, the subscriptions that wake its consumers, and the fetch loop.

**Waking.** Publishing into an empty list of a queue publishes on the queue's wake channel (in the
queue's slot: sharded pub/sub reaches the consumers subscribed on that primary only). A consuming
transport subscribes to the wake channel of every queue it consumes and marks the queue woken; the
next turn of the loop fetches from every marked queue with room in the prefetch window, round
robin, as many messages as there is room for (at most ``fetch_limit``) in one script each. A queue
stays marked until a fetch with room comes back short, so nothing published while the window was
full is missed; every ``polling_interval`` seconds every queue is marked anyway, for a wake lost
with a connection or a failover.

**Maintenance**, every ``polling_interval``: the messages of the consumed queues whose lease lapsed
go back to their queues (a worker that died), and the subscriptions follow the slot map.

**Topology changes.** A queue whose primary cannot be reached (failing over, down, migrating) is
looked at again after a growing pause while the others go on; a node refusing work (out of
memory, too few replicas) is treated alike. Only a cluster of which no node answers is a lost
connection (the worker reconnects).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import attrs
from kombu.transport import virtual as _virtual
from redis import exceptions as redis_errors

from worker_core.exceptions import BrokerStorageError
from worker_core.protocol.fastjson import loads
from worker_core.redaction import redact_url

from .channel import Channel as ClusterChannel
from .cluster import NodeUnavailable, Refused, Router, connect
from .keys import exchange_fanout
from .location import Location, location_of
from .options import BrokerConfig, check_broker
from .scripts import ACK, RECLAIM, RENEW

__all__ = ["CONFIG", "Transport"]

logger = logging.getLogger(__name__)

virtual: Any = _virtual

#: the transport option under which the worker hands over the checked configuration
CONFIG = "redis_cluster_config"
#: the most lapsed leases one reclaim script gives back
RECLAIM_LIMIT = 1000
#: the longest pause before a failing queue is looked at again
MAX_BACKOFF = 5.0


@attrs.define
class _Failing:
    """A queue that cannot be fetched from now, and when to try again."""

    since: float
    retry_at: float
    delay: float
    reason: str
    refused: bool


def _describe(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, (NodeUnavailable, Refused)) else f"{type(exc).__name__}: {exc}"


class _Renewer:
    """Renews leases on a cluster client of its own (made in the renewing thread when first used)."""

    def __init__(self, config: BrokerConfig, owner: str) -> None:
        self.config = config
        self.owner = owner
        self._router: Router | None = None

    def __call__(self, physical: str, tags: list[str]) -> list[str]:
        from .keys import QueueKeys

        if self._router is None:
            self._router = Router(connect(self.config.seeds, self.config.connection))
        router = self._router
        keys = QueueKeys(physical, self.config.key_prefix, self.config.priority_steps)
        lease = round(self.config.visibility_timeout * 1000)
        lost = router.run(
            keys.slot,
            [router.script(RENEW, [keys.leases], [self.owner, lease, *tags])],
            write=False,
            retry=True,
        ).replies[0]
        return [tag.decode() if isinstance(tag, bytes) else str(tag) for tag in lost or ()]


#: whether each cluster (by its seeds) has sharded pub/sub, as first asked in this process
_sharded_pubsub: dict[tuple[tuple[str, int], ...], bool] = {}


class Transport(virtual.Transport):  # type: ignore[misc]
    """kombu's virtual transport on a Redis Cluster (see the module docstring)."""

    Channel = ClusterChannel
    default_port = 6379
    driver_type = "redis"  # what Celery asks: its monitoring events go to a fanout exchange then
    driver_name = "redis-cluster"
    #: the URL lists several nodes: kombu hands it over whole instead of parsing it
    can_parse_url = True
    connection_errors = (
        *virtual.Transport.connection_errors,
        redis_errors.ConnectionError,
        redis_errors.TimeoutError,
        BrokerStorageError,
    )
    channel_errors = (*virtual.Transport.channel_errors, redis_errors.ResponseError, redis_errors.DataError)
    implements = virtual.Transport.implements.extend(
        asynchronous=True, exchange_type=frozenset({"direct", "topic", "fanout"}), heartbeats=False
    )

    def __init__(self, client: Any, **kwargs: Any) -> None:
        options = dict(client.transport_options)
        config = options.pop(CONFIG, None)
        if config is None:  # a Celery client or worker: the configuration is checked here
            config = check_broker(str(client.hostname), options, client.ssl or None)
        self.config: BrokerConfig = config
        self.location: Location = location_of((config.seeds, config.key_prefix), config.visibility_timeout)
        super().__init__(client, **kwargs)
        self.polling_interval = config.polling_interval
        self._router: Router | None = None
        self._subscriber: Any = None
        #: set once the connection was lost (``Connection.collect``): nothing is written any more
        self.lost = False
        #: physical queue -> the (channel, queue) consuming it
        self._consumed: dict[str, list[tuple[ClusterChannel, str]]] = {}
        self._wakes: dict[str, str] = {}
        self._fanouts: dict[str, list[tuple[ClusterChannel, str]]] = {}
        self._marked: set[str] = set()
        self._failing: dict[str, _Failing] = {}
        self._poll_at = 0.0
        self._turn = 0
        self._handed = 0
        self._hub: Any = None
        self._hub_fds: dict[int, str] = {}
        #: the worker's broker status, when it watches this connection's refusals
        self.broker_status: Any = None
        self._refusing = False

    def driver_version(self) -> str:
        import redis

        return str(redis.__version__)

    def as_uri(self, uri: str, include_password: bool = False, mask: str = "**") -> str:
        return uri if include_password else redact_url(uri)

    # -- connections ----------------------------------------------------------------------------

    @property
    def router(self) -> Router:
        router = self._router
        if router is None:
            if self.lost:
                raise redis_errors.ConnectionError(
                    "this Redis Cluster connection was lost; the worker reconnects on a new one"
                )
            config = self.config
            router = self._router = Router(
                connect(config.seeds, config.connection), config.wait_for_replicas, config.wait_timeout
            )
            self.location.start_renewing(_Renewer(config, self.location.owner))
        return router

    @property
    def wake_kind(self) -> str:
        """``s`` (SPUBLISH) where the cluster has sharded pub/sub, else ``p`` (PUBLISH)."""
        config = self.config
        if config.sharded_pubsub is not None:
            return "s" if config.sharded_pubsub else "p"
        found = _sharded_pubsub.get(config.seeds)
        if found is None:
            router = self.router
            node = router.client.get_redis_connection(router.client.get_default_node())
            try:  # a MOVED answer says the command exists as well as a count of receivers does
                node.execute_command("SPUBLISH", f"{config.key_prefix}{{worker}}:probe", "")
                found = True
            except redis_errors.MovedError:
                found = True
            except redis_errors.ResponseError:  # unknown command: Redis before 7
                found = False
            _sharded_pubsub[config.seeds] = found
        return "s" if found else "p"

    def establish_connection(self) -> Any:
        self.router  # noqa: B018 (connects: raises when no node answers)
        return super().establish_connection()

    def close_connection(self, connection: Any) -> None:
        try:
            super().close_connection(connection)
        finally:
            self._close_sockets()

    def _close_sockets(self) -> None:
        subscriber, self._subscriber = self._subscriber, None
        if subscriber is not None:
            try:
                subscriber.close()
            except Exception as exc:
                logger.debug("error while closing the subscriptions: %r", exc)
        for fd in list(self._hub_fds):
            self._forget_reader(fd)
        router, self._router = self._router, None
        if router is not None:
            router.close()

    def _collect(self, connection: Any) -> None:
        """kombu's ``Connection.collect`` (the worker's lost connection): close the channels
        without giving back the messages the worker holds. It keeps them, acknowledges them
        through its next connection, and their leases are renewed meanwhile; given back now, they
        would run twice."""
        self.lost = True
        for channel in list(self.channels):
            if channel._qos is not None:
                channel._qos.kept = True
            try:
                channel.close()
            except Exception as exc:
                logger.debug("error while closing a channel of the lost Redis Cluster connection: %r", exc)
        self._close_sockets()

    # -- what is consumed -----------------------------------------------------------------------

    @property
    def consuming(self) -> bool:
        return bool(self._consumed or self._fanouts)

    def consuming_changed(self) -> None:
        consumed: dict[str, list[tuple[ClusterChannel, str]]] = {}
        wakes: dict[str, str] = {}
        fanouts: dict[str, list[tuple[ClusterChannel, str]]] = {}
        for channel in self.channels:
            if channel.closed:
                continue
            for queue in channel._active_queues:
                exchange = channel.fanout_queues.get(queue)
                if exchange is not None:
                    fanouts.setdefault(exchange_fanout(self.config.key_prefix, exchange), []).append(
                        (channel, queue)
                    )
                    continue
                for physical in channel.physical(queue):
                    consumed.setdefault(physical, []).append((channel, queue))
                    wakes[channel.keys(physical).wake] = physical
        self._consumed, self._wakes, self._fanouts = consumed, wakes, fanouts
        self._marked = set(consumed)
        if self.consuming:
            self._ensure_subscriber().set_channels([*wakes, *fanouts])
        elif self._subscriber is not None:
            self._subscriber.set_channels(())

    def _ensure_subscriber(self) -> Any:
        if self._subscriber is None:
            from .subscriber import Subscriber

            self._subscriber = Subscriber(self.router, self.wake_kind == "s", self._on_event)
        return self._subscriber

    def _on_event(self, kind: str, channel: str, data: bytes) -> None:
        physical = self._wakes.get(channel)
        if physical is not None:
            self._marked.add(physical)
            return
        consumers = self._fanouts.get(channel)
        if kind != "message" or not consumers:
            return
        for _, queue in consumers:
            try:
                payload = loads(data.decode() if isinstance(data, bytes) else data)
            except Exception as exc:
                logger.warning(
                    "Ignored a message on fanout channel %s that is not a JSON envelope: %r", channel, exc
                )
                return
            self._handed += 1
            self._deliver(payload, queue)

    # -- the loop -------------------------------------------------------------------------------

    def pump(self) -> bool:
        """One turn: follow the slot map when the subscriptions went stale, look at every queue
        and give back lapsed leases when due, fetch from the marked queues as the prefetch windows
        allow and deliver, then write the acknowledgements no fetch carried. Whether anything was
        delivered."""
        if self.lost:
            return False
        now = time.monotonic()
        subscriber = self._subscriber
        if now >= self._poll_at:
            self._poll_at = now + self.polling_interval
            self._marked.update(self._consumed)
            self.reclaim()
            if subscriber is not None:
                subscriber.stale = True
        if subscriber is not None and subscriber.due and self.consuming:
            subscriber.reconcile()
            self._update_readers()
        delivered = self._fetch() if self._marked else False
        if self.location.unwritten:
            self.flush_acks()
        return delivered

    def _fetch(self) -> bool:
        delivered = False
        order = list(self._consumed)
        if not order:
            return False
        self._turn = (self._turn + 1) % len(order)
        now = time.monotonic()
        for physical in order[self._turn :] + order[: self._turn]:
            if physical not in self._marked:
                continue
            failing = self._failing.get(physical)
            if failing is not None and now < failing.retry_at:
                continue
            for channel, queue in self._consumed.get(physical, ()):
                if channel.closed:
                    continue
                room = self._room(channel)
                if room <= 0:
                    continue
                acks = self.location.take_acks(physical).get(physical, [])
                try:
                    fetched = channel.fetch(queue, physical, room, acks)
                except (NodeUnavailable, Refused) as exc:
                    self._failed(physical, exc)
                    break
                self._recovered(physical)
                self._accepted()
                if len(fetched) < room:
                    self._marked.discard(physical)
                if fetched:
                    channel.deliver(queue, fetched)
                    delivered = True
                break
        return delivered

    def _room(self, channel: ClusterChannel) -> int:
        limit = self.config.fetch_limit
        estimate = channel.qos.can_consume_max_estimate()
        return limit if estimate is None else min(int(estimate), limit)

    def watch(self, status: Any) -> None:
        """Tell ``status`` (the worker's :class:`~worker_core.slots.BrokerStatus`) when a node starts
        and stops refusing work."""
        self.broker_status = status
        self.location.status = status

    def _refused(self, exc: BaseException) -> None:
        status = self.broker_status
        if isinstance(exc, Refused) and status is not None:
            self._refusing = True
            status.refused(exc.reason)

    def _accepted(self) -> None:
        if self._refusing and not any(state.refused for state in self._failing.values()):
            self._refusing = False
            if self.broker_status is not None:
                self.broker_status.accepted()

    def _failed(self, physical: str, exc: BaseException) -> None:
        self._refused(exc)
        now = time.monotonic()
        state = self._failing.get(physical)
        if state is None:
            state = self._failing[physical] = _Failing(
                now, now, 0.05, _describe(exc), isinstance(exc, Refused)
            )
            logger.warning(
                "Cannot fetch from queue %r now (%s); the other queues go on, and this one is tried again",
                physical,
                state.reason,
            )
        state.delay = min(state.delay * 2, MAX_BACKOFF)
        state.retry_at = now + state.delay

    def _recovered(self, physical: str) -> None:
        state = self._failing.pop(physical, None)
        if state is not None:
            logger.warning(
                "Fetching from queue %r again, after %.1fs (%s)",
                physical,
                time.monotonic() - state.since,
                state.reason,
            )

    def flush_acks(self) -> None:
        """Write the acknowledgements kept so far, one script per queue; those a node cannot take
        now stay kept (written with a later round, their leases renewed meanwhile)."""
        taken = self.location.take_acks()
        if not taken:
            return
        router = self.router
        failure: BaseException | None = None
        for physical, tags in taken.items():
            keys = ClusterChannel.keys_for(physical, self.config)
            try:
                sent = router.run(
                    keys.slot,
                    [router.script(ACK, [keys.unacked, keys.leases], [self.location.owner, *tags])],
                    retry=True,
                )
            except (NodeUnavailable, Refused) as exc:
                self.location.put_back(physical, tags)
                self._refused(exc)
                failure = exc
                continue
            lost = [tag.decode() if isinstance(tag, bytes) else str(tag) for tag in sent.replies[0] or ()]
            if lost:
                self.location.acknowledged_without_record(physical, lost)
            if sent.replicas is not None and sent.replicas < self.config.wait_for_replicas:
                logger.warning(
                    "Acknowledgements of %d message(s) of queue %r were confirmed by %d of the %d replica(s) "
                    "asked for within wait_timeout=%gs: if primary %s fails before they reach a replica, "
                    "those messages come back and run again. Tasks: %s",
                    len(tags),
                    physical,
                    sent.replicas,
                    self.config.wait_for_replicas,
                    self.config.wait_timeout,
                    sent.node,
                    ", ".join(self.location.task_of(tag) or "?" for tag in tags),
                )
            self.location.written(tags)
        if failure is not None and not self.consuming:
            raise failure

    def reclaim(self, force: bool = False) -> None:
        """Give back the messages of the consumed queues whose lease lapsed."""
        router = self._router
        if router is None or not self._consumed:
            return
        for physical in list(self._consumed):
            if physical in self._failing:
                continue
            keys = ClusterChannel.keys_for(physical, self.config)
            steps = self.config.priority_steps
            command = router.script(
                RECLAIM,
                [*keys.records, *keys.lists],
                [RECLAIM_LIMIT, keys.wake, self.wake_kind, len(steps), *steps],
            )
            try:
                given = router.run(keys.slot, [command]).replies[0] or []
            except (NodeUnavailable, Refused) as exc:
                self._failed(physical, exc)
                continue
            if given:
                self._marked.add(physical)
                logger.warning(
                    "Restored %d message(s) of queue %r whose lease lapsed (their worker died, or could not "
                    "reach the cluster for longer than visibility_timeout=%gs): they are delivered again",
                    len(given),
                    physical,
                    self.config.visibility_timeout,
                )

    def _wait_time(self, now: float) -> float:
        wait = self._poll_at - now
        for state in self._failing.values():
            wait = min(wait, state.retry_at - now)
        if (self._marked and self._has_room()) or self.location.unwritten:
            wait = 0.0
        return max(0.0, wait)

    def _has_room(self) -> bool:
        return any(
            channel.qos.can_consume()
            for physical in self._marked
            for channel, _ in self._consumed.get(physical, ())
            if not channel.closed
        )

    def drain_events(self, connection: Any, timeout: float | None = None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._handed = 0
            if self.pump() or self._handed:
                return
            now = time.monotonic()
            wait = self._wait_time(now) if self.consuming else self.polling_interval
            if deadline is not None:
                left = deadline - now
                if left <= 0:
                    raise TimeoutError()
                wait = min(wait, left)
            subscriber = self._subscriber
            if subscriber is not None and self.consuming:
                subscriber.wait(wait)
                if self._handed:
                    return
            else:
                time.sleep(wait)  # nothing consumed: the wait is the caller's timeout

    # -- kombu's hub (the async loop) -----------------------------------------------------------

    def register_with_event_loop(self, connection: Any, loop: Any) -> None:
        self._hub = loop
        loop.on_tick.add(self._on_tick)
        loop.call_repeatedly(self.polling_interval, self._on_poll)
        self._update_readers()

    def _update_readers(self) -> None:
        hub = self._hub
        if hub is None:
            return
        fds = self._subscriber.fds() if self._subscriber is not None else {}
        for fd in [fd for fd in self._hub_fds if fd not in fds]:
            self._forget_reader(fd)
        for fd, name in fds.items():
            if self._hub_fds.get(fd) != name:
                hub.add_reader(fd, self._on_readable, fd)
                self._hub_fds[fd] = name

    def _forget_reader(self, fd: int) -> None:
        self._hub_fds.pop(fd, None)
        hub = self._hub
        if hub is not None:
            try:
                hub.remove_reader(fd)
            except Exception as exc:
                logger.debug("could not remove reader %d from the hub: %r", fd, exc)

    def _on_readable(self, fd: int) -> None:
        subscriber = self._subscriber
        name = self._hub_fds.get(fd)
        if subscriber is None or name is None:
            self._forget_reader(fd)
            return
        subscriber.read(name)
        if subscriber.due or self._marked:
            self.pump()

    def _on_tick(self) -> None:
        if self.lost:
            return
        subscriber = self._subscriber
        if (
            self.location.unwritten
            or (self._marked and self._has_room())
            or (subscriber is not None and subscriber.due)
        ):
            self.pump()

    def _on_poll(self) -> None:
        if not self.lost:
            self.pump()
