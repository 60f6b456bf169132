"""``celery_queue_length{queue_name}`` exported by one elected worker of a fleet
(``--metrics-queue-lengths``): a real Prometheus server scraping three workers on Redis finds it
at exactly one, and at exactly one other once that one stops; the same on RabbitMQ; the leases'
figures; options that do not go together refused before anything starts."""

from __future__ import annotations

import time
import urllib.parse
import uuid

import pytest
from apps import basic
from conftest import REDIS_PORT, delete_queue, empty_redis, redis_db, require_server
from test_metrics_prometheus import ENV, metrics_url, prometheus, query, scrape  # noqa: F401 (a fixture)
from workers import wait_for

pytestmark = pytest.mark.timeout(180)


def start_fleet(workers, broker: str, count: int, lease: str, queues: str) -> list:
    return [workers.start("-c", "1", "--metrics-listen", "127.0.0.1:0", "--metrics-queue-lengths",
                          "--metrics-queues", queues, "--metrics-queue-interval", "0.5",
                          "--metrics-queue-lease", lease, pool="threads", broker=broker, env=ENV)
            for _ in range(count)]


def exporting(targets: dict[str, object], queue: str) -> dict[str, float]:
    """The targets whose own scrape has ``celery_queue_length`` for ``queue``, with its value."""
    found = {}
    for target in targets:
        samples = scrape(f"http://{target}/metrics")
        for (metric, labels), count in samples.items():
            if metric == "celery_queue_length" and dict(labels) == {"queue_name": queue}:
                found[target] = count
    return found


def send_waiting(broker: str, queue: str, count: int) -> None:
    basic.app.conf.update(broker_url=broker, result_backend=None)
    try:
        for n in range(count):
            basic.add.apply_async((n, n), queue=queue)
    finally:
        basic.app.close()


def test_one_worker_of_three_exports_the_queue_lengths_to_prometheus_and_another_once_it_stops(
        workers, prometheus):  # noqa: F811
    require_server(REDIS_PORT, "Redis")
    broker = empty_redis(redis_db(7))
    fleet = start_fleet(workers, broker, 3, f"ql-{uuid.uuid4().hex[:8]}", "waiting,celery")
    targets = {urllib.parse.urlsplit(metrics_url(worker)).netloc: worker for worker in fleet}
    send_waiting(broker, "waiting", 7)  # no worker consumes this queue: its length stays
    server = prometheus(list(targets))

    def answer(promql: str) -> list[tuple[dict, float]]:
        return [(found["metric"], float(found["value"][1])) for found in query(server, promql)]

    waiting = 'celery_queue_length{job="worker", queue_name="waiting"}'

    def one_exporter() -> dict | None:
        found = answer(waiting)
        assert len(found) <= 1, f"more than one worker exports the queue's length: {found}"
        return found[0][0] if found and found[0][1] == 7 else None

    leader_labels = wait_for(one_exporter, timeout=60, message="Prometheus to hold the length of 'waiting'")
    leader_target = leader_labels["instance"]
    assert set(exporting(targets, "waiting")) == {leader_target}  # asked directly: the same one only
    assert exporting(targets, "waiting")[leader_target] == 7
    assert "hostname" not in leader_labels  # the fleet's figure: no worker's name on it
    consumed = answer('celery_queue_length{job="worker", queue_name="celery"}')
    assert [count for _labels, count in consumed] == [0.0]
    leads = answer('sum(worker_lease_leader{job="worker"})')
    assert leads and leads[0][1] == 1
    for _ in range(10):  # never two, over several scrapes: the pause is the scrape interval itself
        assert one_exporter() is not None
        time.sleep(0.5)  # the scrape interval, over which there must never be two
    # the leader stops (its lease given up): one other exports, and only one
    assert targets[leader_target].stop() == 0

    def taken_over() -> dict | None:
        labels = one_exporter()
        return labels if labels is not None and labels["instance"] != leader_target else None

    successor = wait_for(taken_over, timeout=60, message="another worker to export the length")
    remaining = {target: worker for target, worker in targets.items() if target != leader_target}
    assert set(exporting(remaining, "waiting")) == {successor["instance"]}
    terms = {target: scrape(f"http://{target}/metrics") for target in remaining}
    assert sum(1 for samples in terms.values() for (metric, _labels), count in samples.items()
               if metric == "worker_lease_leader" and count == 1) == 1


def test_on_rabbitmq_one_worker_exports_the_lengths_and_another_takes_over(workers, amqp_url):
    queue = f"ql-waiting-{uuid.uuid4().hex[:8]}"
    try:
        send_waiting(amqp_url, queue, 4)
        fleet = start_fleet(workers, amqp_url, 2, f"ql-{uuid.uuid4().hex[:8]}", queue)
        targets = {urllib.parse.urlsplit(metrics_url(worker)).netloc: worker for worker in fleet}

        def one() -> str | None:
            found = exporting(targets, queue)
            assert len(found) <= 1, f"both workers export the length: {found}"
            return next((target for target, count in found.items() if count == 4), None)

        leader = wait_for(one, timeout=60, message="one worker to export the queue's length")
        assert targets.pop(leader).stop() == 0
        successor = wait_for(one, timeout=60, message="the other worker to take over")
        assert successor != leader
    finally:
        for worker in workers.started:
            worker.stop()
        delete_queue(amqp_url, queue)


@pytest.mark.parametrize("hostname", [True, False])
def test_the_gauges_of_other_plugins_are_served_with_the_workers_own(workers, embedded_broker, hostname):
    """What a scheduler plugin reports through the ``worker_gauges`` hook (here an app's hook):
    with the worker's hostname label, or none with --metrics-without-hostname."""
    flags = () if hostname else ("--metrics-without-hostname",)
    worker = workers.start("--metrics-listen", "127.0.0.1:0", *flags, app="apps.gauged", pool="solo",
                           broker=embedded_broker, env=ENV)
    samples = scrape(metrics_url(worker))
    own = {"hostname": worker.name} if hostname else {}
    assert samples[("worker_beat_leader", frozenset(own.items()))] == 1
    assert samples[("worker_beat_entry_due", frozenset({**own, "entry": "nightly"}.items()))] == 30


@pytest.mark.parametrize(("args", "message"), [
    (("--metrics-queue-lengths",), "--metrics-queue-lengths needs --metrics-listen [HOST:]PORT"),
    (("--metrics-listen", "0", "--metrics-queues", "a"), "--metrics-queues needs --metrics-queue-lengths"),
    (("--metrics-listen", "0", "--metrics-queue-lengths", "--metrics-queues", "a,,b"),
     "must be comma-separated queue names"),
    (("--metrics-listen", "0", "--metrics-queue-lengths", "--metrics-queue-interval", "-1"),
     "must be a number of seconds above 0"),
])
def test_queue_length_options_that_do_not_go_together_are_refused(workers, embedded_broker, args, message):
    worker = workers.start(*args, pool="solo", broker=embedded_broker, env=ENV, ready=False)
    assert worker.process.wait(timeout=30) != 0
    assert message in worker.log()
