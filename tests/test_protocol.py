"""Protocol v2 on the wire: messages as Celery writes them, and hostile ones refused by name."""

from __future__ import annotations

import base64
import json
import uuid
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
from kombu.utils.json import dumps

from worker_core.exceptions import ContentDisallowed, ProtocolError
from worker_core.protocol import decode_task, task_message

ACCEPT = frozenset({"application/json"})
NOW = datetime(2026, 11, 21, 12, 0, 0, tzinfo=timezone.utc)


def celery_message(**kwargs):
    from celery import Celery

    return Celery("interop").amqp.as_task_v2(**kwargs)


def test_our_headers_match_celerys_header_for_header():
    task_id = str(uuid.uuid4())
    common = dict(countdown=30, expires=NOW + timedelta(hours=1), retries=2, time_limit=30,
                  soft_time_limit=10, now=NOW)
    ours = task_message("proj.add", task_id, (2, 3), {"z": 1}, **common)
    theirs = celery_message(task_id=task_id, name="proj.add", args=(2, 3), kwargs={"z": 1}, **common)
    assert ours.headers == theirs.headers
    assert ours.properties == theirs.properties
    assert json.loads(dumps(ours.body)) == json.loads(dumps(theirs.body))
    assert ours.headers["timelimit"] == [30, 10]  # [hard, soft]


def decode(headers, body, content_type="application/json", properties=None, **kw):
    raw = body if isinstance(body, (bytes, str)) else dumps(body)
    return decode_task(headers, properties or {}, raw, content_type, "utf-8",
                       accept=kw.get("accept", ACCEPT), max_size=kw.get("max_size", 1 << 20))


def test_a_celery_message_decodes_with_every_field():
    task_id = str(uuid.uuid4())
    msg = celery_message(task_id=task_id, name="proj.add", args=(2, 3), kwargs={}, countdown=5,
                         expires=60, time_limit=30, soft_time_limit=10, retries=1, now=NOW)
    envelope = decode(msg.headers, msg.body, properties=msg.properties)
    assert (envelope.name, envelope.id, envelope.args, envelope.kwargs) == ("proj.add", task_id, [2, 3], {})
    assert envelope.eta == NOW + timedelta(seconds=5)
    assert envelope.expires == NOW + timedelta(seconds=60)
    assert (envelope.time_limit, envelope.soft_time_limit, envelope.retries) == (30, 10, 1)
    assert envelope.root_id == task_id and envelope.correlation_id == task_id


def test_each_header_and_property_lands_in_its_own_field():
    headers = {"task": "proj.t", "id": "id-1", "retries": 3, "eta": "2026-11-21T12:00:00+00:00",
               "expires": "2026-11-21T13:00:00+00:00", "timelimit": [20, 7], "root_id": "root",
               "parent_id": "parent", "group": "grp", "group_index": 4, "origin": "gen@host",
               "shadow": "shadowed", "ignore_result": True, "argsrepr": "(1,)", "kwargsrepr": "{'k': 2}"}
    envelope = decode(headers, [[1], {"k": 2}, {"chain": None}],
                      properties={"reply_to": "reply-q", "correlation_id": "corr"})
    assert {name: getattr(envelope, name) for name in envelope.__slots__ if name != "__weakref__"} == {
        "name": "proj.t", "id": "id-1", "args": [1], "kwargs": {"k": 2}, "embed": {"chain": None},
        "retries": 3, "eta": NOW, "expires": NOW + timedelta(hours=1), "time_limit": 20.0,
        "soft_time_limit": 7.0, "root_id": "root", "parent_id": "parent", "group": "grp",
        "group_index": 4, "origin": "gen@host", "shadow": "shadowed", "ignore_result": True,
        "argsrepr": "(1,)", "kwargsrepr": "{'k': 2}", "reply_to": "reply-q", "correlation_id": "corr",
        "headers": headers,
    }


def test_kombu_json_types_round_trip():
    stamp = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    args = [stamp, Decimal("1.50"), uuid.UUID(int=7), b"\x00raw"]
    msg = task_message("t", "id-1", args, {})
    envelope = decode(msg.headers, msg.body)
    assert envelope.args == args


def test_a_version_1_body_is_read():
    body = {"task": "proj.add", "id": "v1-id", "args": [1, 2], "kwargs": {"k": 3}, "retries": 0,
            "eta": None, "expires": None, "timelimit": [None, None]}
    envelope = decode({}, body)
    assert (envelope.name, envelope.id, envelope.args, envelope.kwargs) == (
        "proj.add", "v1-id", [1, 2], {"k": 3}
    )


def test_a_celery_send_task_message_with_null_ignore_result_is_read():
    from celery import Celery

    app = Celery("interop", broker="memory://")
    message = app.amqp.as_task_v2("null-id", "t", args=(1,), ignore_result=None)
    assert decode(message.headers, message.body).ignore_result is False


def test_missing_newer_headers_are_tolerated():
    envelope = decode({"task": "t", "id": "only-these"}, [[1], {}, {}])
    assert envelope.retries == 0 and envelope.eta is None and envelope.argsrepr == "[1]"


@pytest.mark.parametrize("header, value, expected", [
    ("task", 42, "header 'task' must be a string"),
    ("task", "", "header 'task' must not be empty"),
    ("id", None, "header 'id' is missing"),
    ("id", ["x"], "header 'id' must be a string"),
    ("retries", "3", "header 'retries' must be a whole number"),
    ("retries", True, "header 'retries' must be a whole number"),
    ("retries", -1, "header 'retries' must be a whole number"),
    ("eta", "tomorrow", "header 'eta' is not an ISO 8601 date-time"),
    ("eta", 17, "header 'eta' must be an ISO 8601 date-time"),
    ("expires", {"x": 1}, "header 'expires' must be an ISO 8601 date-time"),
    ("timelimit", [1, 2, 3], "header 'timelimit' must be [hard, soft]"),
    ("timelimit", ["a", None], "header 'timelimit' must be [hard, soft]"),
    ("ignore_result", "yes", "header 'ignore_result' must be true or false"),
    ("root_id", 5, "header 'root_id' must be a string"),
])
def test_each_bad_header_is_named_with_what_was_received(header, value, expected):
    headers = {"task": "t", "id": "i", header: value}
    with pytest.raises(ProtocolError) as caught:
        decode(headers, [[], {}, {}])
    assert expected in str(caught.value)


@pytest.mark.parametrize("body, expected", [
    ({"a": 1}, "body must be [args, kwargs, embed]"),
    ([1, {}, {}], "body args must be a list"),
    ([[], [], {}], "body kwargs must be an object"),
    ([[], {}, 5], "body embed must be an object or null"),
    (b"\xff\xfe not json", "body cannot be decoded as application/json"),
    ("[[1], {", "body cannot be decoded as application/json"),
])
def test_bad_bodies_are_refused_with_the_reason(body, expected):
    with pytest.raises(ProtocolError) as caught:
        decode({"task": "t", "id": "i"}, body)
    assert expected in str(caught.value)


def test_pickle_is_refused_unless_accepted():
    import pickle

    body = pickle.dumps(([1], {}, {}))
    with pytest.raises(ContentDisallowed, match="application/x-python-serialize' is not accepted"):
        decode({"task": "t", "id": "i"}, body, content_type="application/x-python-serialize")
    accepted = ACCEPT | {"application/x-python-serialize"}
    envelope = decode({"task": "t", "id": "i"}, body, content_type="application/x-python-serialize",
                      accept=accepted)
    assert envelope.args == [1]


def test_oversized_and_deeply_nested_bodies_are_refused():
    with pytest.raises(ProtocolError, match="more than worker_max_message_size"):
        decode({"task": "t", "id": "i"}, [["x" * 2000], {}, {}], max_size=1000)
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(ProtocolError, match="nested too deeply"):
        decode({"task": "t", "id": "i"}, deep)


def test_non_mapping_headers_are_refused():
    with pytest.raises(ProtocolError, match="headers must be a mapping"):
        decode(["task"], [[], {}, {}])


def test_base64_is_not_confused_with_json():
    with pytest.raises(ProtocolError):
        decode({"task": "t", "id": "i"}, base64.b64encode(b"[[], {}, {}]"))


@pytest.mark.parametrize("text", [
    '[[2, 2], {}, {"callbacks": null, "errbacks": null, "chain": null, "chord": null}]',
    ' [1, "two"]\n', '"text"', "3.5", "{}", "null",  # whitespace around the value, scalars
    "", " ", "[1", "[1] x", "[1]]", "{'a': 1}", '"\\ud800"', "[NaN]",  # errors and oddities
])
def test_body_json_reads_what_the_json_module_reads_and_fails_as_it_does(text: str) -> None:
    from worker_core.protocol.fastjson import loads

    try:
        expected: tuple[str, object] = ("value", json.loads(text))
    except json.JSONDecodeError as exc:
        expected = ("error", str(exc))
    try:
        got: tuple[str, object] = ("value", loads(text))
    except json.JSONDecodeError as exc:
        got = ("error", str(exc))
    assert repr(got) == repr(expected)
    if got[0] == "value":  # a body that arrived as bytes reads the same
        assert repr(loads(text.encode())) == repr(got[1])
