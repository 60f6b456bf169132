"""The Redis Cluster transport and result backend against a real cluster the suite starts (three
primaries and three replicas on free ports, see ``redis_cluster.py``): the three contract suites,
every key of a queue in one slot and queues on every primary, consumers woken by sharded pub/sub,
a sharded queue, and real workers (priorities, a countdown past the visibility timeout, remote
control through fanout)."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kombu
import pytest
from redis_cluster import RedisCluster, queues_on_primaries
from workers import TESTS, WorkerProcess, drain

from worker_core.app.broker import task_queue
from worker_core.app.settings import Settings
from worker_core.exceptions import ConfigurationError
from worker_core.testing import lease_contract, result_backend_contract, transport_contract
from worker_transport_redis_cluster import RedisClusterBackend, RedisClusterTransport
from worker_transport_redis_cluster.keys import QueueKeys, key_slot, shard_names

# -- the contract suites --------------------------------------------------------------------------------


@pytest.mark.parametrize("check", transport_contract.CHECKS, ids=transport_contract.check_name)
def test_the_cluster_transport_honours_the_transport_contract(
    check: transport_contract.Check, redis_cluster: RedisCluster
) -> None:
    check(RedisClusterTransport, redis_cluster.url)


BACKEND_CHECKS = [
    check
    for check in result_backend_contract.CHECKS
    if result_backend_contract.applies(check, RedisClusterBackend)
]


@pytest.mark.parametrize("check", BACKEND_CHECKS, ids=result_backend_contract.check_name)
def test_the_cluster_backend_honours_the_result_backend_contract(
    check: result_backend_contract.Check, redis_cluster: RedisCluster
) -> None:
    check(RedisClusterBackend, redis_cluster.url)


@pytest.mark.parametrize("check", lease_contract.CHECKS, ids=lease_contract.check_name)
def test_the_cluster_transport_honours_the_lease_contract(
    check: lease_contract.Check, redis_cluster: RedisCluster
) -> None:
    check(RedisClusterTransport, redis_cluster.url)


# -- configuration ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "options", "expected"),
    [
        ("redis://127.0.0.1:7000/", {}, "the scheme must be one of redis-cluster, rediss-cluster"),
        ("redis-cluster://10.0.0.1:7000;redis-cluster://10.0.0.2:7000", {}, "lists its nodes with ','"),
        ("redis-cluster://10.0.0.1:7000/3", {}, "has database 0 only"),
        ("redis-cluster://10.0.0.1:99999/", {}, "port is not a number from 1 to 65535"),
        ("redis-cluster:///", {}, "names no node"),
        ("redis-cluster://10.0.0.1:7000/?ssl_cert_reqs=required", {}, "write rediss-cluster:// for TLS"),
        ("redis-cluster://10.0.0.1:7000/", {"visiblity_timeout": 5}, "Did you mean 'visibility_timeout'?"),
        ("redis-cluster://10.0.0.1:7000/", {"global_keyprefix": "{app}"}, "without '{' or '}'"),
        (
            "redis-cluster://10.0.0.1:7000/",
            {"sharded_queues": {"busy": 0}},
            "number of shards from 1 to 1024",
        ),
        (
            "redis-cluster://10.0.0.1:7000/",
            {"wait_for_replicas": 1, "socket_timeout": 0.5},
            "must be longer than 'wait_timeout'",
        ),
        ("rediss-cluster://10.0.0.1:7000/", {}, "ssl_cert_reqs is not set"),
    ],
)
def test_a_bad_url_or_option_is_refused_in_one_line_naming_it(
    url: str, options: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        RedisClusterTransport(url, Settings(broker_transport_options=options))
    message = str(caught.value)
    assert expected in message and "\n" not in message, message


def test_every_node_of_the_url_is_a_seed_and_the_password_stays_hidden() -> None:
    transport = RedisClusterTransport(
        "redis-cluster://app:s3cret@10.0.0.1:7000,10.0.0.2,[::1]:7002/", Settings()
    )
    assert transport.config.seeds == (("10.0.0.1", 7000), ("10.0.0.2", 6379), ("::1", 7002))
    assert (
        transport.config.connection["password"] == "s3cret"
        and transport.config.connection["username"] == "app"
    )
    assert "s3cret" not in repr(transport) and "s3cret" not in str(transport.info())


# -- where things live ---------------------------------------------------------------------------------


def _connect(url: str, **options: Any) -> kombu.Connection:
    transport = RedisClusterTransport(url, Settings(broker_transport_options=options))
    connection = kombu.Connection(
        url, transport=transport.kombu_transport(), **transport.connection_options()
    )
    connection.connect()
    return connection


def _receive(connection: kombu.Connection, queue: kombu.Queue, count: int, timeout: float = 10) -> list:
    received: list = []
    with kombu.Consumer(
        connection, [queue], accept=["json"], on_message=received.append, prefetch_count=count
    ):
        drain(connection, lambda: len(received) >= count, timeout, message=f"{count} message(s)")
    return received


def test_every_key_of_a_queue_is_in_its_slot_and_queues_spread_over_the_primaries(
    redis_cluster: RedisCluster,
) -> None:
    names = queues_on_primaries(redis_cluster, f"spread-{uuid.uuid4().hex[:6]}")
    assert len(names) == 3
    with _connect(redis_cluster.url) as connection:
        producer = kombu.Producer(connection)
        for name in names:
            queue = task_queue(name, Settings())
            queue(connection.default_channel).declare()
            for priority in (0, 5, 9):
                producer.publish(
                    {"p": priority},
                    exchange=queue.exchange,
                    routing_key=name,
                    priority=priority,
                    serializer="json",
                )
            [held] = _receive(connection, queue, 1)  # one unacknowledged: its records exist
            keys = QueueKeys(name, "", (0, 3, 6, 9))
            primary = redis_cluster.primary_of_slot(keys.slot)
            on_node = {key.decode() for key in redis_cluster.call(primary, "KEYS", f"{keys.tag}*")}
            # priorities 0, 5 and 9 went to steps 0, 3 and 9; the first one taken is held; Celery's
            # exchange of the queue's name keeps its bindings under the same tag
            assert on_node == {
                keys.list_for(3),
                keys.list_for(9),
                keys.unacked,
                keys.leases,
                f"{keys.tag}:bindings",
            }, on_node
            assert {key_slot(key) for key in on_node} == {keys.slot}
            held.ack()
    assert len({redis_cluster.primary_of_slot(key_slot(f"{{{name}}}")) for name in names}) == 3


def test_the_lower_priority_steps_are_delivered_first_as_on_redis_then_in_publication_order(
    redis_cluster: RedisCluster,
) -> None:
    with _connect(redis_cluster.url) as connection:
        queue = task_queue(f"prio-{uuid.uuid4().hex[:8]}", Settings())
        queue(connection.default_channel).declare()
        producer = kombu.Producer(connection)
        for n, priority in enumerate([9, 0, 5, 0, 3]):
            producer.publish(
                {"n": n},
                exchange=queue.exchange,
                routing_key=queue.routing_key,
                priority=priority,
                serializer="json",
            )
        received = _receive(connection, queue, 5)
        # as on Redis: the lower number first (steps 0, 3, 6, 9), first in first out within a step
        assert [message.decode()["n"] for message in received] == [1, 3, 2, 4, 0]
        for message in received:
            message.ack()


def test_an_idle_consumer_is_woken_by_sharded_pub_sub_on_the_queues_primary(
    redis_cluster: RedisCluster,
) -> None:
    name = f"wake-{uuid.uuid4().hex[:8]}"
    keys = QueueKeys(name, "", (0, 3, 6, 9))
    primary = redis_cluster.primary_of_slot(keys.slot)
    with _connect(redis_cluster.url, polling_interval=30) as consumer, _connect(redis_cluster.url) as sender:
        queue = task_queue(name, Settings())
        queue(consumer.default_channel).declare()
        received: list = []
        with kombu.Consumer(consumer, [queue], accept=["json"], on_message=received.append):
            with pytest.raises(TimeoutError):  # subscribed and idle: nothing to take
                consumer.drain_events(timeout=0.5)
            channels = redis_cluster.call(primary, "PUBSUB", "SHARDCHANNELS", f"{keys.tag}*")
            assert [channel.decode() for channel in channels] == [keys.wake]
            started = time.monotonic()
            kombu.Producer(sender).publish(
                {"n": 1}, exchange=queue.exchange, routing_key=name, serializer="json"
            )
            consumer.drain_events(timeout=10)
            # woken, not polled: the poll is every 30 s here
            assert time.monotonic() - started < 10 and [m.decode() for m in received] == [{"n": 1}]
            received[0].ack()


def test_a_sharded_queue_spreads_over_the_primaries_and_is_consumed_whole(
    redis_cluster: RedisCluster,
) -> None:
    name = f"busy-{uuid.uuid4().hex[:8]}"
    options = {"sharded_queues": {name: 3}}
    shards = shard_names(name, 3)
    assert len({redis_cluster.primary_of_slot(key_slot(f"{{{shard}}}")) for shard in shards}) == 3
    with _connect(redis_cluster.url, **options) as connection:
        queue = task_queue(name, Settings())
        queue(connection.default_channel).declare()
        producer = kombu.Producer(connection)
        for n in range(9):
            producer.publish({"n": n}, exchange=queue.exchange, routing_key=name, serializer="json")
        # round robin over the shards: three each, each shard first in first out
        for shard in shards:
            assert (
                redis_cluster.call(
                    redis_cluster.primary_of_slot(key_slot(f"{{{shard}}}")),
                    "LLEN",
                    QueueKeys(shard, "", (0, 3, 6, 9)).lists[0],
                )
                == 3
            )
        transport = RedisClusterTransport(redis_cluster.url, Settings(broker_transport_options=options))
        assert transport.queue_depth(connection, name) == 9
        received = _receive(connection, queue, 9)
        assert sorted(message.decode()["n"] for message in received) == list(range(9))
        for message in received:
            message.ack()
        assert transport.queue_depth(connection, name) == 0


# -- real workers ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster_worker(redis_cluster: RedisCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A worker on three queues, one on each primary, with results in the cluster and a
    visibility timeout of 3 s (what it holds longer is renewed)."""
    import json
    import os

    directory = tmp_path_factory.mktemp("cluster-worker")
    queues = queues_on_primaries(redis_cluster, f"work-{uuid.uuid4().hex[:6]}")
    env = dict(
        os.environ,
        PYTHONUNBUFFERED="1",
        WORKER_BROKER_URL=redis_cluster.url,
        WORKER_RESULT_BACKEND=redis_cluster.url,
        WORKER_BROKER_TRANSPORT_OPTIONS=json.dumps({"visibility_timeout": 3}),
    )
    worker = WorkerProcess(
        [
            "-A",
            "apps.redis_cluster_app",
            "-P",
            "threads",
            "-c",
            "4",
            "-l",
            "INFO",
            "-n",
            f"cluster-{uuid.uuid4().hex[:6]}@localhost",
            "-Q",
            ",".join(queues),
        ],
        env,
        directory / "worker.log",
    )
    try:
        worker.wait_ready(timeout=60)
        yield worker, queues, env
    finally:
        worker.stop()


def _client(env: dict[str, str]) -> Any:
    from worker_core import App

    return App(
        "cluster-client",
        broker_url=env["WORKER_BROKER_URL"],
        result_backend=env["WORKER_RESULT_BACKEND"],
        broker_transport_options={"visibility_timeout": 3},
    )


def test_a_worker_runs_the_tasks_of_queues_on_every_primary_and_stores_their_results(
    cluster_worker: Any,
) -> None:
    _, queues, env = cluster_worker
    client = _client(env)
    try:
        results = [client.send_task("rc.where", queue=queue) for queue in queues for _ in range(3)]
        found = [result.get(timeout=30) for result in results]
        assert [each["queue"] for each in found] == [queue for queue in queues for _ in range(3)]
        sums = [client.send_task("rc.add", (n, n), queue=queues[n % 3]) for n in range(30)]
        assert [result.get(timeout=30) for result in sums] == [2 * n for n in range(30)]
    finally:
        client.close()


def test_a_countdown_longer_than_the_visibility_timeout_runs_once(
    cluster_worker: Any, tmp_path: Path
) -> None:
    worker, queues, env = cluster_worker
    client = _client(env)
    try:
        result = client.send_task("rc.where", queue=queues[0], countdown=5)  # past the 3 s lease: renewed
        assert result.get(timeout=30) == {"queue": queues[0], "redelivered": False}
        time.sleep(4)  # a negative: a lapsed lease would deliver it again meanwhile
        assert worker.log().count(f"Task rc.where[{result.id}] received") == 1, worker.log()
    finally:
        client.close()


def test_remote_control_reaches_the_worker_through_fanout(cluster_worker: Any) -> None:
    worker, queues, env = cluster_worker
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "worker_core",
            "inspect",
            "ping",
            "-A",
            "apps.redis_cluster_app",
            "-d",
            worker.name,
            "--timeout",
            "5",
        ],
        cwd=TESTS,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "pong" in done.stdout, done.stdout + done.stderr
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "worker_core",
            "inspect",
            "active_queues",
            "-A",
            "apps.redis_cluster_app",
            "-d",
            worker.name,
            "--json",
            "--timeout",
            "5",
        ],
        cwd=TESTS,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for queue in queues:
        assert queue in done.stdout


def test_the_worker_lists_its_queues_and_logs_no_failure(cluster_worker: Any) -> None:
    worker, queues, _ = cluster_worker
    log = worker.log()
    assert all(queue in log.partition(" ready.")[0] for queue in queues), log
    assert "Traceback" not in log and "Cannot fetch" not in log and "ERROR" not in log, log
