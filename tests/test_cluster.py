"""Scale out on a RabbitMQ cluster of the test's own (three nodes on free ports, never the shared
server): workers on a quorum queue lose the node that leads it mid-run, and nothing is lost."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import empty_redis, redis_db
from rabbit_cluster import RabbitCluster, failover_run
from tls_servers import require_program


@pytest.fixture
def cluster(tmp_path: Path):
    require_program("rabbitmq-server", "/usr/lib/rabbitmq/bin/rabbitmq-server", "/usr/sbin/rabbitmq-server")
    made = RabbitCluster(tmp_path / "cluster")
    try:
        yield made.start()
    finally:
        made.stop()


def test_workers_on_a_quorum_queue_lose_nothing_when_the_leading_node_dies(cluster, tmp_path):
    outcome = failover_run(cluster, tmp_path, empty_redis(redis_db(10)), tasks=600, worker_count=2,
                           concurrency=4, task_seconds=0.05, timeout=120)
    assert outcome.lost == 0, outcome
    assert outcome.workers_alive == outcome.workers, outcome
    # the worker that was on the dead node moved to another one by itself and went on
    assert outcome.reconnect_seconds and max(outcome.reconnect_seconds) < 30, outcome
    # only tasks that were running when their node died run again (acks_late)
    assert outcome.duplicates <= 2 * 16, outcome
