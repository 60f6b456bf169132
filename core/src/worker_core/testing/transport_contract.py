"""The transport contract suite: checks any :class:`~worker_core.slots.Transport` against a real
broker of its kind, through kombu as the worker uses it.

A third-party transport runs it in one line, given a URL of a broker it may use (each check
declares queues of its own, named ``contract-<uuid>``, and deletes them)::

    from worker_core.testing import transport_contract

    transport_contract.run_all(MyTransport, "mybroker://127.0.0.1:7000/")

or, to see each check as its own pytest test::

    @pytest.mark.parametrize("check", transport_contract.CHECKS, ids=transport_contract.check_name)
    def test_my_transport_honours_the_transport_contract(check):
        check(MyTransport, "mybroker://127.0.0.1:7000/")

Each check raises ``AssertionError`` naming the transport and what it did wrong. ``settings``
(default: ``Settings()``) is what the transport is built with.

One module, as every shipped suite: a third party imports one name and runs it.
"""

from __future__ import annotations

import contextlib
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

import kombu

from ..app.broker import task_queue
from ..app.settings import Settings
from ..plugins.conformance import conformance_problem
from ..slots import AcksSurviveReconnect, CountsDeliveries, LeasesMessages, OffersResultBackend, Transport
from .proxy import proxied

__all__ = ["CHECKS", "Check", "check_name", "run_all"]

#: Seconds a check waits for a message it expects.
DELIVERY_TIMEOUT = 10.0


class Check(Protocol):
    __name__: str

    def __call__(self, transport: type[Transport], url: str, *, settings: Settings | None = None) -> None: ...


def _expect(condition: object, message: str) -> None:
    if not condition:
        raise AssertionError(message)


def _label(transport: type[Transport]) -> str:
    return f"{transport.__module__}.{transport.__qualname__}"


class _Broker:
    """One transport instance and the connections, queues and messages of one check."""

    def __init__(self, transport: type[Transport], url: str, settings: Settings | None) -> None:
        self.label = _label(transport)
        self.settings = settings or Settings()
        self.url = url
        self.transport = transport(url, self.settings)
        self.connections: list[Any] = []
        self.queues: list[Any] = []

    def connect(self, url: str | None = None) -> Any:
        """A connected kombu connection made as the worker makes it (to ``url``, else the broker's)."""
        connection = kombu.Connection(  # type: ignore[attr-defined,no-untyped-call]
            url or self.url, transport=self.transport.kombu_transport(), **self.transport.connection_options()
        )
        self.connections.append(connection)
        connection.connect()
        return connection

    def queue(self, connection: Any) -> Any:
        """A new queue, declared as Celery declares its queues."""
        queue = task_queue(f"contract-{uuid.uuid4().hex}", self.settings)
        queue(connection.default_channel).declare()
        self.queues.append(queue)
        return queue

    def publish(self, connection: Any, queue: Any, body: Any, **options: Any) -> None:
        producer = kombu.Producer(connection)  # type: ignore[attr-defined,no-untyped-call]
        producer.publish(body, exchange=queue.exchange, routing_key=queue.routing_key, serializer="json",
                         **options)

    def receive(self, connection: Any, queue: Any, count: int, *, prefetch: int = 10) -> list[Any]:
        """The first ``count`` messages delivered from ``queue`` on ``connection``, not acknowledged."""
        received: list[Any] = []
        consumer = kombu.Consumer(  # type: ignore[attr-defined,no-untyped-call]
            connection, [queue], accept=["json"], on_message=received.append, prefetch_count=prefetch
        )
        consumer.consume()
        deadline = time.monotonic() + DELIVERY_TIMEOUT
        try:
            while len(received) < count:
                left = deadline - time.monotonic()
                _expect(left > 0, f"{self.label}: expected {count} message(s) from queue {queue.name!r}, "
                                  f"{len(received)} arrived within {DELIVERY_TIMEOUT:g}s")
                with contextlib.suppress(socket.timeout):
                    connection.drain_events(timeout=min(left, 1.0))
        finally:
            with contextlib.suppress(Exception):
                consumer.cancel()
        return received

    def depth(self, connection: Any, queue: Any) -> int:
        depth = self.transport.queue_depth(connection, queue.name)
        _expect(isinstance(depth, int) and not isinstance(depth, bool),
                f"{self.label}.queue_depth() returned {depth!r}, which is not an int")
        return depth

    def close(self) -> None:
        for queue in self.queues:
            with contextlib.suppress(Exception):
                cleaner = self.connect(self.url)
                queue(cleaner.default_channel).delete()
        for connection in self.connections:
            with contextlib.suppress(Exception):
                connection.release()


@contextlib.contextmanager
def _broker(transport: type[Transport], url: str, settings: Settings | None) -> Iterator[_Broker]:
    broker = _Broker(transport, url, settings)
    try:
        yield broker
    finally:
        broker.close()


def _bodies(messages: Iterable[Any]) -> list[Any]:
    return [message.decode() for message in messages]


def _until(condition: Callable[[], bool], message: str, timeout: float = DELIVERY_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        _expect(time.monotonic() < deadline, message)
        time.sleep(0.02)


def _next_after_marker_is_marker(broker: _Broker, queue: Any, what: str, connection: Any = None) -> None:
    """Publish a marker (on ``connection``, else a new one): it must be the first and only message
    delivered, so nothing ``what`` left is still in the queue."""
    connection = connection or broker.connect()
    marker = {"marker": uuid.uuid4().hex}
    broker.publish(connection, queue, marker)
    [first] = broker.receive(connection, queue, 1, prefetch=1)
    _expect(first.decode() == marker, f"{broker.label}: {what}, yet it was delivered again: "
                                      f"{first.decode()!r} came before the marker published after it")
    first.ack()
    _until(lambda: broker.depth(connection, queue) == 0,
           f"{broker.label}: {what}, yet queue_depth() stays at {broker.depth(connection, queue)}")
    connection.release()


# -- the checks -----------------------------------------------------------------------------------


def check_the_class_satisfies_the_transport_protocol(
    transport: type[Transport], url: str, *, settings: Settings | None = None
) -> None:
    """Every member of :class:`~worker_core.slots.Transport` is there (what the plugin manager
    checks when it loads a transport), class attributes have their types, and the optional
    capabilities it claims are whole."""
    label = _label(transport)
    problem = conformance_problem("transport", transport)
    _expect(problem is None, f"{label} {problem}")
    _expect(isinstance(transport.supports_async, bool),
            f"{label}.supports_async must be a bool class attribute (got {transport.supports_async!r})")
    declared: object = transport
    if isinstance(declared, AcksSurviveReconnect):
        _expect(isinstance(declared.acks_survive_reconnect, bool),
                f"{label}.acks_survive_reconnect must be a bool (got {declared.acks_survive_reconnect!r})")
    if isinstance(declared, LeasesMessages):
        _expect(isinstance(declared.renews_leases, bool),
                f"{label}.renews_leases must be a bool (got {declared.renews_leases!r})")
        lease = declared.lease_timeout(settings or Settings())
        _expect(isinstance(lease, (int, float)) and lease > 0,
                f"{label}.lease_timeout(settings) must be a number of seconds above 0 (got {lease!r})")
    if isinstance(declared, OffersResultBackend):
        offered = declared.default_result_backend(url)
        _expect(offered is None or (isinstance(offered, str) and "://" in offered),
                f"{label}.default_result_backend({url!r}) must return a result backend URL or None "
                f"(got {offered!r})")


def check_it_is_built_from_a_url_and_settings_without_connecting(
    transport: type[Transport], url: str, *, settings: Settings | None = None
) -> None:
    label = _label(transport)
    instance = transport(url, settings or Settings())
    _expect(isinstance(instance, Transport), f"{label}(url, settings) is not a worker_core.slots.Transport")
    _expect(instance.kombu_transport() is not None, f"{label}.kombu_transport() returned None")
    first, second = instance.connection_options(), instance.connection_options()
    _expect(isinstance(first, Mapping), f"{label}.connection_options() returned {first!r}, not a mapping")
    _expect(first == second and first is not second,
            f"{label}.connection_options() must return an equal new mapping on every call (kombu writes "
            f"into what it is given)")


def check_a_kombu_connection_connects_through_it(
    transport: type[Transport], url: str, *, settings: Settings | None = None
) -> None:
    with _broker(transport, url, settings) as broker:
        connection = broker.connect()
        _expect(connection.connected, f"{broker.label}: the kombu connection is not connected")
        asynchronous = bool(connection.transport.implements.asynchronous)
        _expect(asynchronous or not transport.supports_async,
                f"{broker.label}.supports_async is true but its kombu transport "
                f"{type(connection.transport).__qualname__} cannot be driven by kombu's hub "
                f"(implements.asynchronous is false)")


def check_a_published_message_is_consumed(
    transport: type[Transport], url: str, *, settings: Settings | None = None
) -> None:
    with _broker(transport, url, settings) as broker:
        connection = broker.connect()
        queue = broker.queue(connection)
        body = {"text": "héllo", "numbers": [1, 2.5, None], "nested": {"ok": True}}
        broker.publish(connection, queue, body, headers={"x-contract": "1"}, correlation_id="c-1",
                       reply_to="replies")
        [message] = broker.receive(connection, queue, 1)
        _expect(message.decode() == body,
                f"{broker.label}: published {body!r}, consumed {message.decode()!r}")
        _expect(message.headers.get("x-contract") == "1", f"{broker.label}: headers came back as "
                                                          f"{message.headers!r}")
        _expect(message.properties.get("correlation_id") == "c-1" and message.properties.get("reply_to")
                == "replies", f"{broker.label}: properties came back as {message.properties!r}")
        _expect(message.delivery_info.get("routing_key") == queue.routing_key,
                f"{broker.label}: delivery_info {message.delivery_info!r} does not name routing key "
                f"{queue.routing_key!r}")
        message.ack()


def check_an_acknowledged_message_is_gone(
    transport: type[Transport], url: str, *, settings: Settings | None = None
) -> None:
    _settled_message_is_gone(transport, url, settings, lambda message: message.ack(),
                             "a message was acknowledged and its connection closed")


def check_a_message_rejected_without_requeue_is_gone(
    transport: type[Transport], url: str, *, settings: Settings | None = None
) -> None:
    _settled_message_is_gone(transport, url, settings, lambda message: message.reject(requeue=False),
                             "a message was rejected without requeue")


def _settled_message_is_gone(transport: type[Transport], url: str, settings: Settings | None,
                             settle: Callable[[Any], None], what: str) -> None:
    with _broker(transport, url, settings) as broker:
        connection = broker.connect()
        queue = broker.queue(connection)
        broker.publish(connection, queue, {"n": 1})
        [message] = broker.receive(connection, queue, 1)
        settle(message)
        connection.release()
        _next_after_marker_is_marker(broker, queue, what)


def check_a_message_rejected_with_requeue_is_delivered_again(
    transport: type[Transport], url: str, *, settings: Settings | None = None
) -> None:
    with _broker(transport, url, settings) as broker:
        connection = broker.connect()
        queue = broker.queue(connection)
        body = {"n": uuid.uuid4().hex}
        broker.publish(connection, queue, body)
        [message] = broker.receive(connection, queue, 1)
        message.reject(requeue=True)
        [again] = broker.receive(connection, queue, 1)
        _expect(again.decode() == body, f"{broker.label}: a message rejected with requeue came back as "
                                        f"{again.decode()!r}, not {body!r}")
        again.ack()


def check_unacknowledged_messages_come_back_when_the_connection_closes(
    transport: type[Transport], url: str, *, settings: Settings | None = None
) -> None:
    with _broker(transport, url, settings) as broker:
        connection = broker.connect()
        queue = broker.queue(connection)
        bodies = [{"n": index} for index in range(3)]
        for body in bodies:
            broker.publish(connection, queue, body)
        received = broker.receive(connection, queue, 3)
        _expect(sorted(_bodies(received), key=str) == sorted(bodies, key=str),
                f"{broker.label}: published {bodies!r}, consumed {_bodies(received)!r}")
        connection.release()
        again = broker.receive(broker.connect(), queue, 3)
        _expect(sorted(_bodies(again), key=str) == sorted(bodies, key=str),
                f"{broker.label}: three messages left unacknowledged when their connection closed came back "
                f"as {_bodies(again)!r}")
        # the poison cap counts only the messages flagged as delivered again
        unflagged = [message.decode() for message in again
                     if not (message.delivery_info or {}).get("redelivered")]
        _expect(not unflagged, f"{broker.label}: messages delivered again after their connection closed do "
                               f"not say so (delivery_info['redelivered']): {unflagged!r}")
        for message in again:
            message.ack()


def check_a_delivery_counter_counts_once_per_call_when_offered(
    transport: type[Transport], url: str, *, settings: Settings | None = None
) -> None:
    """With :class:`~worker_core.slots.CountsDeliveries`: a new counter counts from 1, each call
    adds one, a call through another connection (another worker) adds to the same counter, and
    counters of other keys are apart."""
    declared: object = transport
    if not isinstance(declared, CountsDeliveries):
        return
    with _broker(transport, url, settings) as broker:
        counters = broker.transport
        assert isinstance(counters, CountsDeliveries)
        key, other_key = f"contract-counter-{uuid.uuid4().hex}", f"contract-counter-{uuid.uuid4().hex}"
        first = broker.connect()
        counts = [counters.count_delivery(first, key, 60.0) for _ in range(2)]
        _expect(counts == [1, 2], f"{broker.label}.count_delivery() counted {counts!r}, not [1, 2]")
        third = counters.count_delivery(broker.connect(), key, 60.0)
        _expect(third == 3,
                f"{broker.label}: a count through another connection gave {third!r} after 2, not 3")
        fresh = counters.count_delivery(first, other_key, 60.0)
        _expect(fresh == 1, f"{broker.label}: a counter of another key started at {fresh!r}, not 1")


def check_queue_depth_counts_the_waiting_messages(
    transport: type[Transport], url: str, *, settings: Settings | None = None
) -> None:
    with _broker(transport, url, settings) as broker:
        connection = broker.connect()
        never_declared = task_queue(f"contract-missing-{uuid.uuid4().hex}", broker.settings)
        missing = broker.depth(connection, never_declared)
        _expect(missing == 0,
                f"{broker.label}.queue_depth() of a queue that does not exist is {missing}, not 0")
        queue = broker.queue(connection)
        _expect(broker.depth(connection, queue) == 0, f"{broker.label}.queue_depth() of a new queue is not 0")
        for index in range(3):
            broker.publish(connection, queue, {"n": index})
        _until(lambda: broker.depth(connection, queue) == 3,
               f"{broker.label}.queue_depth() stays at {broker.depth(connection, queue)} with 3 messages "
               f"waiting")
        [message] = broker.receive(connection, queue, 1, prefetch=1)
        message.ack()
        _until(lambda: broker.depth(connection, queue) == 2,
               f"{broker.label}.queue_depth() stays at {broker.depth(connection, queue)} after one of 3 "
               f"messages was taken")


def celery_message(task_id: str) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """``(body, headers, properties)`` of a task message exactly as Celery 5's client publishes it
    (protocol v2: ``app.amqp.as_task_v2`` then ``Producer.publish`` with JSON)."""
    headers: dict[str, Any] = {
        "lang": "py", "task": "proj.add", "id": task_id, "shadow": None, "eta": None, "expires": None,
        "group": None, "group_index": None, "retries": 0, "timelimit": [None, None], "root_id": task_id,
        "parent_id": None, "argsrepr": "(2, 3)", "kwargsrepr": "{'z': 1}", "origin": "gen1@contract",
        "ignore_result": False, "replaced_task_nesting": 0, "stamped_headers": None, "stamps": {},
    }
    body = [[2, 3], {"z": 1}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]
    properties = {"correlation_id": task_id, "reply_to": "", "delivery_mode": 2, "priority": 0,
                  "content_encoding": "utf-8"}
    return body, headers, properties


def check_a_celery_task_message_is_consumed_whole(
    transport: type[Transport], url: str, *, settings: Settings | None = None
) -> None:
    with _broker(transport, url, settings) as broker:
        connection = broker.connect()
        queue = broker.queue(connection)
        task_id = str(uuid.uuid4())
        body, headers, properties = celery_message(task_id)
        broker.publish(connection, queue, body, headers=headers, **properties)
        [message] = broker.receive(connection, queue, 1)
        _expect(message.decode() == body, f"{broker.label}: Celery's body came back as {message.decode()!r}")
        _expect(dict(message.headers) == headers,
                f"{broker.label}: Celery's headers came back as {dict(message.headers)!r}, sent {headers!r}")
        _expect(message.content_type == "application/json" and message.content_encoding == "utf-8",
                f"{broker.label}: content type {message.content_type!r}, encoding "
                f"{message.content_encoding!r}")
        for name in ("correlation_id", "reply_to"):
            _expect(message.properties.get(name) == properties[name],
                    f"{broker.label}: property {name} came back as {message.properties.get(name)!r}")
        _expect(message.delivery_info.get("routing_key") == queue.routing_key,
                f"{broker.label}: delivery_info {message.delivery_info!r}")
        message.ack()


def check_acknowledgements_cross_a_reconnect_only_when_promised(
    transport: type[Transport], url: str, *, settings: Settings | None = None
) -> None:
    """A message received on a connection that is then lost (the network drops it; the worker
    collects it) and acknowledged once the next connection is up: with
    :class:`~worker_core.slots.AcksSurviveReconnect` the acknowledgement holds and the message is
    never delivered again; without it the broker delivers the message again, which is what the
    worker relies on when it drops the tasks it had not started."""
    declared: object = transport
    promised = isinstance(declared, AcksSurviveReconnect) and declared.acks_survive_reconnect
    with _broker(transport, url, settings) as broker:
        probe = broker.connect()
        queue = broker.queue(probe)
        body = {"n": uuid.uuid4().hex}
        broker.publish(probe, queue, body)
        with proxied(url, probe.transport.default_port) as through:
            # the worker reconnects to the same URL it lost: here, through the same proxy
            same_url = url if through is None else through[1]
            lost = broker.connect(same_url)
            [message] = broker.receive(lost, queue, 1)
            if through is not None:
                through[0].cut()
                with contextlib.suppress(Exception):  # the loss shows as the transport's own error
                    lost.drain_events(timeout=1)
            lost.collect()
            if through is not None:
                through[0].restore()
            following = broker.connect(same_url)
            if promised:
                try:
                    message.ack()
                except Exception as exc:
                    raise AssertionError(
                        f"{broker.label} promises acks_survive_reconnect, but acknowledging a message "
                        f"received before the connection was lost raised {exc!r}") from exc
                _next_after_marker_is_marker(
                    broker, queue, "acks_survive_reconnect is promised and the message was acknowledged "
                                   "after the reconnect", following)
            else:
                unpromised = (f"{broker.label} does not promise acks_survive_reconnect, so the broker must "
                              f"deliver again what the lost connection had not acknowledged (the worker "
                              f"drops those tasks)")
                try:
                    [again] = broker.receive(following, queue, 1)
                except AssertionError as exc:
                    raise AssertionError(f"{unpromised}: {exc}") from None
                _expect(again.decode() == body, f"{unpromised}; it delivered {again.decode()!r}")
                again.ack()


#: Every check, in a sensible order.
CHECKS: tuple[Check, ...] = (
    check_the_class_satisfies_the_transport_protocol,
    check_it_is_built_from_a_url_and_settings_without_connecting,
    check_a_kombu_connection_connects_through_it,
    check_a_published_message_is_consumed,
    check_an_acknowledged_message_is_gone,
    check_a_message_rejected_without_requeue_is_gone,
    check_a_message_rejected_with_requeue_is_delivered_again,
    check_unacknowledged_messages_come_back_when_the_connection_closes,
    check_queue_depth_counts_the_waiting_messages,
    check_a_delivery_counter_counts_once_per_call_when_offered,
    check_a_celery_task_message_is_consumed_whole,
    check_acknowledgements_cross_a_reconnect_only_when_promised,
)


def check_name(check: Check) -> str:
    """A pytest id: the check's name without its ``check_`` prefix."""
    return check.__name__.removeprefix("check_")


def run_all(transport: type[Transport], url: str, *, settings: Settings | None = None,
            only: Iterable[str] | None = None) -> None:
    """Run every check (or those named in ``only``) against ``transport`` on the broker at ``url``;
    raise on the first failure, naming the transport and the check."""
    wanted = set(only) if only is not None else None
    for check in CHECKS:
        if wanted is None or check_name(check) in wanted or check.__name__ in wanted:
            try:
                check(transport, url, settings=settings)
            except AssertionError as exc:
                raise AssertionError(f"{_label(transport)} fails {check.__name__}: {exc}") from exc
