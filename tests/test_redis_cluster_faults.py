"""The cluster changing under load, counted per message in a ledger on the suite's plain Redis
(``apps.redis_cluster_app``): a node added and a queue's slot migrated to it key by key while tasks
flow (the workers follow ASK, TRYAGAIN and MOVED to a node they never knew), and a primary killed
during 10,000 tasks with its replica promoted. Nothing the cluster acknowledged is lost, and a
task that runs twice is one a log line names (a write no replica confirmed, a lease lost, an
acknowledgement that found no record, a publish the producer sent again)."""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import REDIS_PORT, REDIS_TEST_URL, require_server
from redis_cluster import RedisCluster, queues_on_primaries
from workers import WorkerProcess, wait_for

from worker_core import App

logger = logging.getLogger(__name__)

#: what every worker and producer of these tests is given: leases well past a failover's length,
#: a WAIT for one replica after each write, a quick look at every queue
OPTIONS = {
    "visibility_timeout": 10,
    "wait_for_replicas": 1,
    "wait_timeout": 1.0,
    "polling_interval": 0.5,
    "interval_start": 0.2,
    "interval_step": 0.2,
    "interval_max": 1.0,
}


class Run:
    """The workers of one test, the ledger they count in, and what the producer had to send again."""

    def __init__(
        self,
        cluster: RedisCluster,
        directory: Path,
        queues: list[str],
        workers: int,
        concurrency: int,
        seconds: float,
    ) -> None:
        require_server(REDIS_PORT, "Redis")
        self.cluster = cluster
        self.tag = uuid.uuid4().hex[:8]
        self.key = f"cluster-ledger-{self.tag}"
        self.ledger = redis.Redis.from_url(REDIS_TEST_URL)
        self.queues = queues
        self.resent: set[str] = set()
        env = dict(
            os.environ,
            PYTHONUNBUFFERED="1",
            WORKER_BROKER_URL=cluster.url,
            WORKER_RESULT_BACKEND="disabled",
            WORKER_BROKER_TRANSPORT_OPTIONS=json.dumps(OPTIONS),
            CLUSTER_LEDGER=REDIS_TEST_URL,
            CLUSTER_LEDGER_KEY=self.key,
            CLUSTER_TASK_SECONDS=str(seconds),
        )
        self.workers = [
            WorkerProcess(
                [
                    "-A",
                    "apps.redis_cluster_app",
                    "-P",
                    "threads",
                    "-c",
                    str(concurrency),
                    "-l",
                    "INFO",
                    "-n",
                    f"faults{index}-{self.tag}@localhost",
                    "-Q",
                    ",".join(queues),
                ],
                env,
                directory / f"worker-{index}.log",
            )
            for index in range(workers)
        ]
        for worker in self.workers:
            worker.wait_ready(timeout=60)
        self.producer = App(
            "cluster-faults",
            broker_url=cluster.url,
            result_backend="disabled",
            broker_transport_options=OPTIONS,
        )

    def task_id(self, number: int) -> str:
        return f"{self.tag}-{number}"

    def send(self, numbers: range) -> None:
        """Publish one task per number, round robin over the queues; a publish that fails (its
        primary is failing over) is sent again, and said so: it may have reached the cluster."""
        for number in numbers:
            while True:
                try:
                    self.producer.send_task(
                        "rc.work",
                        (number,),
                        queue=self.queues[number % len(self.queues)],
                        task_id=self.task_id(number),
                        ignore_result=True,
                    )
                    break
                except Exception as exc:
                    self.resent.add(self.task_id(number))
                    logger.warning(
                        "publishing task %s failed (%r): sending it again", self.task_id(number), exc
                    )
                    time.sleep(0.2)  # the pause is the point: the cluster is failing over

    def counts(self) -> dict[int, int]:
        return {int(number): int(count) for number, count in self.ledger.hgetall(self.key).items()}

    def wait_done(self, total: int, timeout: float) -> dict[int, int]:
        try:
            wait_for(lambda: self.ledger.hlen(self.key) >= total, timeout, interval=0.1,
                     message=f"the {total} tasks in the ledger")
        except AssertionError:
            pass  # the caller names the tasks that never ran
        time.sleep(1.0)  # a negative: a duplicate still running lands in the ledger meanwhile
        return self.counts()

    def logged_causes(self) -> str:
        """Every warning the workers logged (a duplicate's cause names its task there)."""
        return "\n".join(
            line
            for worker in self.workers
            for line in worker.log().splitlines()
            if "WARNING" in line or "ERROR" in line
        )

    def unexplained(self, counts: dict[int, int]) -> list[str]:
        causes = self.logged_causes()
        named = set(re.findall(rf"{self.tag}-\d+", causes)) | self.resent
        return [
            self.task_id(number)
            for number, count in counts.items()
            if count > 1 and self.task_id(number) not in named
        ]

    def close(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.producer.close()
        self.ledger.delete(self.key)


@pytest.fixture
def run_factory(redis_cluster: RedisCluster, tmp_path: Path) -> Iterator[Any]:
    made: list[Run] = []

    def make(queues: list[str], workers: int = 1, concurrency: int = 8, seconds: float = 0.0) -> Run:
        run = Run(redis_cluster, tmp_path, queues, workers, concurrency, seconds)
        made.append(run)
        return run

    yield make
    for run in made:
        run.close()


def test_a_slot_migrated_to_a_node_added_during_load_loses_nothing(
    redis_cluster: RedisCluster, run_factory: Any
) -> None:
    [queue] = queues_on_primaries(redis_cluster, f"migrate-{uuid.uuid4().hex[:6]}", 1)
    added = redis_cluster.add_node()  # a new shard: a primary and its replica
    redis_cluster.add_node(replica_of=added)
    run = run_factory([queue], concurrency=2, seconds=0.01)
    total = 2000
    run.send(range(total // 2))  # a backlog: the queue's list, records and leases all have keys
    sender = threading.Thread(target=run.send, args=(range(total // 2, total),))
    slot = redis_cluster.slot_of(f"{{{queue}}}")
    sender.start()
    # one key at a time, a pause between: scripts meet the queue's keys split over two nodes
    before = run.ledger.hlen(run.key)
    moved = redis_cluster.migrate_slot(slot, added, batch=1, pause=0.3)
    during = run.ledger.hlen(run.key) - before
    sender.join(timeout=120)
    assert moved >= 3, "the queue's list, records and leases moved"
    assert during > 0, "the worker went on while the slot moved"
    assert redis_cluster.primary_of_slot(slot) == added
    counts = run.wait_done(total, timeout=120)
    lost = [number for number in range(total) if counts.get(number, 0) == 0]
    assert not lost, f"{len(lost)} task(s) never ran, e.g. {lost[:10]}"
    assert not run.unexplained(counts), run.logged_causes()
    # the worker fetched from the new node: nothing it held was given back meanwhile
    for worker in run.workers:
        assert "whose lease lapsed" not in worker.log(), worker.log()


def test_a_primary_killed_during_10000_tasks_loses_nothing_the_cluster_acknowledged(
    redis_cluster: RedisCluster, run_factory: Any
) -> None:
    queues = queues_on_primaries(redis_cluster, f"failover-{uuid.uuid4().hex[:6]}", 3)
    run = run_factory(queues, workers=2, concurrency=8, seconds=0.001)
    total = 10_000
    slot = redis_cluster.slot_of(f"{{{queues[0]}}}")
    victim = redis_cluster.primary_of_slot(slot)
    [replica] = redis_cluster.replicas_of(victim)
    sender = threading.Thread(target=run.send, args=(range(total),))
    sender.start()
    try:
        wait_for(lambda: run.ledger.hlen(run.key) >= total // 3, 120, interval=0.05,
                 message="the workers to get going (a third of the tasks done)")
        redis_cluster.kill(victim)
        assert redis_cluster.wait_primary_changed(slot, victim) == replica  # its replica took over
        redis_cluster.restart(victim)  # back, as a replica of the promoted node (as an operator would)
        sender.join(timeout=300)
        assert not sender.is_alive(), "the producer did not get through"
        counts = run.wait_done(total, timeout=180)
    finally:
        sender.join(timeout=300)
        if not redis_cluster.node(victim).alive:
            redis_cluster.restart(victim)
    lost = [number for number in range(total) if counts.get(number, 0) == 0]
    assert not lost, f"{len(lost)} task(s) never ran, e.g. {lost[:10]}"
    assert not run.unexplained(counts), run.logged_causes()
    for worker in run.workers:
        assert worker.process.poll() is None, worker.log()
        # the queues on the other primaries went on while one failed over
        assert "Traceback" not in worker.log(), worker.log()
