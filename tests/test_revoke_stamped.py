"""Revoking by stamped headers, from Celery's client: a group, a chain and a chord that Celery's
canvas stamping marked are revoked whole on this worker, a stamped task that comes later is
discarded as it arrives, and with ``terminate`` a running one is killed (prefork)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from conftest import REDIS_PORT, WorkerFactory, empty_redis, redis_db, require_server
from workers import TESTS, wait_for

pytestmark = pytest.mark.timeout(120)

BROKER, RESULTS = redis_db(8), redis_db(10)


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    require_server(REDIS_PORT, "Redis")
    empty_redis(BROKER)
    empty_redis(RESULTS)
    factory = WorkerFactory(tmp_path_factory.mktemp("stamped"))
    yield factory.start("-c", "2", pool="prefork", broker=BROKER, backend=RESULTS,
                        env={"PYTHONPATH": str(TESTS)})
    factory.cleanup()


@pytest.fixture
def client(worker: Any) -> Iterator[Any]:
    from celery import Celery

    app = Celery("stamping-client", broker=BROKER, backend=RESULTS)
    wait_for(lambda: app.control.ping(destination=[worker.name], timeout=0.5), timeout=20,
             message="the worker to answer a ping")
    yield app
    app.close()


def stamped(signature: Any, **stamps: str) -> Any:
    from celery.canvas import StampingVisitor

    class Stamps(StampingVisitor):
        def on_signature(self, sig: Any, **headers: Any) -> dict[str, str]:
            return dict(stamps)

    signature.stamp(visitor=Stamps())
    return signature


def revoke(client: Any, worker: Any, terminate: bool = False, **headers: str) -> Any:
    [reply] = client.control.revoke_by_stamped_headers(headers, destination=[worker.name],
                                                        terminate=terminate, reply=True, timeout=5)
    return reply[worker.name]


def test_a_stamped_group_chain_and_chord_are_revoked_whole(worker, client, tmp_path):
    from celery import chain, chord, group

    proof = str(tmp_path / "ran")
    record = lambda value, **options: client.signature("apps.basic.record", (proof, value), **options)  # noqa: E731
    grouped = stamped(group(record(n) for n in range(3)), batch="b1").apply_async(countdown=30)
    chained = stamped(chain(record("first", countdown=30), record("second")), batch="b1").apply_async()
    chorded = stamped(chord([record("h1", countdown=30), record("h2", countdown=30)], record("body")),
                      batch="b1").apply_async()
    header = list(chorded.parent.results)
    waiting = [*grouped.results, chained.parent, *header]
    for result in waiting:
        worker.wait_log(f"[{result.id}] received")
    assert revoke(client, worker, batch="b1") == {
        "ok": "headers {'batch': 'b1'} flagged as revoked, but not terminated"}
    for result in waiting:
        wait_for(lambda result=result: result.state == "REVOKED", 10, message=f"{result.id} REVOKED")
        worker.wait_log(f"Discarding revoked task: apps.basic.record[{result.id}]")
    assert chained.state == "PENDING" and chorded.state != "SUCCESS"  # what followed never ran
    later = stamped(record("later"), batch="b1").apply_async()
    wait_for(lambda: later.state == "REVOKED", 10, message="the later stamped task REVOKED")
    worker.wait_log(f"Discarding revoked task: apps.basic.record[{later.id}] (revoked by header: "
                    f"{{'batch': 'b1'}})")
    unstamped = record("unstamped").apply_async()
    assert unstamped.get(timeout=20) == "unstamped"
    assert (tmp_path / "ran").read_text() == "unstamped\n"


def test_terminate_kills_the_running_stamped_task(worker, client):
    running = stamped(client.signature("apps.basic.sleep", (30,)), job="j1").apply_async()
    worker.wait_log(f"[{running.id}] received")
    def runs() -> bool:
        active = client.control.inspect(destination=[worker.name], timeout=2).active() or {}
        return any(request["id"] == running.id for request in active.get(worker.name, []))

    wait_for(runs, 10, message="the task to run")
    assert revoke(client, worker, terminate=True, job="j1") == {
        "ok": "headers defaultdict(<class 'set'>, {'job': {'j1'}}) revoked"}
    wait_for(lambda: running.state == "REVOKED", 10, message="the terminated task REVOKED")
    assert revoke(client, worker, terminate=True, job="nothing-runs") == {
        "ok": "headers {'job': 'nothing-runs'} were not terminated"}
