"""Hypothesis strategies for what a broker hands the worker below the task protocol: kombu's
envelopes on Redis and in the embedded transport's file, and AMQP content headers, malformed in
every way a producer (or a broker passing bytes through) can make them, each with the reason the
worker must give when it rejects it and the error a client waiting on its result must get."""

from __future__ import annotations

import base64
import json
import struct
import uuid
from typing import Any

import amqp
import attrs
from hypothesis import strategies as st

from worker_core.exceptions import ContentDisallowed, DecodeError, NotRegistered, ProtocolError

JSON = "application/json"
TASK = "apps.basic.record"


@attrs.frozen
class Bad:
    """A malformed delivery: what goes into the broker, the words its rejection line must
    contain, and, when it names a task id, the error a client's ``get()`` must raise."""

    raw: Any
    reason: str
    task_id: str | None = None
    raises: type[BaseException] | None = None


@attrs.frozen
class Raw:
    """A well-formed delivery put straight into the broker, unusual in a way that must not
    matter: its task records ``task_id`` in the runs file once, and returns it."""

    raw: Any
    task_id: str


def _id() -> str:
    return f"env-{uuid.uuid4()}"


def task_headers(task_id: str, task: str = TASK) -> dict[str, Any]:
    return {"lang": "py", "task": task, "id": task_id, "retries": 0, "timelimit": [None, None],
            "root_id": task_id, "parent_id": None, "argsrepr": "()", "kwargsrepr": "{}", "origin": "fuzz"}


def task_body(path: str = "/dev/null", value: str = "x") -> bytes:
    return json.dumps([[path, value], {}, {"callbacks": None, "errbacks": None, "chain": None,
                                           "chord": None}]).encode()


# -- kombu's envelope (Redis lists, embedded rows) ----------------------------------------------


def kombu_envelope(queue: str, task_id: str, *, body: Any = None, headers: Any = None,
                   content_type: Any = JSON, content_encoding: Any = "utf-8", body_encoding: Any = "base64",
                   delivery_info: Any = None, tag: Any = None, extra_properties: dict[str, Any] | None = None,
                   ) -> dict[str, Any]:
    """An envelope exactly as kombu's virtual transports write it (keys in kombu's order, the
    delivery tag last: the Redis fetch script reads it from the tail), with parts replaced."""
    if body is None:
        body = base64.b64encode(task_body()).decode()
    properties = {"correlation_id": task_id, "reply_to": "", "delivery_mode": 2,
                  "delivery_info": {"exchange": "", "routing_key": queue} if delivery_info is None
                  else delivery_info,
                  "priority": 0, "body_encoding": body_encoding, **(extra_properties or {}),
                  "delivery_tag": str(uuid.uuid4()) if tag is None else tag}
    return {"body": body, "content-encoding": content_encoding, "content-type": content_type,
            "headers": task_headers(task_id) if headers is None else headers, "properties": properties}


def _text(envelope: Any) -> str:
    return json.dumps(envelope)


not_json_texts = st.one_of(
    st.binary(min_size=1, max_size=80).map(lambda b: b.decode("latin-1")),
    st.sampled_from(['{"body": ', "{'single': 'quotes'}", "[1, 2", "nope", '{"a": NaN-}', "\x00\x01"]),
).filter(lambda text: not _is_json(text))


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


json_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=10),
                         st.lists(st.integers(), max_size=3))


@st.composite
def broken_envelopes(draw: st.DrawFn, queue: str, *, tags: bool) -> Bad:
    """A malformed kombu envelope for ``queue``. ``tags``: the transport reads the delivery tag
    from the envelope (Redis); the embedded transport gives every delivery its own."""
    task_id = _id()
    kinds = ["not json", "not an object", "no properties", "bad properties", "bad delivery_info",
             "unknown body_encoding", "body not base64", "bad content-type", "headers not a mapping",
             "deep", "compression", "pickle", "unknown task"]
    if tags:
        kinds += ["no tag"]
    kind = draw(st.sampled_from(kinds))
    if kind == "not json":
        return Bad(draw(not_json_texts), "its envelope is not JSON")
    if kind == "not an object":
        return Bad(_text(draw(json_scalars)), "its envelope must be a JSON object")
    if kind == "no properties":
        envelope = kombu_envelope(queue, task_id)
        del envelope["properties"]
        return Bad(_text(envelope), "its envelope's 'properties' must be an object")
    if kind == "bad properties":
        envelope = kombu_envelope(queue, task_id)
        envelope["properties"] = draw(json_scalars)
        return Bad(_text(envelope), "its envelope's 'properties' must be an object")
    if kind == "bad delivery_info":
        info = draw(st.one_of(st.text(max_size=5), st.integers(), st.lists(st.integers(), max_size=2)))
        return Bad(_text(kombu_envelope(queue, task_id, delivery_info=info)),
                   "its 'delivery_info' must be an object", task_id, ProtocolError)
    if kind == "unknown body_encoding":
        encoding = draw(st.one_of(st.sampled_from(["rot13", "base32", "hex", "gzip"]), st.integers(1, 9)))
        return Bad(_text(kombu_envelope(queue, task_id, body_encoding=encoding)),
                   "is not one kombu knows", task_id, DecodeError)
    if kind == "body not base64":
        body = draw(st.sampled_from(["!!!notbase64=", "abc", "a===", "abcde"]))
        return Bad(_text(kombu_envelope(queue, task_id, body=body)), "its body is not valid base64",
                   task_id, DecodeError)
    if kind == "bad content-type":
        value = draw(st.one_of(st.integers(), st.booleans(), st.lists(st.text(max_size=3), max_size=2)))
        return Bad(_text(kombu_envelope(queue, task_id, content_type=value)),
                   "its envelope's 'content-type' must be a string", task_id, ProtocolError)
    if kind == "headers not a mapping":
        headers = draw(st.lists(st.integers(), min_size=1, max_size=3))
        return Bad(_text(kombu_envelope(queue, task_id, headers=headers)), "headers must be a mapping",
                   task_id, ProtocolError)  # the id comes from correlation_id
    if kind == "deep":
        depth = draw(st.integers(3_000, 20_000))
        return Bad("[" * depth + "]" * depth, "its envelope is not JSON")
    if kind == "compression":
        headers = {**task_headers(task_id), "compression": draw(st.sampled_from(["zstd-9", "nope"]))}
        return Bad(_text(kombu_envelope(queue, task_id, headers=headers)), "kombu cannot decode it",
                   task_id, DecodeError)
    if kind == "pickle":
        envelope = kombu_envelope(queue, task_id, content_type="application/x-python-serialize",
                                  content_encoding="binary")
        return Bad(_text(envelope), "'application/x-python-serialize' is not accepted", task_id,
                   ContentDisallowed)
    if kind == "unknown task":
        headers = task_headers(task_id, task="apps.basic.nobody_has_this")
        return Bad(_text(kombu_envelope(queue, task_id, headers=headers)), "unknown task", task_id,
                   NotRegistered)
    if kind == "no tag":
        tag = draw(st.one_of(st.none(), st.just(""), st.integers()))
        envelope = kombu_envelope(queue, task_id)
        if tag is None:
            del envelope["properties"]["delivery_tag"]
        else:
            envelope["properties"]["delivery_tag"] = tag
        return Bad(_text(envelope), "its envelope has no delivery tag")



# -- AMQP content headers ------------------------------------------------------------------------


def _short(data: bytes) -> bytes:
    return bytes([len(data)]) + data


def _long_string(data: bytes) -> bytes:
    return b"S" + struct.pack(">I", len(data)) + data


def _table(items: list[tuple[bytes, bytes]]) -> bytes:
    encoded = b"".join(_short(key) + value for key, value in items)
    return struct.pack(">I", len(encoded)) + encoded


def basic_properties(*, content_type: bytes = JSON.encode(), content_encoding: bytes = b"utf-8",
                     headers: list[tuple[bytes, bytes]] | None = None, correlation_id: bytes | None = None
                     ) -> bytes:
    """A ``basic`` content header's properties, written byte by byte (so text need not be UTF-8)."""
    flags = 0x8000 | 0x4000 | 0x1000
    parts = [_short(content_type), _short(content_encoding)]
    if headers is not None:
        flags |= 0x2000
        parts.append(_table(headers))
    parts.append(b"\x02")  # delivery mode: persistent
    if correlation_id is not None:
        flags |= 0x0400
        parts.append(_short(correlation_id))
    return struct.pack(">H", flags) + b"".join(parts)


def amqp_headers(task_id: str, **replaced: bytes) -> list[tuple[bytes, bytes]]:
    """A task's headers as AMQP table items (values already encoded), some replaced."""
    items = {"lang": _long_string(b"py"), "task": _long_string(TASK.encode()),
             "id": _long_string(task_id.encode()), "retries": b"I" + struct.pack(">i", 0)}
    items.update(replaced)
    return [(key.encode(), value) for key, value in items.items()]


#: bytes that are not UTF-8 (a surrogate written as UTF-8 is left out: it decodes with
#: "surrogatepass", as py-amqp reads text)
not_utf8 = st.sampled_from([b"\xff", b"\xfe\xff", b"\xc3\x28", b"\xa0\xa1", b"a\x80b"])


@st.composite
def broken_amqp_properties(draw: st.DrawFn) -> Bad:
    """Properties (and body) of a delivery that RabbitMQ passes through but no decoder can read
    as text, or that say what cannot be done."""
    task_id = _id()
    junk = draw(not_utf8)
    kind = draw(st.sampled_from(["content_type", "content_encoding", "correlation_id", "task header",
                                 "id header", "compression", "body", "pickle", "unknown task"]))
    if kind == "content_type":
        return Bad(basic_properties(content_type=b"application/" + junk, headers=amqp_headers(task_id)),
                   "its properties cannot be decoded")
    if kind == "content_encoding":
        return Bad(basic_properties(content_encoding=b"utf" + junk, headers=amqp_headers(task_id)),
                   "its properties cannot be decoded")
    if kind == "correlation_id":
        return Bad(basic_properties(headers=amqp_headers(task_id), correlation_id=junk),
                   "its properties cannot be decoded")
    if kind == "task header":  # a long string that is not UTF-8 arrives as bytes
        return Bad(basic_properties(headers=amqp_headers(task_id, task=_long_string(b"apps." + junk))),
                   "header 'task' must be a string", task_id, ProtocolError)
    if kind == "id header":  # a byte array
        byte_array = b"x" + struct.pack(">I", 2) + b"\x00\x01"
        properties = basic_properties(headers=amqp_headers(task_id, id=byte_array),
                                      correlation_id=task_id.encode())
        return Bad(properties, "header 'id' must be a string", task_id, ProtocolError)
    if kind == "pickle":
        return Bad(basic_properties(content_type=b"application/x-python-serialize",
                                    content_encoding=b"binary", headers=amqp_headers(task_id)),
                   "'application/x-python-serialize' is not accepted", task_id, ContentDisallowed)
    if kind == "unknown task":
        unknown = _long_string(b"apps.basic.nobody_has_this")
        return Bad(basic_properties(headers=amqp_headers(task_id, task=unknown)), "unknown task", task_id,
                   NotRegistered)
    if kind == "compression":
        return Bad(basic_properties(headers=amqp_headers(task_id, compression=_long_string(b"zstd-9"))),
                   "kombu cannot decode it", task_id, DecodeError)
    return Bad((basic_properties(headers=amqp_headers(task_id)), b'[["' + junk + b'"], {}, {}]'),
               "body cannot be decoded as application/json", task_id, DecodeError)


def two_tags(queue: str, runs: str) -> Raw:
    """A kombu envelope with a second delivery tag after its properties: the Redis fetch script
    reads the last one, the envelope's own is the other; the message must run once all the same."""
    task_id = _id()
    envelope = kombu_envelope(queue, task_id, body=base64.b64encode(task_body(runs, task_id)).decode())
    envelope["x"] = {"delivery_tag": f"other-{uuid.uuid4()}"}
    return Raw(_text(envelope), task_id)


class RawMessage(amqp.basic_message.Message):  # type: ignore[misc]
    """A py-amqp message whose content header properties are written as given, byte for byte."""

    def __init__(self, body: bytes, properties: bytes) -> None:
        super().__init__(body)
        self._raw_properties = properties

    def _serialize_properties(self) -> bytes:
        return self._raw_properties
