"""The AMQP content-header decoder, frame dispatcher and whole-delivery reader (C and Python):
the same values as py-amqp's for any header, the same errors for broken ones (or the frames left
to py-amqp), and whole messages through a real RabbitMQ."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any
from unittest import mock

import kombu
import pytest
from amqp import serialization
from amqp.basic_message import Message
from amqp.exceptions import UnexpectedFrame
from amqp.serialization import decode_properties_basic, dumps, loads
from amqp.spec import Basic, Channel
from conftest import require_server
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_amqp_transport import connect, fast_path_only
from workers import drain

from worker_transport_amqp import delivery
from worker_transport_amqp.decoding import (
    Content,
    FrameHandler,
    UnreadableProperties,
    decode_basic_properties,
    deliver_arguments,
)
from worker_transport_amqp.delivery import MAX_DEPTH, next_delivery_python
from worker_transport_amqp.reading import BufferedTCPTransport

try:
    from worker_transport_amqp._speedups import next_delivery as next_delivery_c
except ImportError:  # (built without a compiler: see c_version)
    next_delivery_c = None  # type: ignore[assignment]

datetimes = st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(2100, 1, 1))
plain_leaves = (st.none() | st.booleans() | st.integers(-(2**63) + 1, 2**63 - 1) | st.floats(allow_nan=False)
                | st.text(max_size=30) | st.binary(max_size=30))
keys = st.text(max_size=20) | st.binary(max_size=20)
short = st.text(max_size=60)


def properties_of(leaves: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Basic properties whose headers hold ``leaves`` in nested tables and arrays."""
    values = st.recursive(
        leaves, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(keys, inner, max_size=5),
        max_leaves=40)
    return st.fixed_dictionaries({}, optional={
        "content_type": short, "content_encoding": short,
        "application_headers": st.dictionaries(keys, values, max_size=25),
        "delivery_mode": st.integers(0, 255), "priority": st.integers(0, 255),
        "correlation_id": short, "reply_to": short, "expiration": short, "message_id": short,
        "timestamp": st.integers(0, 2**63), "type": short, "user_id": short, "app_id": short,
        "cluster_id": short,
    })


properties = properties_of(plain_leaves | datetimes)


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
    return deliver_frames(encoded(props), body, channel, chunk)


def deliver_frames(properties: bytes, body: bytes, channel: int = 1, chunk: int = 0,
                   arguments: tuple[str, int, bool, str, str] = ("ctag", 7, False, "ex", "rk"),
                   ) -> list[tuple[int, int, bytes]]:
    """The same, from the content header's encoded properties (flags first)."""
    header = struct.pack(">HHQ", Basic.CLASS_ID, 0, len(body)) + properties
    frames = [(1, channel, deliver_payload(*arguments)), (2, channel, header)]
    step = chunk or max(len(body), 1)
    frames += [(3, channel, body[i:i + step]) for i in range(0, len(body), step)]
    return frames


class FakeConnection:
    bytes_recv = 0


def test_the_frame_handler_hands_over_whole_messages_heartbeats_anywhere() -> None:
    got: list[tuple[Any, ...]] = []
    handle = FrameHandler(FakeConnection(), lambda *args: got.append(args))
    headers = celery_headers()
    props = {"content_type": "application/json", "application_headers": headers}
    frames = frames_of(props, b"x" * 10, chunk=4)
    frames.insert(2, (8, 0, b""))  # a heartbeat between the header and the body
    results = []
    for frame in frames:
        results.append(handle(frame))
        assert handle.receiving is not results[-1]  # a message partly received, until it is whole
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
    handle = FrameHandler(connection, lambda *args: others.append(args))
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
    handle = FrameHandler(FakeConnection(), lambda *args: None)
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


@fast_path_only
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


@fast_path_only
@pytest.mark.parametrize("whole", [False, True], ids=["frame by frame", "whole"])
def test_a_delivery_for_a_consumer_that_is_gone_is_given_back_as_py_amqp_does(whole: bool) -> None:
    require_server(5672, "RabbitMQ")
    with connect() as connection:
        channel = connection.default_channel
        sent: list[tuple[Any, ...]] = []
        channel.send_method = lambda method, argsig, args=(), **kw: sent.append((method, *args))
        arguments = dumps("sLbss", ["no-such-consumer", 42, False, "", "rk"])
        payload = struct.pack(">HH", *Basic.Deliver) + bytes(arguments)
        if whole:
            buffer = wire([(1, channel.channel_id, payload),
                           (2, channel.channel_id, struct.pack(">HHQ", Basic.CLASS_ID, 0, 2) + encoded({})),
                           (3, channel.channel_id, b"{}")])
            connection.connection.on_decoded_delivery(next_delivery_python(buffer))
        else:
            channel.on_delivery(payload, {}, b"{}")
        assert sent == [(Basic.Reject, 42, True)]  # requeued, not left unacknowledged
        assert 42 not in channel._delivered


# -- a delivered message taken whole from the read buffer (C and Python) -------------------------


def c_version() -> Callable[[bytes], Any]:
    """The C extension's ``next_delivery``: without it the test skips, and fails when CI is set."""
    if next_delivery_c is None:
        if os.environ.get("CI"):
            pytest.fail("worker_transport_amqp._speedups (the C extension) was not built and CI is set")
        pytest.skip("worker_transport_amqp._speedups (the C extension) was not built")
    return next_delivery_c


def version(name: str) -> Callable[[bytes], Any]:
    return c_version() if name == "c" else next_delivery_python


VERSIONS = ["c", "python"]


def wire(frames: list[tuple[int, int, bytes]]) -> bytes:
    return b"".join(struct.pack(">BHI", kind, channel, len(payload)) + payload + b"\xce"
                    for kind, channel, payload in frames)


def same(ours: Any, expected: Any) -> bool:
    """Equal values of the same types (True is not 1, b"" is not ""), NaN included."""
    return repr(ours) == repr(expected)


def frame_by_frame(buffer: bytes) -> tuple[Any, ...] | str:
    """What the frame handler makes of ``buffer`` frame by frame, up to its first delivered
    message: ``next_delivery``'s tuple for it, or why there is none (an error's name)."""
    transport = BufferedTCPTransport("127.0.0.1:5672")  # not connected: only its buffer is used
    transport._read_buffer = buffer
    connection = DeliveringConnection()
    others: list[Any] = []
    handle = FrameHandler(connection, lambda *args: others.append(args))
    try:
        while not connection.delivered:
            frame = transport.next_frame()
            if frame is None or others:
                return "incomplete" if frame is None else "another method"
            handle(frame)
        [(channel, payload, props, body)] = connection.delivered
        arguments = deliver_arguments(payload)
    except Exception as exc:
        return type(exc).__name__
    return (len(buffer) - len(transport._read_buffer), channel, payload, *arguments, props, body,
            connection.bytes_recv)


def left_to_python(header: bytes) -> bool:
    """Whether py-amqp, decoding this content header, reads what the C version leaves to Python:
    a 'D' (Decimal) or 'T' (datetime) item, or tables and arrays nested deeper than MAX_DEPTH."""
    read_item = serialization._read_item
    depth = 0  # of the table or array the item is in (the headers' own table is 1)
    found = []

    def reading(buf: bytes, offset: int) -> Any:
        nonlocal depth
        kind = buf[offset:offset + 1]
        if kind in (b"D", b"T") or (kind in (b"F", b"A") and depth + 1 > MAX_DEPTH):
            found.append(kind)
        depth += 1
        try:
            return read_item(buf, offset)
        finally:
            depth -= 1

    with mock.patch.object(serialization, "_read_item", reading):
        depth = 1
        try:
            decode_properties_basic(header, 12)
        except Exception:
            pass
    return bool(found)


def header_of(buffer: bytes) -> bytes:
    """The payload of the second frame in ``buffer`` (a delivery's content header)."""
    start = 8 + struct.unpack_from(">I", buffer, 3)[0]
    return buffer[start + 7:start + 7 + struct.unpack_from(">I", buffer, start + 3)[0]]


def check(buffer: bytes, expected: tuple[Any, ...] | str) -> None:
    """Both versions read ``buffer`` as the frame handler does, or leave it to the frame handler;
    the C version leaves to it what the Python one does, and what :func:`left_to_python` names."""
    python = next_delivery_python(buffer)
    ours = c_version()(buffer)
    assert python is None or same(python, expected)
    if python is None:
        assert ours is None
    elif ours is None:
        assert left_to_python(header_of(buffer))
    else:
        assert same(ours, python)


def utf_8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def sized(letter: bytes, data: bytes) -> bytes:
    return letter + struct.pack(">I", len(data)) + data


def table(items: list[tuple[bytes, bytes]]) -> bytes:
    return b"".join(bytes([len(key)]) + key + value for key, value in items)


def fixed(letter: bytes, size: int) -> st.SearchStrategy[bytes]:
    return st.binary(min_size=size, max_size=size).map(lambda raw: letter + raw)


# Table items written byte by byte, every type letter py-amqp reads, any bit pattern (NaNs,
# negative numbers, text that is not UTF-8, surrogates)
texts = st.text(st.characters(exclude_categories=()), max_size=20).map(utf_8)
item_leaves = st.one_of(
    (texts | st.binary(max_size=20)).map(lambda data: sized(b"S", data)),
    st.binary(max_size=20).map(lambda data: sized(b"x", data)),
    *(fixed(letter, size) for letter, size in ((b"s", 2), (b"b", 1), (b"B", 1), (b"U", 2), (b"u", 2),
                                               (b"I", 4), (b"i", 4), (b"L", 8), (b"l", 8), (b"f", 4),
                                               (b"d", 8), (b"t", 1), (b"D", 5))),
    st.just(b"V"),
    (st.integers(0, 2**32) | st.integers(0, 2**64 - 1)).map(lambda time: b"T" + struct.pack(">Q", time)),
)
item_keys = texts | st.binary(max_size=12)
items = st.recursive(
    item_leaves,
    lambda inner: (st.lists(inner, max_size=5).map(lambda values: sized(b"A", b"".join(values)))
                   | st.lists(st.tuples(item_keys, inner), max_size=5).map(
                       lambda pairs: sized(b"F", table(pairs)))),
    max_leaves=30)
short_strings = texts.map(lambda data: bytes([len(data)]) + data)  # (py-amqp refuses any other)
octet = st.binary(min_size=1, max_size=1)

#: the basic properties by flag bit, in the order they are written
PROPERTY_BITS = (("content_type", 0x8000), ("content_encoding", 0x4000), ("application_headers", 0x2000),
                 ("delivery_mode", 0x1000), ("priority", 0x0800), ("correlation_id", 0x0400),
                 ("reply_to", 0x0200), ("expiration", 0x0100), ("message_id", 0x0080), ("timestamp", 0x0040),
                 ("type", 0x0020), ("user_id", 0x0010), ("app_id", 0x0008), ("cluster_id", 0x0004))
headers_tables = st.lists(st.tuples(item_keys, items), max_size=15).map(lambda kv: sized(b"", table(kv)))
written_properties = st.fixed_dictionaries({}, optional={
    "content_type": short_strings, "content_encoding": short_strings, "application_headers": headers_tables,
    "delivery_mode": octet, "priority": octet, "correlation_id": short_strings, "reply_to": short_strings,
    "expiration": short_strings, "message_id": short_strings, "timestamp": st.binary(min_size=8, max_size=8),
    "type": short_strings, "user_id": short_strings, "app_id": short_strings, "cluster_id": short_strings,
}).map(lambda fields: struct.pack(">H", sum(bit for name, bit in PROPERTY_BITS if name in fields))
       + b"".join(fields[name] for name, _ in PROPERTY_BITS if name in fields))
arguments = st.tuples(shortstr, st.integers(0, 2**64 - 1), st.booleans(), shortstr, shortstr)
trailing = st.sampled_from([b"", wire([(8, 0, b"")]), wire([(1, 1, b"\x00\x3c")])[:9]])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(properties_of(plain_leaves), st.binary(max_size=200), st.integers(0, 70), arguments, trailing)
def test_a_delivery_encoded_by_py_amqp_is_read_whole_with_py_amqps_values(
        props: dict[str, Any], body: bytes, chunk: int, args: tuple[str, int, bool, str, str],
        after: bytes) -> None:
    frames = deliver_frames(encoded(props), body, channel=5, chunk=chunk, arguments=args)
    buffer = wire(frames) + after
    expected = frame_by_frame(buffer)
    ours = c_version()(buffer)
    assert same(ours, expected) and same(next_delivery_python(buffer), expected)
    assert same(ours[8], decode_properties_basic(frames[1][2], 12)[0])
    assert ours[0] == len(buffer) - len(after) and ours[10] == len(frames)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(written_properties, st.binary(max_size=100), st.integers(0, 40), arguments)
def test_every_table_type_is_read_as_py_amqp_reads_it_or_left_to_python(
        props: bytes, body: bytes, chunk: int, args: tuple[str, int, bool, str, str]) -> None:
    frames = deliver_frames(props, body, chunk=chunk, arguments=args)
    buffer = wire(frames)
    expected = frame_by_frame(buffer)
    try:
        theirs = decode_properties_basic(frames[1][2], 12)[0]
    except Exception as exc:  # text that is not UTF-8 in a short string, a timestamp out of range
        # The delivery still goes on, with no properties and the reason, to be rejected.
        assert not isinstance(expected, str) and isinstance(expected[8], UnreadableProperties)
        assert expected[8] == {} and type(exc).__name__ in expected[8].reason
        assert next_delivery_python(buffer) is None and c_version()(buffer) is None
        return
    assert same(expected[8], theirs)
    check(buffer, expected)
    if not left_to_python(frames[1][2]):
        assert c_version()(buffer) is not None


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(written_properties, st.binary(max_size=60), st.integers(0, 20), st.data())
def test_a_cut_or_damaged_delivery_is_read_as_frame_by_frame_or_left_to_the_frame_handler(
        props: bytes, body: bytes, chunk: int, data: Any) -> None:
    frames = deliver_frames(props, body, chunk=chunk)
    buffer = bytearray(wire(frames))
    header = range(8 + len(frames[0][2]) + 7, 8 + len(frames[0][2]) + 7 + len(frames[1][2]))
    for _ in range(data.draw(st.integers(1, 3), label="changes")):
        change = data.draw(st.sampled_from(["cut", "header byte", "header byte", "any byte"]), label="change")
        if change == "cut" or not buffer:
            buffer = buffer[:data.draw(st.integers(0, len(buffer)), label="at")]
        else:
            anywhere = st.integers(0, len(buffer) - 1)
            at = data.draw(st.sampled_from(header) if change == "header byte" else anywhere, label="at")
            if at < len(buffer):
                buffer[at] = data.draw(st.integers(0, 255), label="byte")
    check(bytes(buffer), frame_by_frame(bytes(buffer)))


@pytest.mark.parametrize("name", VERSIONS)
def test_deliveries_back_to_back_are_taken_one_at_a_time(name: str) -> None:
    next_delivery = version(name)
    props = {"content_type": "application/json", "application_headers": celery_headers()}
    messages = [deliver_frames(encoded(props), b"x" * 100, channel=1, chunk=30),  # 4 body frames
                deliver_frames(encoded({}), b"", channel=2),  # no body frame
                deliver_frames(encoded(props), b"[[], {}, {}]", channel=1, arguments=("c", 9, True, "", "q"))]
    rest = wire(messages[0])[:-1]  # a delivery still arriving
    buffer = b"".join(wire(frames) for frames in messages) + rest
    taken = []
    while (got := next_delivery(buffer)) is not None:
        assert same(got, frame_by_frame(buffer))
        taken.append(got)
        buffer = buffer[got[0]:]
    assert buffer == rest
    assert [(got[1], got[3:8], got[9], got[10]) for got in taken] == [
        (1, ("ctag", 7, False, "ex", "rk"), b"x" * 100, 6),
        (2, ("ctag", 7, False, "ex", "rk"), "", 2),  # py-amqp's body for a message without one
        (1, ("c", 9, True, "", "q"), b"[[], {}, {}]", 3),
    ]
    assert taken[0][8] == props and taken[1][8] == {}


@pytest.mark.parametrize("name", VERSIONS)
def test_what_is_not_one_whole_delivery_is_left_to_the_frame_handler(name: str) -> None:
    next_delivery = version(name)
    method, header, *body = deliver_frames(encoded({"content_type": "text/plain"}), b"0123456789", chunk=4)
    whole = wire([method, header, *body])
    assert next_delivery(whole) is not None
    for size in range(len(whole)):
        assert next_delivery(whole[:size]) is None  # more to come
    get_ok = (1, 1, struct.pack(">HH", *Basic.GetOk) + bytes(dumps("LbssL", [9, False, "ex", "rk", 0])))
    other_class = (2, 1, struct.pack(">HHQ", 50, 0, 10) + header[2][12:])
    for frames in (
        [(8, 0, b""), method, header, *body],  # a heartbeat first
        [method, header, body[0], (3, 2, b"xx"), *body[1:]],  # another channel's frame in between
        [method, (2, 2, header[2]), *body],  # the header on another channel
        [method, header, body[0], (8, 0, b""), *body[1:]],  # a heartbeat in between
        [get_ok, header, *body],  # another method with content
        [method, other_class, *body],  # content of another class
        [method, header, body[0], body[1], (3, 1, body[2][2] + b"!")],  # body frames adding up to more
        [method, (2, 1, header[2] + b"\x00"), *body],  # a byte too many in the header
        [(1, 1, method[2] + b"\x00"), header, *body],  # and in the method
        [method, (2, 1, header[2][:-1]), *body],  # a byte too few
        [(1, 1, method[2][:5] + b"\xff\xfe\xfd\xfc" + method[2][9:]), header, *body],  # a tag not UTF-8
        [method, (2, 1, header[2][:15] + b"\xff" + header[2][16:]), *body],  # a content type not UTF-8
    ):
        assert next_delivery(wire(frames)) is None
    for end in (7 + len(method[2]), len(whole) - 1):  # not a frame end: next_frame raises
        assert next_delivery(whole[:end] + b"\x00" + whole[end + 1:]) is None


def test_the_c_version_leaves_rare_types_and_deep_nesting_to_python() -> None:
    next_delivery = c_version()

    def headers(*pairs: tuple[bytes, bytes]) -> bytes:
        return struct.pack(">H", 0x2000) + sized(b"", table(list(pairs)))

    def nested(depth: int) -> bytes:
        """Headers holding tables and arrays ``depth`` deep (the headers' own table included)."""
        value = b"V"
        for level in range(depth - 1):
            value = sized(b"A", value) if level % 2 else sized(b"F", table([(b"k", value)]))
        return headers((b"top", value))

    for props, python_reads_it in ((encoded({"application_headers": {"eta": datetime(2030, 1, 2)}}), True),
                                   (headers((b"d", b"D\x02\x00\x00\x01\x00")), True),  # Decimal("0.01")
                                   (headers((b"q", b"Q")), False),  # a letter py-amqp refuses
                                   (nested(MAX_DEPTH + 1), True), (nested(2_000), False)):
        buffer = wire(deliver_frames(props, b"{}"))
        python = next_delivery_python(buffer)
        assert next_delivery(buffer) is None
        assert (python is not None) is python_reads_it
        if python is not None:
            assert same(python, frame_by_frame(buffer))
    buffer = wire(deliver_frames(nested(MAX_DEPTH), b"{}"))
    assert same(next_delivery(buffer), next_delivery_python(buffer))
    with pytest.raises(TypeError, match="needs bytes"):
        next_delivery(bytearray(buffer))  # type: ignore[arg-type]


def test_the_c_extension_is_built_and_used_on_ci() -> None:
    if not os.environ.get("CI"):
        pytest.skip("a laptop may lack a compiler; on CI the extension must be there")
    from worker_transport_amqp import _speedups  # an ImportError fails the test

    forced = os.environ.get("WORKER_NO_EXTENSIONS", "") not in ("", "0")
    assert delivery.next_delivery is (next_delivery_python if forced else _speedups.next_delivery)


def test_worker_no_extensions_forces_the_python_version() -> None:
    def used(**env: str) -> str:
        code = "from worker_transport_amqp import delivery; print(delivery.next_delivery.__module__)"
        base = {name: value for name, value in os.environ.items() if name != "WORKER_NO_EXTENSIONS"}
        return subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True,
                              text=True, check=True).stdout.strip()

    assert used(WORKER_NO_EXTENSIONS="1") == "worker_transport_amqp.delivery"
    built = next_delivery_c is not None
    assert used() == ("worker_transport_amqp._speedups" if built else "worker_transport_amqp.delivery")
