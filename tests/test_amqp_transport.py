"""The AMQP transport against a real RabbitMQ: round trips (drain_events and a kombu Hub),
heartbeats, priorities, queue depth, and queue declarations Celery and we can share."""

from __future__ import annotations

import os
import select
import socket
import ssl
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import kombu
import pytest
from conftest import AMQP_TEST_URL, amqp_url_on, require_server
from kombu.asynchronous import Hub
from workers import drain, wait_for

from worker_core.app.broker import task_queue
from worker_core.app.settings import Settings
from worker_core.exceptions import ConfigurationError
from worker_transport_amqp import AmqpTransport

pytestmark = pytest.mark.amqp

#: py-amqp's and kombu's own paths only (every fast path off): a test of a fast path's own
#: mechanics skips
STOCK = os.environ.get("WORKER_STOCK_KOMBU", "") not in ("", "0")
fast_path_only = pytest.mark.skipif(STOCK, reason="WORKER_STOCK_KOMBU=1 turns off the fast path it checks")

URL = AMQP_TEST_URL


def connect(settings: Settings | None = None, url: str = URL) -> kombu.Connection:
    transport = AmqpTransport(url, settings or Settings())
    return kombu.Connection(url, transport=transport.kombu_transport(), **transport.connection_options())


@pytest.fixture
def queue_name() -> Iterator[str]:
    """A fresh queue name; the queue and its exchange are deleted afterwards."""
    require_server(5672, "RabbitMQ")
    name = f"wt-{uuid.uuid4().hex[:10]}"
    yield name
    with connect() as connection:
        channel = connection.channel()
        channel.queue_delete(name)
        channel.exchange_delete(name)
        channel.close()


def publish(connection: kombu.Connection, queue: kombu.Queue, bodies: list[Any],
            priorities: list[int | None] | None = None) -> None:
    producer = kombu.Producer(connection.default_channel)
    for body, priority in zip(bodies, priorities or [None] * len(bodies), strict=True):
        producer.publish(body, exchange="", routing_key=queue.name, declare=[queue], priority=priority,
                         delivery_mode=2)


def run_hub(connection: kombu.Connection, until: Callable[[], bool], timeout: float = 10.0) -> None:
    """Turn a kombu hub driving ``connection`` until ``until()``; fail after ``timeout`` seconds."""
    turns = Turns(connection)
    try:
        turns.until(until, timeout)
    finally:
        turns.close()


class Turns:
    """A kombu hub driving ``connection``, turned one loop turn at a time (short turns, as with
    a worker's timers)."""

    def __init__(self, connection: kombu.Connection) -> None:
        self.hub = Hub()
        connection.transport.register_with_event_loop(connection.connection, self.hub)
        self.hub.call_repeatedly(0.02, lambda: None)
        self._loop = self.hub.create_loop()

    def turn(self) -> None:
        next(self._loop)

    def until(self, condition: Callable[[], bool], timeout: float = 5.0) -> None:
        def turned() -> bool:
            if condition():
                return True
            self.turn()
            return condition()

        wait_for(turned, timeout, interval=0, message="the hub's turns to bring it about")

    def close(self) -> None:
        self.hub.close()


def redelivered(settings: Settings, queue: kombu.Queue, count: int) -> list[Any]:
    """On a new connection, take what the broker gives back: exactly ``count`` messages (no more
    arrive within 0.3 s). Acknowledges them; returns their bodies in delivery order."""
    with connect(settings) as connection:
        again: list[Any] = []
        consumer = kombu.Consumer(connection.default_channel, [queue], on_message=again.append, no_ack=False)
        consumer.consume()
        drain(connection, lambda: len(again) == count)
        with pytest.raises(TimeoutError):
            connection.drain_events(timeout=0.3)  # nothing else comes back
        for message in again:
            message.ack()
        connection.default_channel.flush_acks()  # all delivered are acknowledged: one multiple ack
        assert not connection.default_channel._delivered
        return [message.decode() for message in again]


# -- configuration ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("url", "options", "expected"), [
    ("amqp://guest:guest@127.0.0.1:99999//", {}, "Port out of range"),
    ("redis://127.0.0.1:5672//", {}, "not an AMQP URL"),
    ("amqp://127.0.0.1//", {"confirm_publish": "yes"}, "'confirm_publish' must be True or False"),
    ("amqp://127.0.0.1//", {"read_timout": 5}, "Did you mean 'read_timeout'?"),
    ("amqp://127.0.0.1//", {"ssl": "on"}, "'ssl' must be True, False or a mapping"),
])
def test_bad_urls_and_options_are_refused_with_an_example(
        url: str, options: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigurationError, match=expected) as caught:
        AmqpTransport(url, Settings(broker_transport_options=options))
    assert "for example" in str(caught.value) or "Did you mean" in str(caught.value)


def test_connection_options_carry_heartbeat_tls_and_py_amqp_arguments() -> None:
    from worker_transport_amqp import kombu_transport as pyamqp

    transport = AmqpTransport("amqps://user:pw@rabbit.example.com:5671/vhost", Settings(
        broker_transport_options={"ssl": {"cert_reqs": ssl.CERT_REQUIRED}, "confirm_publish": True}))
    assert transport.kombu_transport() is pyamqp.SSLTransport
    # the host name is checked by default (the whole of TLS is in test_tls.py)
    assert transport.connection_options() == {
        "heartbeat": 120.0, "transport_options": {"confirm_publish": True},
        "ssl": {"cert_reqs": ssl.CERT_REQUIRED, "server_hostname": "rabbit.example.com"}}
    plain = AmqpTransport(URL, Settings(broker_heartbeat=0))
    assert plain.kombu_transport() is pyamqp.Transport
    assert plain.connection_options() == {"heartbeat": 0.0, "transport_options": {}}
    assert AmqpTransport.default_result_backend(URL) is None


def test_the_package_exports_the_transport() -> None:
    import worker_transport_amqp

    assert worker_transport_amqp.__all__ == ["AmqpTransport"]


# -- round trips -----------------------------------------------------------------------------------


def test_messages_round_trip_through_drain_events(queue_name: str) -> None:
    queue, got = task_queue(queue_name, Settings()), []
    with connect() as connection:
        publish(connection, queue, [{"n": n} for n in range(20)])
        consumer = kombu.Consumer(connection.default_channel, [queue], no_ack=False,
                                  on_message=lambda m: (got.append(m.payload["n"]), m.ack()))
        consumer.qos(prefetch_count=5, apply_global=True)
        consumer.consume()
        drain(connection, lambda: len(got) == 20)
    assert got == list(range(20))


def test_messages_round_trip_on_a_kombu_hub(queue_name: str) -> None:
    queue, got = task_queue(queue_name, Settings()), []
    with connect() as connection:
        publish(connection, queue, [{"n": n} for n in range(20)])
        consumer = kombu.Consumer(connection.default_channel, [queue], no_ack=False,
                                  on_message=lambda m: (got.append(m.payload["n"]), m.ack()))
        consumer.qos(prefetch_count=5, apply_global=True)
        consumer.consume()
        run_hub(connection, lambda: len(got) == 20)
    assert got == list(range(20))


def test_bodies_larger_than_a_frame_and_empty_ones_arrive_whole_on_a_kombu_hub(queue_name: str) -> None:
    queue, got = task_queue(queue_name, Settings()), []
    large = {"blob": "x" * 400_000, "tail": "end"}  # about three frames of RabbitMQ's 128 KiB
    with connect() as connection:
        publish(connection, queue, [large])
        kombu.Producer(connection.default_channel).publish(  # no body at all: no body frame
            b"", exchange="", routing_key=queue.name, serializer=None, content_type="application/data",
            content_encoding="binary")
        publish(connection, queue, [{"n": 1}])

        def on_message(message: Any) -> None:
            got.append(message.body if message.content_type == "application/data" else message.payload)
            message.ack()

        consumer = kombu.Consumer(connection.default_channel, [queue], no_ack=False, on_message=on_message)
        consumer.consume()
        run_hub(connection, lambda: len(got) == 3)
    assert got == [large, "", {"n": 1}]  # (py-amqp's body for a message without one is "")


def test_frames_are_cut_from_what_arrived_and_a_bad_frame_end_is_refused() -> None:
    from amqp.exceptions import UnexpectedFrame

    from worker_transport_amqp.reading import BufferedTCPTransport

    def frame(kind: int, channel: int, payload: bytes, end: bytes = b"\xce") -> bytes:
        return struct.pack(">BHI", kind, channel, len(payload)) + payload + end

    transport = BufferedTCPTransport("127.0.0.1:5672")  # not connected: only its buffer is used
    second = frame(3, 1, b"body")
    transport._read_buffer = frame(1, 1, b"method") + second[:5]
    assert transport.next_frame() == (1, 1, b"method")
    assert transport.next_frame() is None  # a partial header waits for the rest
    transport._read_buffer += second[5:-1]
    assert transport.next_frame() is None  # everything but the frame end
    transport._read_buffer += second[-1:] + frame(8, 0, b"")
    assert transport.next_frame() == (3, 1, b"body")
    assert transport.next_frame() == (8, 0, b"")
    assert transport.next_frame() is None and transport._read_buffer == b""
    transport._read_buffer = frame(1, 1, b"method", end=b"\x00")
    with pytest.raises(UnexpectedFrame, match="frame_end 0x00"):
        transport.next_frame()


@pytest.mark.parametrize("multiple", [True, False])
def test_an_ack_frame_is_byte_for_byte_the_one_py_amqp_writes(multiple: bool) -> None:
    from amqp.method_framing import frame_writer
    from amqp.serialization import dumps
    from amqp.spec import Basic

    from worker_transport_amqp.channel import Channel

    class Written:
        frame_max = 131072
        bytes_sent = 0

        def __init__(self) -> None:
            self.frames: list[bytes] = []
            self.transport = self

        def write(self, data: Any) -> None:
            self.frames.append(bytes(data))

    theirs, ours = Written(), Written()
    frame_writer(theirs, theirs)(1, 3, Basic.Ack, dumps("Lb", (2**40 + 7, multiple)), None)
    channel = Channel.__new__(Channel)  # only what _write_ack reads
    channel.connection, channel.channel_id = ours, 3
    channel._write_ack(2**40 + 7, multiple)
    assert ours.frames == theirs.frames and ours.bytes_sent == theirs.bytes_sent == 1


def test_a_short_read_is_not_followed_by_a_read_that_finds_the_socket_empty() -> None:
    from worker_transport_amqp.reading import READ_SIZE, BufferedTCPTransport, dispatch_arrived

    def frame(payload: bytes) -> bytes:
        return struct.pack(">BHI", 8, 0, len(payload)) + payload + b"\xce"

    class Socket:
        def __init__(self, reads: list[bytes]) -> None:
            self.reads = reads
            self.calls = 0

        def recv(self, size: int, flags: int = 0) -> bytes:
            self.calls += 1
            if not self.reads:
                raise BlockingIOError
            return self.reads.pop(0)

    class Connection:
        takes_whole_deliveries = False

        def __init__(self, transport: BufferedTCPTransport) -> None:
            self.transport = transport
            self.frames: list[tuple[int, int, bytes]] = []

        def on_inbound_frame(self, frame: tuple[int, int, bytes]) -> None:
            self.frames.append(frame)

    transport = BufferedTCPTransport("127.0.0.1:5672")  # not connected: only buffer and socket used
    # a short read holding two frames and half a third: the rest is left to the next readable event
    third = frame(b"third")
    transport.sock = sock = Socket([frame(b"one") + frame(b"two") + third[:4], third[4:]])
    connection = Connection(transport)
    assert dispatch_arrived(connection, 100) is False
    assert [payload for _, _, payload in connection.frames] == [b"one", b"two"] and sock.calls == 1
    assert dispatch_arrived(connection, 100) is False
    assert connection.frames[-1][2] == b"third" and sock.calls == 2
    # a read that filled the whole request may have left more behind: the socket is read again
    big = frame(bytes(READ_SIZE - 8))
    transport.sock = sock = Socket([big, frame(b"after")])
    assert dispatch_arrived(connection, 100) is False
    assert connection.frames[-1][2] == b"after" and sock.calls == 2
    # the limit hands control back with frames still buffered, and the socket is not read
    transport.sock = sock = Socket([])
    transport._read_buffer = frame(b"a") + frame(b"b")
    assert dispatch_arrived(connection, 1) is True and connection.frames[-1][2] == b"a"
    assert dispatch_arrived(connection, 1) is True and connection.frames[-1][2] == b"b"
    assert sock.calls == 0


@pytest.mark.parametrize("version", ["c", "python"])
def test_a_whole_delivery_is_taken_in_one_call_and_anything_else_frame_by_frame(
        version: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from amqp.serialization import dumps
    from amqp.spec import Basic
    from test_amqp_decoding import c_version, deliver_frames, encoded, wire

    from worker_transport_amqp import reading
    from worker_transport_amqp.decoding import FrameHandler
    from worker_transport_amqp.delivery import next_delivery_python

    monkeypatch.setattr(reading, "next_delivery", c_version() if version == "c" else next_delivery_python)

    class Socket:
        def __init__(self, reads: list[bytes]) -> None:
            self.reads = reads

        def recv(self, size: int, flags: int = 0) -> bytes:
            if not self.reads:
                raise BlockingIOError
            return self.reads.pop(0)

    class Connection:
        """The connection's side of a delivery: what it was handed, and how."""

        takes_whole_deliveries = True

        def __init__(self, transport: reading.BufferedTCPTransport) -> None:
            self.transport = transport
            self.bytes_recv = 0
            self.handed: list[tuple[Any, ...]] = []
            self.on_inbound_frame = FrameHandler(self, lambda *args: self.handed.append(("method", args[1])))

        def on_delivery(self, channel: int, payload: bytes, properties: dict[str, Any], body: Any) -> None:
            self.handed.append(("frames", channel, properties, body))

        def on_decoded_delivery(self, delivery: tuple[Any, ...]) -> None:
            # (what is left in the buffer: the frames after this message, already)
            self.handed.append(("whole", delivery[1], delivery[8], delivery[9], self.transport._read_buffer))

    props = {"content_type": "application/json", "application_headers": {"task": "proj.add"}}
    first, second, third = (wire(deliver_frames(encoded(props), body, channel=channel, chunk=4))
                            for body, channel in ((b"[1, 2]", 1), (b"", 2), (b"[3]", 1)))
    method, header = deliver_frames(encoded(props), b"")
    split = len(wire([method])) + 5  # the second's method and part of its header
    extra = wire([method, (2, 1, header[2] + b"\x00")])  # a header a byte too long: frame by frame
    heartbeat = wire([(8, 0, b"")])
    recover_ok = wire([(1, 1, struct.pack(">HH", *Basic.RecoverOk) + bytes(dumps("", [])))])
    transport = reading.BufferedTCPTransport("127.0.0.1:5672")  # not connected: only buffer and socket used
    transport.sock = Socket([first + second[:split], second[split:] + third + heartbeat + extra + recover_ok])
    connection = Connection(transport)
    assert reading.dispatch_arrived(connection, 100) is False
    # the first whole; of the second only its method frame (taken) and part of its header arrived
    assert connection.handed == [("whole", 1, props, b"[1, 2]", second[:split])]
    assert connection.bytes_recv == 4 + 1 and connection.on_inbound_frame.receiving
    assert reading.dispatch_arrived(connection, 100) is False
    assert connection.handed[1:] == [
        ("frames", 2, props, ""),  # its header came after its method: frame by frame
        ("whole", 1, props, b"[3]", heartbeat + extra + recover_ok),
        ("frames", 1, props, ""),  # left to the frame handler, which ignores the extra byte as py-amqp does
        ("method", Basic.RecoverOk),
    ]
    assert connection.bytes_recv == 5 + 1 + 3 + 1 + 2 + 1  # every frame, whole deliveries included
    # the limit counts a delivery as its frames, and the socket is not read while frames are left
    transport.sock = Socket([])
    transport._read_buffer = first + third
    assert reading.dispatch_arrived(connection, 3) is True and connection.handed[-1][3] == b"[1, 2]"
    assert reading.dispatch_arrived(connection, 3) is True and connection.handed[-1][3] == b"[3]"
    assert reading.dispatch_arrived(connection, 3) is False


@fast_path_only
def test_frames_a_blocking_read_left_in_the_buffer_are_handled_by_the_hub(queue_name: str) -> None:
    """A blocking read (py-amqp waiting for a reply) takes everything that has arrived; the
    frames after the one it needed are in no socket any more, so the hub must find them in the
    buffer, or they would wait for the next message to arrive."""
    queue, got = task_queue(queue_name, Settings()), []
    with connect() as connection, connect() as publisher:
        consumer = kombu.Consumer(connection.default_channel, [queue], no_ack=False,
                                  on_message=lambda m: (got.append(m.payload["n"]), m.ack()))
        consumer.qos(prefetch_count=50, apply_global=True)
        consumer.consume()
        publish(publisher, queue, [{"n": n} for n in range(20)])
        wait_for(lambda: _deliveries_arrived(connection) == 20, message="the twenty deliveries")
        connection.drain_events(timeout=2)
        assert got == [0]
        assert connection.connection.transport._read_buffer  # the other nineteen, read ahead
        assert _unread(connection) == 0
        run_hub(connection, lambda: len(got) == 20)
    assert got == list(range(20))


def _unread(connection: kombu.Connection) -> int:
    """Bytes waiting in the connection's socket."""
    return len(_peek(connection))


def _deliveries_arrived(connection: kombu.Connection) -> int:
    """Deliveries arrived whole but not handled yet, in the transport's buffer (where a blocking
    read leaves them) or the socket: their body frames (one each, for the small bodies here)."""
    data = bytes(getattr(connection.connection.transport, "_read_buffer", b"")) + _peek(connection)
    bodies, at = 0, 0
    while at + 7 <= len(data):
        kind, size = data[at], int.from_bytes(data[at + 3:at + 7], "big")
        at += 8 + size  # type, channel, size, payload, frame end
        if kind == 3 and at <= len(data):
            bodies += 1
    return bodies


def _peek(connection: kombu.Connection) -> bytes:
    if connection.connection.sock is None or not _readable(connection):
        return b""
    return connection.connection.sock.recv(1 << 20, socket.MSG_PEEK | socket.MSG_DONTWAIT) or b""


def _readable(connection: kombu.Connection) -> bool:
    return bool(select.select([connection.connection.sock], [], [], 0)[0])


def test_heartbeats_are_negotiated_and_checked(queue_name: str) -> None:
    with connect(Settings(broker_heartbeat=10)) as connection:
        connection.connect()
        assert connection.connection.heartbeat == 10  # the smaller of ours and RabbitMQ's 60
        assert connection.supports_heartbeats
        connection.heartbeat_check(rate=2)
    with connect(Settings(broker_heartbeat=0)) as connection:
        connection.connect()
        assert connection.connection.heartbeat == 0


def test_a_missed_heartbeat_drops_the_connection_so_closing_it_does_not_hang(queue_name: str) -> None:
    from faults import TcpProxy

    proxy = TcpProxy("127.0.0.1", 5672)
    url = amqp_url_on(proxy.port)
    try:
        connection = connect(Settings(broker_heartbeat=1), url=url)
        channel = connection.channel()
        proxy.blackhole()  # the TCP connection stays open; nothing gets through
        started = time.monotonic()
        with pytest.raises(connection.connection_errors):  # checked four times a second, as kombu's hub does
            wait_for(lambda: connection.heartbeat_check(rate=4), 10, interval=0.25,
                     message="the missed heartbeats to drop the connection")
        assert time.monotonic() - started < 5
        closing = time.monotonic()
        channel.close()
        connection.release()
        assert time.monotonic() - closing < 1
    finally:
        proxy.close()


def test_higher_priority_is_served_first_with_x_max_priority(queue_name: str) -> None:
    queue, got = task_queue(queue_name, Settings(task_queue_max_priority=10)), []
    with connect() as connection:
        publish(connection, queue, [{"p": p} for p in (0, 9, 3, 6)], priorities=[0, 9, 3, 6])
        consumer = kombu.Consumer(connection.default_channel, [queue], no_ack=False,
                                  on_message=lambda m: (got.append(m.payload["p"]), m.ack()))
        consumer.qos(prefetch_count=1, apply_global=True)
        consumer.consume()
        drain(connection, lambda: len(got) == 4)
    assert got == [9, 6, 3, 0]


def test_queue_depth_counts_ready_messages_and_zero_for_a_missing_queue(queue_name: str) -> None:
    transport = AmqpTransport(URL, Settings())
    queue = task_queue(queue_name, Settings())
    with kombu.Connection(URL, transport=transport.kombu_transport(), **transport.connection_options()) as c:
        assert transport.queue_depth(c, queue_name) == 0
        publish(c, queue, [1, 2, 3])
        wait_for(lambda: transport.queue_depth(c, queue_name) == 3, 5, message="three messages ready")
        # the default channel is still usable after a passive declare of a missing queue
        assert transport.queue_depth(c, queue_name + "-missing") == 0
        publish(c, queue, [4])


# -- sharing queues with Celery ----------------------------------------------------------------------


def celery_app(**conf: Any) -> Any:
    from celery import Celery

    app = Celery("amqp-wire", broker=URL, backend=None)
    app.conf.update(broker_connection_retry_on_startup=True, **conf)
    return app


@pytest.mark.parametrize("max_priority", [None, 10])
def test_a_queue_celery_declared_is_consumed_by_us_without_precondition_failed(
        queue_name: str, max_priority: int | None) -> None:
    app = celery_app(task_queue_max_priority=max_priority)
    result = app.send_task("apps.basic.add", args=(1, 2), queue=queue_name)  # declares the queue
    app.close()
    queue, got = task_queue(queue_name, Settings(task_queue_max_priority=max_priority)), []
    with connect() as connection:
        consumer = kombu.Consumer(connection.default_channel, [queue], no_ack=False,
                                  on_message=lambda message: (got.append(message), message.ack()))
        consumer.qos(prefetch_count=4, apply_global=True)
        consumer.consume()  # declares it again: must be equivalent
        drain(connection, lambda: len(got) == 1)
    assert got[0].headers["task"] == "apps.basic.add"
    assert got[0].headers["id"] == result.id


@pytest.mark.parametrize("max_priority", [None, 10])
def test_celery_publishes_to_and_consumes_from_a_queue_we_declared(
        queue_name: str, max_priority: int | None) -> None:
    queue = task_queue(queue_name, Settings(task_queue_max_priority=max_priority))
    with connect() as connection:
        queue(connection.default_channel).declare()
    app = celery_app(task_queue_max_priority=max_priority)
    app.send_task("apps.basic.add", args=(3, 4), queue=queue_name)  # declares: must be equivalent
    with app.connection_for_read() as connection:
        celery_queue = app.amqp.queues[queue_name]
        message = celery_queue(connection.default_channel).get(no_ack=True)
    app.close()
    assert message is not None and message.headers["task"] == "apps.basic.add"


@fast_path_only
def test_deliveries_on_a_kombu_hub_are_taken_whole_from_the_read_buffer(
        queue_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from worker_transport_amqp.channel import Connection

    taken: list[int] = []
    handle = Connection.on_decoded_delivery

    def on_decoded_delivery(self: Connection, delivery: Any) -> None:
        taken.append(delivery[4])
        handle(self, delivery)

    monkeypatch.setattr(Connection, "on_decoded_delivery", on_decoded_delivery)
    queue, got = task_queue(queue_name, Settings()), []
    with connect() as connection:
        publish(connection, queue, [{"n": n} for n in range(20)])
        consumer = kombu.Consumer(connection.default_channel, [queue], no_ack=False,
                                  on_message=lambda m: (got.append((m.payload["n"], m.delivery_tag)),
                                                        m.ack()))
        consumer.qos(prefetch_count=10, apply_global=True)
        consumer.consume()
        run_hub(connection, lambda: len(got) == 20)
    assert [n for n, _ in got] == list(range(20))
    assert taken and set(taken) <= {tag for _, tag in got}  # (one split across reads goes frame by frame)


def test_the_transport_module_loads_kombus_py_amqp_transport_only_when_connecting() -> None:
    import subprocess
    import sys

    code = ("import sys, worker_transport_amqp; from worker_core.app.settings import Settings; "
            "worker_transport_amqp.AmqpTransport('amqp://localhost//', Settings()); "
            "print('kombu.transport.pyamqp' in sys.modules)")
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert output.strip() == "False"


@fast_path_only
def test_acks_go_out_in_a_batch_and_never_cover_an_unacknowledged_message(queue_name: str) -> None:
    settings = Settings()
    queue = task_queue(queue_name, settings)
    with connect(settings) as connection:
        publish(connection, queue, [1, 2, 3, 4])
        got: list[Any] = []
        consumer = kombu.Consumer(connection.default_channel, [queue], on_message=got.append, no_ack=False)
        consumer.qos(prefetch_count=4)
        consumer.consume()
        drain(connection, lambda: len(got) == 4)
        channel = connection.default_channel
        for message in got[1:]:
            message.ack()  # 2, 3, 4 acknowledged; 1 (a long acks_late task, say) is not
        assert channel._acked == {m.delivery_tag for m in got[1:]}
        channel.flush_acks()
        assert not channel._acked and list(channel._delivered) == [got[0].delivery_tag]
    # the connection closed with message 1 unacknowledged: the broker gives back exactly that one
    assert redelivered(settings, queue, 1) == [1]
    with connect(settings) as connection:
        assert connection.default_channel.queue_declare(queue_name, passive=True).message_count == 0


@fast_path_only
def test_acks_wait_while_the_window_has_room_until_half_of_it_is_acked_or_the_hold_runs_out(
        queue_name: str) -> None:
    from worker_transport_amqp.channel import ACK_HOLD

    settings = Settings()
    queue = task_queue(queue_name, settings)
    with connect(settings) as connection:
        publish(connection, queue, list(range(6)))
        got: list[Any] = []
        consumer = kombu.Consumer(connection.default_channel, [queue], on_message=got.append, no_ack=False)
        consumer.qos(prefetch_count=8)  # a batch is 4; six delivered leave the window room
        consumer.consume()
        channel = connection.default_channel
        turns = Turns(connection)
        try:
            turns.until(lambda: len(got) == 6)
            got[0].ack()
            turns.turn()
            assert channel._acked == {got[0].delivery_tag}  # 1 of 8: held for company
            for message in got[1:3]:
                message.ack()
            turns.turn()
            assert len(channel._acked) == 3
            got[3].ack()
            turns.turn()
            assert not channel._acked  # half the window: sent
            assert list(channel._delivered) == [m.delivery_tag for m in got[4:]]
            quiet_until = time.monotonic() + 2 * ACK_HOLD  # the first hold's timer has fired
            turns.until(lambda: time.monotonic() > quiet_until)
            got[4].ack()
            held_at = time.monotonic()
            turns.turn()
            assert channel._acked == {got[4].delivery_tag}
            turns.until(lambda: not channel._acked)  # nothing else happens: the hold runs out
            assert time.monotonic() - held_at < ACK_HOLD + 0.2  # a timer sent it, no batch did
            assert list(channel._delivered) == [got[5].delivery_tag]
        finally:
            turns.close()
    # the connection closed with the sixth unacknowledged: the acks covered exactly the others
    assert redelivered(settings, queue, 1) == [5]


@fast_path_only
def test_acks_of_everything_delivered_wait_while_the_window_has_room_and_go_at_once_when_full(
        queue_name: str) -> None:
    from worker_transport_amqp.channel import ACK_HOLD

    settings = Settings()
    queue = task_queue(queue_name, settings)
    with connect(settings) as connection:
        publish(connection, queue, [1, 2, 3])
        got: list[Any] = []
        consumer = kombu.Consumer(connection.default_channel, [queue], on_message=got.append, no_ack=False)
        consumer.qos(prefetch_count=8)  # a batch is 4
        consumer.consume()
        channel = connection.default_channel
        turns = Turns(connection)
        try:
            turns.until(lambda: len(got) == 3)
            for message in got:
                message.ack()
            turns.turn()
            # all delivered are acknowledged, but the window has room: more would come without
            # these, so they wait for company (here none comes, and the hold sends them)
            assert len(channel._acked) == 3
            turns.until(lambda: not channel._acked)
            quiet_until = time.monotonic() + 2 * ACK_HOLD  # no hold timer left pending
            turns.until(lambda: time.monotonic() > quiet_until)
            publish(connection, queue, [4, 5, 6, 7])
            turns.until(lambda: len(got) == 7)
            channel.basic_qos(0, 4, False)  # the window is now what is delivered: full
            got[3].ack()  # less than a batch (2), but the broker sends nothing until it hears of it
            turns.turn()
            assert not channel._acked
            assert list(channel._delivered) == [m.delivery_tag for m in got[4:]]
        finally:
            turns.close()
    assert sorted(redelivered(settings, queue, 3)) == [5, 6, 7]


@fast_path_only
def test_half_the_window_acknowledged_goes_out_before_the_next_delivery_is_handled(
        queue_name: str) -> None:
    settings = Settings()
    queue = task_queue(queue_name, settings)
    with connect(settings) as connection:
        publish(connection, queue, [1, 2, 3, 4])
        channel = connection.default_channel
        held_on_arrival: list[int] = []

        def run_inline(message: Any) -> None:  # as the solo pool does: the task runs, then the next
            held_on_arrival.append(len(channel._acked))
            message.ack()

        consumer = kombu.Consumer(channel, [queue], on_message=run_inline, no_ack=False)
        consumer.qos(prefetch_count=4)  # a batch is 2
        turns = Turns(connection)
        try:
            consumer.consume()
            # all four arrived first: one read, one turn hands them all over
            wait_for(lambda: _deliveries_arrived(connection) == 4, message="the four deliveries")
            turns.until(lambda: len(held_on_arrival) == 4)
        finally:
            turns.close()
    # the third found the first two sent (without this, it would find 2 held and the fourth 3)
    assert held_on_arrival == [0, 1, 0, 1]


@fast_path_only
def test_acks_a_lost_connection_could_not_send_are_reported_and_the_messages_come_back(
        queue_name: str, caplog: pytest.LogCaptureFixture) -> None:
    settings = Settings()
    queue = task_queue(queue_name, settings)
    connection = connect(settings)
    try:
        publish(connection, queue, [1, 2])
        got: list[Any] = []
        consumer = kombu.Consumer(connection.default_channel, [queue], on_message=got.append, no_ack=False)
        consumer.consume()
        drain(connection, lambda: len(got) == 2)
        got[0].ack()  # gathered for the next flush, which never comes
        with caplog.at_level("ERROR", logger="worker_transport_amqp.channel"):
            connection.collect()  # what the worker does when the broker is gone
            assert ("Could not acknowledge 1 message(s): the connection was lost before they were sent; "
                    "RabbitMQ delivers them again") in caplog.text
            with pytest.raises(Exception, match="closed"):
                got[1].ack()  # the channel is gone: the caller hears of it, it is not swallowed
    finally:
        connection.release()
    assert sorted(redelivered(settings, queue, 2)) == [1, 2]


def test_a_task_waiting_before_the_worker_starts_runs_with_the_collector_on(
        workers, redis_url: str, queue_name: str) -> None:
    # The message is delivered as soon as the worker consumes, and a solo worker runs it inline
    # while its start goes on (the remote-control queue's declarations wait for RabbitMQ): the
    # collector, off during the start, is on by then.
    from apps import basic
    from workers import TESTS

    basic.app.conf.update(broker_url=AMQP_TEST_URL, result_backend=redis_url)
    try:
        result = basic.collector.apply_async(queue=queue_name)
        worker = workers.start("-Q", queue_name, pool="solo", broker=AMQP_TEST_URL, backend=redis_url,
                               env={"PYTHONPATH": str(TESTS)})
        seen = result.get(timeout=20)
    finally:
        basic.app.close()
    assert seen["enabled"] is True and seen["frozen"] > 1000
    log = worker.log()
    assert log.index(f"[{result.id}] received") < log.index(" ready.")  # it did run during the start
