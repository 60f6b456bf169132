"""Celery on the Redis Cluster through the kombu transport this plugin ships
(``broker_transport = "worker_transport_redis_cluster.kombu_transport:Transport"``): a Celery client
feeds this worker, and a Celery worker runs what a Celery client and this project's client send,
both ways over one cluster the suite starts, with the results in the suite's plain Redis (Celery
has no result backend for a Redis Cluster)."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from apps import basic
from redis_cluster import RedisCluster
from workers import wait_for

from worker_transport_redis_cluster.keys import QueueKeys

#: the settings a Celery app needs to reach the cluster: the docs page "Redis Cluster" shows them
TRANSPORT = "worker_transport_redis_cluster.kombu_transport:Transport"


def celery_client(cluster: RedisCluster, backend: str, queue: str):
    from celery import Celery

    client = Celery("cluster-celery-client", set_as_current=False)
    client.conf.update(
        broker_url=cluster.url,
        broker_transport=TRANSPORT,
        broker_transport_options={"visibility_timeout": 60},
        result_backend=backend,
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
    )
    return client


def _ready_on_cluster(cluster: RedisCluster, queue: str) -> int:
    """Messages waiting in ``queue``'s lists on the primary serving its slot."""
    keys = QueueKeys(queue, "", (0, 3, 6, 9))
    primary = cluster.primary_of_slot(keys.slot)
    return sum(int(cluster.call(primary, "LLEN", name)) for name in keys.lists)


def test_a_celery_client_on_the_shipped_kombu_transport_feeds_this_worker(
    workers, redis_cluster: RedisCluster, redis_url: str
) -> None:
    queue = f"celery-in-{uuid.uuid4().hex[:8]}"
    client = celery_client(redis_cluster, redis_url, queue)
    try:
        early = client.send_task("apps.basic.add", (20, 22))
        # the message is in the queue's slot, in this transport's layout, before any worker runs
        assert _ready_on_cluster(redis_cluster, queue) == 1
        workers.start("-Q", queue, pool="threads", broker=redis_cluster.url, backend=redis_url)
        assert early.get(timeout=30) == 42
        assert client.send_task("apps.basic.add", (1, 2), countdown=1).get(timeout=30) == 3
        assert client.send_task("apps.basic.add", (2, 2), priority=7).get(timeout=30) == 4
        sums = [client.send_task("apps.basic.add", (n, n)) for n in range(20)]
        assert [result.get(timeout=30) for result in sums] == [2 * n for n in range(20)]
        with pytest.raises(Exception) as caught:
            client.send_task("apps.basic.boom", ("from celery",)).get(timeout=30)
        assert type(caught.value).__name__ == "Boom" and "from celery" in str(caught.value)
        assert _ready_on_cluster(redis_cluster, queue) == 0
    finally:
        client.close()


def test_a_celery_worker_on_the_shipped_kombu_transport_runs_what_both_clients_send(
    workers, redis_cluster: RedisCluster, redis_url: str
) -> None:
    queue = f"celery-out-{uuid.uuid4().hex[:8]}"
    worker = workers.start_celery(
        "-Q",
        queue,
        broker=redis_cluster.url,
        backend=redis_url,
        env={"CELERY_BROKER_TRANSPORT": TRANSPORT, "CELERY_DEFAULT_QUEUE": queue},
    )
    client = celery_client(redis_cluster, redis_url, queue)
    basic.app.conf.update(broker_url=redis_cluster.url, result_backend=redis_url)
    try:
        assert client.send_task("apps.basic.add", (5, 6)).get(timeout=30) == 11
        ours = [basic.add.apply_async((n, 1), queue=queue) for n in range(10)]
        assert [result.get(timeout=30) for result in ours] == [n + 1 for n in range(10)]
        assert client.send_task("apps.basic.add", (3, 4), countdown=1).get(timeout=30) == 7
        # Celery's remote control goes through the fanout exchange (sharded pub/sub) and a reply queue
        replies = client.control.ping(destination=[worker.name], timeout=5)
        assert replies == [{worker.name: {"ok": "pong"}}], replies
        assert _ready_on_cluster(redis_cluster, queue) == 0
        assert "Traceback" not in worker.log() and "ERROR" not in worker.log(), worker.log()
    finally:
        client.close()
        basic.app.close()


def test_a_celery_worker_on_the_shipped_transport_renews_a_countdown_past_the_visibility_timeout(
    workers, redis_cluster: RedisCluster, redis_url: str
) -> None:
    queue = f"celery-lease-{uuid.uuid4().hex[:8]}"
    options = {"visibility_timeout": 2}
    worker = workers.start_celery(
        "-Q",
        queue,
        broker=redis_cluster.url,
        backend=redis_url,
        env={
            "CELERY_BROKER_TRANSPORT": TRANSPORT,
            "CELERY_DEFAULT_QUEUE": queue,
            "CELERY_BROKER_TRANSPORT_OPTIONS": json.dumps(options),
        },
    )
    client = celery_client(redis_cluster, redis_url, queue)
    client.conf.broker_transport_options = options
    keys = QueueKeys(queue, "", (0, 3, 6, 9))
    primary = redis_cluster.primary_of_slot(keys.slot)

    def leases() -> list[tuple[bytes, float]]:
        return redis_cluster.call(primary, "ZRANGE", keys.leases, 0, -1, "WITHSCORES")

    try:
        result = client.send_task("apps.basic.add", (8, 9), countdown=6)
        wait_for(leases, timeout=20, message="the Celery worker to hold the countdown")
        held_since = time.monotonic()
        time.sleep(3.5)  # the pause is the point: past the 2 s lease, only a renewal keeps it
        assert time.monotonic() - held_since > options["visibility_timeout"]
        [(_, deadline)] = leases()
        seconds, microseconds = redis_cluster.call(primary, "TIME")
        assert deadline > int(seconds) * 1000 + int(microseconds) // 1000, "the lease lapsed"
        assert result.get(timeout=30) == 17
        log = worker.log()
        assert "whose lease lapsed" not in log and "delivered again" not in log, log
        wait_for(lambda: not leases(), timeout=10, message="the acknowledgement to drop the lease")
    finally:
        client.close()
