"""Tasks held for their ETA or countdown, on Redis and RabbitMQ: ``worker_eta_task_limit`` caps
how many the worker takes (the rest stay in the broker until room frees), and held tasks are
listed by ``inspect scheduled`` and revoked at once."""

from __future__ import annotations

import base64
import gc
import json
import sys
import time
import types
import uuid

import kombu
import pytest
from apps import basic
from conftest import delete_queue
from workers import TESTS, ask, wait_for

from worker_core import App
from worker_core.consumer.eta import HeldTask
from worker_core.protocol import decode_task, task_message
from worker_core.request import Request
from worker_core.transports.message import Message as VirtualMessage

#: what a request built outside a consumer reports to: nothing (these tests do not run it)
NO_RESERVATIONS = types.SimpleNamespace()


@pytest.fixture(params=["redis", "amqp"])
def broker(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue("redis_url" if request.param == "redis" else "amqp_url")
    # (set whole: an earlier test may have left Redis options on the shared app)
    basic.app.conf.update(broker_url=url, result_backend=None, broker_transport_options={})
    yield url
    basic.app.close()


@pytest.fixture
def queue(broker: str) -> str:
    name = f"eta-{uuid.uuid4().hex[:8]}"
    yield name
    delete_queue(broker, name)


def _ready(broker: str, queue: str) -> int:
    """Messages of ``queue`` the broker has not delivered (a passive declare on RabbitMQ; on
    Redis a passive one fails once the list is empty)."""
    with kombu.Connection(broker) as connection:
        passive = broker.startswith("amqp")
        return int(connection.default_channel.queue_declare(queue, passive=passive).message_count)


def _start(workers, broker: str, queue: str, *, limit: int | None = None):
    name = f"eta-{uuid.uuid4().hex[:8]}@localhost"
    env = {"PYTHONPATH": str(TESTS), "WORKER_WORKER_PREFETCH_MULTIPLIER": "1"}
    if limit is not None:
        env["WORKER_WORKER_ETA_TASK_LIMIT"] = str(limit)
    worker = workers.start("-Q", queue, "-c", "1", "-n", name, broker=broker, env=env)
    return worker, name


def test_worker_eta_task_limit_holds_that_many_and_the_rest_wait_in_the_broker(workers, broker, queue,
                                                                            tmp_path):
    proof = tmp_path / "ran"
    worker, name = _start(workers, broker, queue, limit=3)
    for n in range(8):
        basic.record.apply_async((str(proof), n), countdown=3, queue=queue)
    wait_for(lambda: len(ask(basic.app, "scheduled", worker=name)) == 3, message="three tasks held")  # type: ignore[arg-type]
    time.sleep(0.5)  # a negative: room for a worker past its limit to take more (it must not)
    assert len(ask(basic.app, "scheduled", worker=name)) == 3  # type: ignore[arg-type]
    assert _ready(broker, queue) == 5
    assert ask(basic.app, "stats", worker=name)["prefetch_count"] == 3  # type: ignore[index]
    # the held ones come due and run; the room they free brings the rest, each run once
    wait_for(lambda: len(basic.lines(proof)) >= 8, timeout=20, message="the eight tasks to run")
    assert sorted(basic.lines(proof), key=int) == [str(n) for n in range(8)]
    assert _ready(broker, queue) == 0
    worker.stop()
    assert len(basic.lines(proof)) == 8


def test_a_backlog_of_countdown_tasks_is_taken_without_waiting_on_the_loop_timer(workers, broker, queue):
    # Each held task widens the window by one; on RabbitMQ the messages a wider window lets
    # through can come with the broker's answer, where the loop does not see them: taken a few
    # per turn of its timer (two seconds), 400 took minutes.
    worker, name = _start(workers, broker, queue)
    for n in range(400):
        basic.add.apply_async((n, n), countdown=60, queue=queue)
    wait_for(lambda: ask(basic.app, "stats", worker=name)["prefetch_count"] == 401,  # type: ignore[index]
             timeout=15, interval=0.2, message="the 400 tasks held")
    assert len(ask(basic.app, "scheduled", worker=name)) == 400  # type: ignore[arg-type]
    assert _ready(broker, queue) == 0
    worker.stop()


def test_held_tasks_are_listed_by_inspect_scheduled_revoked_at_once_and_expire(workers, broker, queue,
                                                                              tmp_path):
    proof = tmp_path / "ran"
    worker, name = _start(workers, broker, queue)
    kept = [basic.record.apply_async((str(proof), f"kept-{n}"), {}, countdown=3, queue=queue)
            for n in range(2)]
    revoked = basic.record.apply_async((str(proof), "revoked"), countdown=3, queue=queue)
    expired = basic.record.apply_async((str(proof), "expired"), countdown=2, expires=1, queue=queue)
    wait_for(lambda: len(ask(basic.app, "scheduled", worker=name)) == 4, message="four tasks held")  # type: ignore[arg-type]
    listed = {entry["request"]["id"]: entry for entry in ask(basic.app, "scheduled", worker=name)}  # type: ignore[union-attr]
    entry = listed[kept[0].id]
    assert entry["request"]["args"] == [str(proof), "kept-0"] and entry["request"]["kwargs"] == {}
    assert entry["request"]["name"] == "apps.basic.record" and entry["request"]["acknowledged"] is False
    assert entry["request"]["delivery_info"]["routing_key"] == queue and entry["eta"].startswith("20")
    assert ask(basic.app, "query_task", worker=name, ids=[revoked.id])[revoked.id][0] == "scheduled"  # type: ignore[index]
    assert ask(basic.app, "revoke", worker=name, task_id=revoked.id) == {
        "ok": f"tasks { {revoked.id} } flagged as revoked"}
    worker.wait_log(f"Discarding revoked task: apps.basic.record[{revoked.id}] (revoked)")
    assert sorted(e["request"]["id"] for e in ask(basic.app, "scheduled", worker=name)) == sorted(  # type: ignore[union-attr]
        [kept[0].id, kept[1].id, expired.id])
    worker.wait_log(f"Discarding revoked task: apps.basic.record[{expired.id}] (expired)", timeout=10)
    wait_for(lambda: len(basic.lines(proof)) >= 2, timeout=10, message="the kept tasks to run")
    assert ask(basic.app, "scheduled", worker=name) == []
    assert ask(basic.app, "stats", worker=name)["prefetch_count"] == 1  # type: ignore[index]  # every slot given back
    worker.stop()
    assert sorted(basic.lines(proof)) == ["kept-0", "kept-1"]


# -- the compact form ------------------------------------------------------------------------------


def _kept_bytes(held: HeldTask) -> int:
    """What a held task keeps that nothing else shares: its own objects, followed through their
    references (the task and the channel are the worker's, shared by every message)."""
    shared = {id(held.task), id(held.channel)}
    total, stack = 0, [held]
    while stack:
        obj = stack.pop()
        if id(obj) in shared or isinstance(obj, (type, types.ModuleType)) or obj is None:
            continue
        if isinstance(obj, bool) or (type(obj) is int and -5 <= obj <= 256):
            continue  # one object for the whole process
        shared.add(id(obj))
        total += sys.getsizeof(obj)
        stack.extend(gc.get_referents(obj))
    return total


@pytest.fixture
def held_message():
    """A Celery countdown message as a Redis channel delivers it (kombu's envelope, a core
    message), or as RabbitMQ's does (a kombu message from its fields)."""
    app = App("held")

    @app.task(name="proj.tasks.add")
    def add(x, y):
        return x + y

    connection = kombu.Connection("memory://")
    channel = connection.default_channel
    task_id = str(uuid.uuid4())
    out = task_message("proj.tasks.add", task_id, (2, 3), countdown=3600, origin="gen4242@host.example.com")
    body = json.dumps(list(out.body)).encode()
    properties = {**out.properties, "delivery_mode": 2, "priority": 0, "body_encoding": "base64",
                  "delivery_info": {"exchange": "", "routing_key": "celery"},
                  "delivery_tag": str(uuid.uuid4())}
    envelope = {"body": base64.b64encode(body).decode(), "content-encoding": "utf-8",
                "content-type": "application/json", "headers": out.headers, "properties": properties}

    def make(kind: str):
        if kind == "envelope":
            message = VirtualMessage(json.loads(json.dumps(envelope)), channel=channel)
        else:
            message = kombu.message.Message(
                body=body, delivery_tag=7, content_type="application/json", content_encoding="utf-8",
                delivery_info={"exchange": "", "routing_key": "celery", "consumer_tag": "None4",
                               "redelivered": False},
                properties={k: v for k, v in properties.items()
                            if k not in ("body_encoding", "delivery_tag")},
                headers=json.loads(json.dumps(out.headers)), channel=channel)
        envelope_ = decode_task(message.headers, message.properties, message.body, message.content_type,
                                message.content_encoding, accept=frozenset({"application/json"}),
                                max_size=2**20)
        return Request(None, message, envelope_, add, reservations=NO_RESERVATIONS), message  # type: ignore[arg-type]

    yield make
    connection.close()


@pytest.mark.parametrize("kind", ["envelope", "fields"])
def test_a_held_task_keeps_under_three_quarters_of_a_kilobyte_and_is_built_again_whole(held_message, kind):
    # a held task may cost the worker 1 KiB in all: the rest is for the broker client's record of
    # the delivery (kombu's on Redis) and the worker's list of held tasks
    request, message = held_message(kind)
    held = HeldTask(request.envelope.eta.timestamp(), request)
    assert isinstance(held.kept, bytes)  # not the request, its envelope or its message
    assert _kept_bytes(held) < 768, _kept_bytes(held)
    def make_request(message, envelope, task):
        return Request(None, message, envelope, task, reservations=NO_RESERVATIONS)  # type: ignore[arg-type]

    again = held.request(make_request, frozenset({"application/json"}), 2**20)
    assert again.envelope == request.envelope or vars_of(again.envelope) == vars_of(request.envelope)
    assert again.message.delivery_tag == message.delivery_tag and again.message.channel is message.channel
    assert dict(again.message.headers) == dict(message.headers) and again.message.body == message.body
    assert again.message.delivery_info == message.delivery_info
    assert again.task is request.task and again.id == request.id


def vars_of(envelope) -> dict:
    return {name: getattr(envelope, name) for name in type(envelope).__slots__ if not name.startswith("__")}
