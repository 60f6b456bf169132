"""Leases on Redis: a message this worker holds (running, or waiting for its countdown) keeps its
entry in kombu's ``unacked_index`` fresh, so no restore (its own, another worker's, a Celery
worker's) takes it; a message of a dead worker still comes back after the visibility timeout.
Each test has its own redis-server and a visibility timeout of 2 seconds."""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

import pytest
import redis
from apps import basic
from conftest import FakeSite
from faults import RedisServer, TcpProxy
from workers import TESTS, wait_for

VISIBILITY_TIMEOUT = 2
#: every worker looks for unacknowledged messages older than the timeout twice a second (kombu:
#: every 10 s), so a lease that is not renewed is noticed within the test
OPTIONS = json.dumps({"visibility_timeout": VISIBILITY_TIMEOUT, "unacked_restore_interval": 0.5,
                      "interval_start": 0.2, "interval_step": 0.2, "interval_max": 0.5})
ENV = {"PYTHONPATH": str(TESTS), "WORKER_BROKER_TRANSPORT_OPTIONS": OPTIONS}
#: the fast paths, and kombu's own paths (every fast path off)
PATHS = {"fast": {}, "stock": {"WORKER_STOCK_KOMBU": "1"}}


@pytest.fixture
def server(tmp_path: Path):
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()


@pytest.fixture
def client(server: RedisServer):
    basic.app.conf.update(broker_url=server.url, result_backend=None,
                          broker_transport_options={"visibility_timeout": VISIBILITY_TIMEOUT})
    yield basic.app
    basic.app.close()
    basic.app.conf.update(broker_url=None, broker_transport_options={})  # the next test's own


def _unacked(url: str) -> int:
    return int(redis.Redis.from_url(url).hlen("unacked"))


@pytest.mark.parametrize("path", PATHS)
def test_acks_late_tasks_twice_as_long_as_the_visibility_timeout_run_once_on_two_workers(
        workers, server, client, path):
    env = {**ENV, **PATHS[path]}
    first = workers.start("-c", "2", pool="threads", broker=server.url, env=env)
    second = workers.start("-c", "2", pool="threads", broker=server.url, env=env)
    key = f"runs-{uuid.uuid4().hex[:8]}"
    for n in range(8):
        basic.count_slowly.delay(server.url, key, n, 2 * VISIBILITY_TIMEOUT)
    # four run at a time (two workers of two threads): two rounds of twice the timeout
    wait_for(lambda: len(basic.runs(server.url, key)) == 8, timeout=30, message="every task to start")
    wait_for(lambda: _unacked(server.url) == 0, timeout=15, message="every task to be acknowledged")
    assert redis.Redis.from_url(server.url).llen("celery") == 0
    assert basic.runs(server.url, key) == dict.fromkeys(range(8), 1)
    for worker in (first, second):
        assert worker.stop() == 0
        assert "came back from Redis" not in worker.log()


def test_a_solo_worker_busy_with_a_long_task_keeps_its_leases(workers, server, client):
    # The solo pool runs the task in the loop's thread: the leases are renewed from another one.
    solo = workers.start(pool="solo", broker=server.url, env=ENV)
    key = f"runs-{uuid.uuid4().hex[:8]}"
    basic.count.apply_async((server.url, key, 1), countdown=VISIBILITY_TIMEOUT)  # held meanwhile
    solo.wait_log(" received")
    basic.count_slowly.delay(server.url, key, 0, 3 * VISIBILITY_TIMEOUT)
    wait_for(lambda: basic.runs(server.url, key) == {0: 1}, message="the long task to start")
    # another worker, restoring what it finds older than the timeout twice a second
    other = workers.start("-c", "2", pool="threads", broker=server.url, env=ENV)
    wait_for(lambda: len(basic.runs(server.url, key)) == 2, timeout=20, message="both tasks to run")
    wait_for(lambda: _unacked(server.url) == 0, message="both tasks to be acknowledged")
    assert basic.runs(server.url, key) == {0: 1, 1: 1}
    assert " received" not in other.log()


@pytest.mark.parametrize("path", PATHS)
def test_countdown_tasks_longer_than_the_visibility_timeout_run_once_each(workers, server, client, path):
    total = 2000
    env = {**ENV, **PATHS[path]}
    worker = workers.start("-c", "8", pool="threads", broker=server.url, env=env)
    key = f"runs-{uuid.uuid4().hex[:8]}"
    countdown = 2.5 * VISIBILITY_TIMEOUT
    for n in range(total):
        basic.count.apply_async((server.url, key, n), countdown=countdown)
    # the worker holds them all for longer than the visibility timeout, then runs each once
    wait_for(lambda: len(basic.runs(server.url, key)) == total, timeout=25, interval=0.2,
             message=f"all {total} tasks to run")
    wait_for(lambda: _unacked(server.url) == 0, timeout=10, message="every task to be acknowledged")
    assert redis.Redis.from_url(server.url).llen("celery") == 0
    runs = basic.runs(server.url, key)
    assert [n for n, times in runs.items() if times != 1] == []
    assert worker.stop() == 0
    assert "came back from Redis" not in worker.log()
    assert "does not renew the leases" not in worker.log()


def test_the_held_messages_of_a_killed_worker_come_back_after_the_timeout_to_another_worker(
        workers, server, client):
    first = workers.start("-c", "2", pool="threads", broker=server.url, env=ENV)
    key = f"runs-{uuid.uuid4().hex[:8]}"
    for n in range(6):
        basic.count.apply_async((server.url, key, n), countdown=4 * VISIBILITY_TIMEOUT)
    wait_for(lambda: first.log().count(" received") >= 6, message="all six tasks received")
    first.crash()
    assert _unacked(server.url) == 6  # held by no one now: no one renews them
    second = workers.start("-c", "2", pool="threads", broker=server.url, env=ENV)
    wait_for(lambda: len(basic.runs(server.url, key)) == 6, timeout=25, message="the six tasks to run")
    assert second.log().count(" received") == 6
    wait_for(lambda: _unacked(server.url) == 0, message="every task to be acknowledged")
    assert basic.runs(server.url, key) == dict.fromkeys(range(6), 1)


def test_a_celery_worker_on_the_same_redis_does_not_take_a_leased_message(workers, server, client):
    options = json.dumps({"visibility_timeout": VISIBILITY_TIMEOUT, "unacked_restore_throttle": 1,
                          "unacked_restore_interval": 0.5})
    ours = workers.start("-c", "2", pool="threads", broker=server.url, env=ENV)
    key = f"runs-{uuid.uuid4().hex[:8]}"
    for n in range(3):
        basic.count.apply_async((server.url, key, n), countdown=4 * VISIBILITY_TIMEOUT)
    wait_for(lambda: ours.log().count(" received") >= 3, message="our worker to hold the three tasks")
    celery = workers.start_celery(broker=server.url, env={"CELERY_BROKER_TRANSPORT_OPTIONS": options})
    # The Celery worker restores what nobody leases: a record left by a dead consumer comes back.
    client_redis = redis.Redis.from_url(server.url)
    orphan = {"body": "", "headers": {}, "content-type": "application/json", "content-encoding": "utf-8",
              "properties": {"delivery_tag": "orphan", "delivery_info": {"exchange": "", "routing_key": "x"}}}
    client_redis.hset("unacked", "orphan", json.dumps([orphan, "", "orphan-queue"]))
    client_redis.zadd("unacked_index", {"orphan": time.time() - 10 * VISIBILITY_TIMEOUT})
    wait_for(lambda: client_redis.llen("orphan-queue") == 1, timeout=15,
             message="the Celery worker to restore the orphaned record")
    wait_for(lambda: len(basic.runs(server.url, key)) == 3, timeout=20, message="the three tasks to run")
    wait_for(lambda: _unacked(server.url) == 0, message="every task to be acknowledged")
    assert basic.runs(server.url, key) == dict.fromkeys(range(3), 1)
    assert " received" in ours.log()
    assert "Task apps.basic.count[" not in celery.log()  # it received none of them


@pytest.mark.parametrize("path", PATHS)
def test_held_messages_are_kept_not_restored_when_the_connection_is_reset(workers, server, client, path):
    # Redis still answers: kombu's close would restore what the worker keeps, and each task would
    # run twice (once kept, once restored).
    worker = workers.start("-c", "2", pool="threads", broker=server.url, env={**ENV, **PATHS[path]})
    key = f"runs-{uuid.uuid4().hex[:8]}"
    for n in range(4):
        basic.count.apply_async((server.url, key, n), countdown=2 * VISIBILITY_TIMEOUT)
    basic.count_slowly.delay(server.url, key, 9, 2 * VISIBILITY_TIMEOUT)
    wait_for(lambda: basic.runs(server.url, key) == {9: 1}, message="the long task to start")
    wait_for(lambda: worker.log().count(" received") == 5, message="the five tasks received")
    redis.Redis.from_url(server.url).client_kill_filter(_type="normal", skipme=True)
    worker.wait_log("Connection to broker lost")
    worker.wait_log("Connected to redis://")
    wait_for(lambda: len(basic.runs(server.url, key)) == 5, timeout=15, message="the five tasks to run")
    wait_for(lambda: _unacked(server.url) == 0, message="the five tasks to be acknowledged")
    assert redis.Redis.from_url(server.url).llen("celery") == 0
    assert basic.runs(server.url, key) == {0: 1, 1: 1, 2: 1, 3: 1, 9: 1}
    assert "Restoring" not in worker.log()
    assert "acknowledge message" not in worker.log()  # each acknowledgement written on the new connection


@pytest.mark.parametrize("path", PATHS)
def test_acknowledgements_made_during_a_cut_are_written_through_the_next_connection(
        workers, server, client, path):
    # The cut refuses new connections: closing the lost connection's channels fails on what they
    # still send to Redis (the control channel's bindings, a BRPOP in flight). Each channel must be
    # closed all the same, or the one that delivered the tasks keeps buffering their
    # acknowledgements, never written: each task would run again once its record is restored.
    proxy = TcpProxy("127.0.0.1", server.port)
    url = f"redis://127.0.0.1:{proxy.port}/0"
    # a visibility timeout longer than the test: a record left in Redis stays there, nothing restores it
    options = json.dumps({"visibility_timeout": 300, "interval_start": 0.2, "interval_step": 0.2,
                          "interval_max": 0.5})
    try:
        worker = workers.start("-c", "4", pool="threads", broker=url,
                               env={**ENV, "WORKER_BROKER_TRANSPORT_OPTIONS": options, **PATHS[path]})
        key = f"runs-{uuid.uuid4().hex[:8]}"
        for n in range(3):
            basic.count_slowly.delay(server.url, key, n, 1.5)
        wait_for(lambda: len(basic.runs(server.url, key)) == 3, message="the three tasks to start")
        proxy.cut()
        worker.wait_log("Connection to broker lost")
        wait_for(lambda: worker.log().count(" succeeded") == 3,
                 message="the three tasks to end during the cut")
        assert _unacked(server.url) == 3
        proxy.restore()
        worker.wait_log("Connected to redis://")
        wait_for(lambda: _unacked(server.url) == 0, timeout=10,
                 message="the acknowledgements made during the cut to be written")
        assert basic.runs(server.url, key) == {0: 1, 1: 1, 2: 1}
        assert "Could not close a channel" not in worker.log()
    finally:
        proxy.close()


def test_no_restoring_line_is_logged_when_redis_is_down_at_shutdown(workers, server, client):
    worker = workers.start("-c", "2", pool="threads", broker=server.url, env=ENV, loglevel="DEBUG")
    for n in range(3):
        basic.count.apply_async((server.url, "runs", n), countdown=60)
    wait_for(lambda: worker.log().count(" received") >= 3, message="the three tasks received")
    server.stop()
    worker.wait_log("Connection to broker lost")
    assert worker.stop() == 0
    assert "Restoring" not in worker.log()  # nothing could be restored (nor is anything tried)


@pytest.mark.parametrize("path", PATHS)
def test_a_channel_closed_with_redis_unreachable_says_it_restored_nothing(
        server, client, path, monkeypatch, caplog):
    from kombu import Connection, Consumer, Producer, Queue

    from worker_core.app.settings import Settings
    from worker_transport_redis import internals
    from worker_transport_redis.transport import RedisTransport

    for name, value in PATHS[path].items():
        monkeypatch.setenv(name, value)
    internals.forget()
    transport = RedisTransport(server.url, Settings(broker_transport_options={"visibility_timeout": 60}))
    queue = Queue(f"held-{uuid.uuid4().hex[:8]}")
    held = []
    try:
        with Connection(server.url, transport=transport.kombu_transport(),
                        **transport.connection_options()) as connection:
            channel = connection.default_channel
            Consumer(channel, [queue], callbacks=[lambda body, message: held.append(message)]).consume()
            for n in range(3):
                Producer(channel).publish(n, routing_key=queue.name, declare=[queue])
            while len(held) < 3:
                connection.drain_events(timeout=5)
            server.stop()
            caplog.set_level("INFO")
        assert "Restoring" not in caplog.text
        assert "Did not restore 3 unacknowledged message(s): Redis is unreachable" in caplog.text
    finally:
        internals.forget()


#: a transport plugin that declares it does not renew leases (Redis under another scheme)
UNRENEWED = """
from worker_transport_redis.transport import RedisTransport


class UnrenewedRedis(RedisTransport):
    renews_leases = False

    def __init__(self, url, settings):
        super().__init__("redis" + url[len("unrenewed"):], settings)
"""


def test_a_countdown_longer_than_a_lease_that_is_not_renewed_is_warned_about_once(
        workers, server, client, site: FakeSite):
    site.add("unrenewed-transport",
             {"worker.transports": {"unrenewed": "unrenewed_transport:UnrenewedRedis"}},
             {"unrenewed_transport": UNRENEWED})
    env = {**ENV, "PYTHONPATH": f"{TESTS}:{site.root}"}
    worker = workers.start("-c", "2", pool="threads", broker=server.url.replace("redis://", "unrenewed://"),
                           env=env)
    key = f"runs-{uuid.uuid4().hex[:8]}"
    basic.count.apply_async((server.url, key, 0), countdown=VISIBILITY_TIMEOUT / 2)
    worker.wait_log(" received")
    assert "does not renew the leases" not in worker.log()  # shorter than the timeout: nothing to say
    for n in range(1, 4):
        basic.count.apply_async((server.url, key, n), countdown=10 * VISIBILITY_TIMEOUT)
    wait_for(lambda: worker.log().count(" received") == 4, message="the four tasks received")
    worker.wait_log("longer than the visibility timeout of the unrenewed transport (2s), which does not "
                    "renew the leases of the messages the worker holds")
    log = worker.log()
    assert log.count("does not renew the leases") == 1
    assert "Raise broker_transport_options={'visibility_timeout': ...}" in log


def test_releasing_every_message_of_a_closing_channel_forgets_their_lost_leases() -> None:
    # The state a renewal leaves when Redis says a held message's lease is lost; a channel that
    # closes then gives back (release_all) what it holds, lost ones included, without a deadlock.
    from worker_transport_redis.leases import Leases

    leases = Leases("redis://example/0")
    owner = object()
    leases._held.update({"lost": owner, "kept": owner})
    leases._lost.add("lost")
    leases._lost_frozen = frozenset(leases._lost)
    released: list[int] = []
    closing = threading.Thread(target=lambda: released.append(leases.release_all(owner)), daemon=True)
    closing.start()
    closing.join(10)
    assert released == [2], "release_all did not return (it waited on the lock it holds)"
    assert not leases.is_lost("lost") and leases.owner("lost") is None and leases.held_by(owner) == 0
