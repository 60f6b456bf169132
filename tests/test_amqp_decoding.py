"""The AMQP content-header decoder and frame dispatcher: the same values as py-amqp's for any
header, the same errors for broken ones, and whole messages through a real RabbitMQ."""

from __future__ import annotations

import struct
import uuid
from datetime import datetime
from typing import Any

import kombu
import pytest
from amqp.basic_message import Message
from amqp.exceptions import UnexpectedFrame
from amqp.serialization import decode_properties_basic, dumps, loads
from amqp.spec import Basic, Channel
from conftest import require_server
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_amqp_transport import connect
from workers import drain

from worker_transport_amqp.decoding import Content, decode_basic_properties, deliver_arguments, frame_handler

leaves = (st.none() | st.booleans() | st.integers(-(2**63) + 1, 2**63 - 1) | st.floats(allow_nan=False)
          | st.text(max_size=30) | st.binary(max_size=30)
          | st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(2100, 1, 1)))
keys = st.text(max_size=20) | st.binary(max_size=20)
values = st.recursive(
    leaves, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(keys, inner, max_size=5),
    max_leaves=40)
short = st.text(max_size=60)
properties = st.fixed_dictionaries({}, optional={
    "content_type": short, "content_encoding": short,
    "application_headers": st.dictionaries(keys, values, max_size=25),
    "delivery_mode": st.integers(0, 255), "priority": st.integers(0, 255),
    "correlation_id": short, "reply_to": short, "expiration": short, "message_id": short,
    "timestamp": st.integers(0, 2**63), "type": short, "user_id": short, "app_id": short,
    "cluster_id": short,
})


def encoded(props: dict[str, Any]) -> bytes:
    return bytes(Message(b"", **props)._serialize_properties())


def outcome(decode: Any, raw: bytes) -> tuple[str, str]:
    """What a decoder makes of ``raw``: the value's repr (types included), or the error type."""
    try:
        return "value", repr(decode(raw, 0))
    except Exception as exc:
        return "error", type(exc).__name__


def celery_headers() -> dict[str, Any]:
    task_id = str(uuid.uuid4())
    return {"lang": "py", "task": "proj.add", "id": task_id, "shadow": None, "eta": None, "expires": None,
            "group": None, "group_index": None, "retries": 0, "timelimit": [None, 30],
            "root_id": task_id, "parent_id": None, "argsrepr": "(2, 2)", "kwargsrepr": "{}",
            "origin": "gen1@host", "ignore_result": False, "stamped_headers": None, "stamps": {}}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(properties)
def test_any_content_header_decodes_to_exactly_what_py_amqp_reads(props: dict[str, Any]) -> None:
    raw = encoded(props)
    ours = outcome(decode_basic_properties, raw)
    assert ours == outcome(decode_properties_basic, raw)
    assert ours[0] == "value"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(properties, st.data())
def test_a_broken_content_header_fails_or_decodes_as_py_amqp_has_it(props: dict[str, Any], data: Any) -> None:
    raw = bytearray(encoded(props))
    if data.draw(st.booleans(), label="truncate") or not raw:
        raw = raw[:data.draw(st.integers(0, len(raw)), label="cut")]
    else:
        at = data.draw(st.integers(0, len(raw) - 1), label="at")
        raw[at] = data.draw(st.integers(0, 255), label="byte")
    assert outcome(decode_basic_properties, bytes(raw)) == outcome(decode_properties_basic, bytes(raw))


def test_a_header_that_is_not_utf_8_keeps_py_amqps_bytes() -> None:
    raw = encoded({"application_headers": {b"\xff\xfe": b"\xc3\x28", "task": "proj.add"}})
    decoded, _ = decode_basic_properties(raw, 0)
    assert decoded == {"application_headers": {b"\xff\xfe": b"\xc3\x28", "task": "proj.add"}}


shortstr = st.text(max_size=80).filter(lambda text: len(text.encode("utf-8", "surrogatepass")) <= 255)


def deliver_payload(consumer_tag: str, tag: int, redelivered: bool, exchange: str, key: str) -> bytes:
    return struct.pack(">HH", *Basic.Deliver) + bytes(dumps("sLbss", [consumer_tag, tag, redelivered,
                                                                     exchange, key]))


@settings(max_examples=300, deadline=None)
@given(shortstr, st.integers(0, 2**64 - 1), st.booleans(), shortstr, shortstr, st.data())
def test_basic_deliver_arguments_read_as_py_amqp_reads_them(consumer_tag: str, tag: int, redelivered: bool,
                                                            exchange: str, key: str, data: Any) -> None:
    payload = deliver_payload(consumer_tag, tag, redelivered, exchange, key)
    assert deliver_arguments(payload) == tuple(loads("sLbss", payload, 4)[0])
    # cut short: the same values, or an error that sends the frame down py-amqp's own path
    cut = payload[:data.draw(st.integers(4, len(payload)), label="cut")]
    ours = outcome(lambda raw, _: deliver_arguments(raw), cut)
    if ours != ("error", "IndexError"):
        assert ours == outcome(lambda raw, _: tuple(loads("sLbss", raw, 4)[0]), cut)


def frames_of(props: dict[str, Any], body: bytes, channel: int = 1,
              chunk: int = 0) -> list[tuple[int, int, bytes]]:
    """The frames RabbitMQ sends for one ``basic.deliver``, the body cut in ``chunk``-byte frames."""
    method = struct.pack(">HH", *Basic.Deliver) + bytes(dumps("sLbss", ["ctag", 7, False, "ex", "rk"]))
    header = struct.pack(">HHQ", Basic.CLASS_ID, 0, len(body)) + encoded(props)
    frames = [(1, channel, method), (2, channel, header)]
    step = chunk or max(len(body), 1)
    frames += [(3, channel, body[i:i + step]) for i in range(0, len(body), step)]
    return frames


class FakeConnection:
    bytes_recv = 0


def test_the_frame_handler_hands_over_whole_messages_heartbeats_anywhere() -> None:
    got: list[tuple[Any, ...]] = []
    handle = frame_handler(FakeConnection(), lambda *args: got.append(args))
    headers = celery_headers()
    props = {"content_type": "application/json", "application_headers": headers}
    frames = frames_of(props, b"x" * 10, chunk=4)
    frames.insert(2, (8, 0, b""))  # a heartbeat between the header and the body
    results = [handle(frame) for frame in frames]
    assert results == [False, False, False, False, False, True]
    [(channel, method, _, content)] = got
    assert (channel, method) == (1, Basic.Deliver)
    assert isinstance(content, Content)
    assert content.body == b"x" * 10
    assert content.properties == props
    # a method without content goes straight through; an empty body needs no body frame
    assert handle((1, 1, struct.pack(">HH", *Channel.CloseOk))) is True
    assert got[-1][1] == Channel.CloseOk
    assert [handle(frame) for frame in frames_of({}, b"", channel=2)] == [False, True]
    assert got[-1][3].body == "" and got[-1][3].properties == {}  # py-amqp's empty body


class DeliveringConnection(FakeConnection):
    def __init__(self) -> None:
        self.delivered: list[tuple[Any, ...]] = []

    def on_delivery(self, *args: Any) -> None:
        self.delivered.append(args)


def test_a_delivery_goes_whole_to_the_connections_on_delivery_and_other_content_to_the_callback() -> None:
    connection = DeliveringConnection()
    others: list[tuple[Any, ...]] = []
    handle = frame_handler(connection, lambda *args: others.append(args))
    props = {"content_type": "application/json", "application_headers": celery_headers()}
    frames = frames_of(props, b"0123456789", chunk=3)
    assert [handle(frame) for frame in frames] == [False, False, False, False, False, True]
    [(channel, arguments, properties, body)] = connection.delivered
    assert (channel, arguments, properties, body) == (1, frames[0][2], props, b"0123456789")
    assert [handle(frame) for frame in frames_of({}, b"", channel=3)] == [False, True]
    assert connection.delivered[-1][2:] == ({}, "")  # py-amqp's empty body
    assert not others
    # basic.get-ok carries content too, but py-amqp's own code handles it: its message, as before
    get_ok = struct.pack(">HH", *Basic.GetOk) + bytes(dumps("LbssL", [9, False, "ex", "rk", 0]))
    header = struct.pack(">HHQ", Basic.CLASS_ID, 0, 2) + encoded(props)
    results = [handle(frame) for frame in [(1, 2, get_ok), (2, 2, header), (3, 2, b"hi")]]
    assert results == [False, False, True]
    [(channel, method, arguments, content)] = others
    assert (channel, method, arguments) == (2, Basic.GetOk, get_ok)
    assert isinstance(content, Content) and content.body == b"hi" and content.properties == props
    assert content.ready and content.body_size == 2


def test_a_frame_out_of_order_is_refused() -> None:
    handle = frame_handler(FakeConnection(), lambda *args: None)
    method, _, body = frames_of({}, b"abc")
    with pytest.raises(UnexpectedFrame, match="expecting type: 1"):
        handle(body)
    handle(method)
    with pytest.raises(UnexpectedFrame, match="expecting type: 2"):
        handle(method)


def test_celery_headers_come_through_rabbitmq_unchanged() -> None:
    require_server(5672, "RabbitMQ")
    headers = celery_headers()
    headers.update({"nested": {"list": [1, "two", None, True, {"x": -(2**40)}]}, "ratio": 0.25})
    name = f"wt-{uuid.uuid4().hex[:10]}"
    got: list[Any] = []
    with connect() as connection:
        queue = kombu.Queue(name, routing_key=name)
        try:
            producer = kombu.Producer(connection.default_channel)
            producer.publish({"n": 1}, exchange="", routing_key=name, declare=[queue], headers=headers)
            consumer = kombu.Consumer(connection.default_channel, [queue], no_ack=True,
                                      callbacks=[lambda body, message: got.append((body, message.headers))])
            with consumer:
                drain(connection, lambda: got)
        finally:
            connection.default_channel.queue_delete(name)
    assert got == [({"n": 1}, headers)]


def test_a_consumer_gets_kombus_message_with_what_py_amqps_path_would_give_it() -> None:
    require_server(5672, "RabbitMQ")
    from kombu.transport.pyamqp import Message as KombuMessage

    from worker_transport_amqp.channel import DeliveredMessage

    headers = celery_headers()
    name = f"wt-{uuid.uuid4().hex[:10]}"
    got: list[Any] = []
    with connect() as connection:
        channel = connection.default_channel
        queue = kombu.Queue(name, routing_key=name)
        try:
            producer = kombu.Producer(channel)
            producer.publish({"n": 1}, exchange="", routing_key=name, declare=[queue], headers=headers,
                             correlation_id="c-1", reply_to="replies", priority=3)
            consumer = kombu.Consumer(channel, [queue], on_message=got.append, no_ack=False)
            with consumer:
                drain(connection, lambda: got)
            [message] = got
            assert isinstance(message, DeliveredMessage)
            # what kombu makes of py-amqp's message for the same delivery
            raw = Message(message.body, channel=channel, **message.properties)
            raw.delivery_info = message.delivery_info
            expected = KombuMessage(raw, channel=channel)
            for field in ("body", "delivery_tag", "content_type", "content_encoding", "delivery_info",
                          "properties", "headers", "channel"):
                assert getattr(message, field) == getattr(expected, field), field
            assert message.delivery_info["routing_key"] == name and message.delivery_info["exchange"] == ""
            assert message.headers == headers and message.decode() == {"n": 1}
            message.ack()
        finally:
            channel.queue_delete(name)


def test_a_delivery_for_a_consumer_that_is_gone_is_given_back_as_py_amqp_does() -> None:
    require_server(5672, "RabbitMQ")
    with connect() as connection:
        channel = connection.default_channel
        sent: list[tuple[Any, ...]] = []
        channel.send_method = lambda method, argsig, args=(), **kw: sent.append((method, *args))
        arguments = dumps("sLbss", ["no-such-consumer", 42, False, "", "rk"])
        payload = struct.pack(">HH", *Basic.Deliver) + bytes(arguments)
        channel.on_delivery(payload, {}, b"{}")
        assert sent == [(Basic.Reject, 42, True)]  # requeued, not left unacknowledged
        assert 42 not in channel._delivered
