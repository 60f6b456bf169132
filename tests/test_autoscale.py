"""Autoscaling: the seed's algorithm on a real thread pool, and in a real worker under load."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from apps import basic
from workers import TESTS, ask, children_of, wait_for

from worker_autoscale_backlog import BacklogAutoscaler
from worker_core.autoscale.default import DemandAutoscaler
from worker_core.slots import PoolOptions
from worker_pool_threads.pool import ThreadPool


@pytest.fixture
def pool():
    threads = ThreadPool(PoolOptions(concurrency=1))
    threads.start()
    yield threads
    threads.terminate()


def test_it_grows_to_demand_capped_at_max_at_once(pool):
    demand = [7]
    scaler = DemandAutoscaler(pool, 4, 1, demand=lambda: demand[0], keepalive=30)
    scaler.maybe_scale()
    assert pool.num_processes == 4
    assert scaler.info() == {"max": 4, "min": 1, "current": 4, "qty": 7}


def test_it_shrinks_to_demand_but_not_below_min_only_after_the_keepalive(pool):
    demand = [4]
    scaler = DemandAutoscaler(pool, 4, 2, demand=lambda: demand[0], keepalive=0.3)
    scaler.maybe_scale()
    demand[0] = 0
    scaler.maybe_scale()
    assert pool.num_processes == 4  # within the keepalive: no shrinking
    time.sleep(0.35)  # the behaviour under test: the keepalive passes
    scaler.maybe_scale()
    assert pool.num_processes == 2


def test_there_is_no_shrinking_before_the_first_growth(pool):
    pool.grow(2)
    scaler = DemandAutoscaler(pool, 4, 0, demand=lambda: 0, keepalive=0)
    scaler.maybe_scale()
    assert pool.num_processes == 3


def test_a_refused_shrink_is_logged_and_not_fatal(pool, caplog):
    release = threading.Event()
    demand = [2]
    scaler = DemandAutoscaler(pool, 2, 0, demand=lambda: demand[0], keepalive=0)
    scaler.maybe_scale()
    for _ in range(2):
        pool.apply_async(release.wait, (5,))
    wait_for(lambda: pool.idle == 0, message="both threads to take a task")
    demand[0] = 0
    with caplog.at_level(logging.DEBUG, logger="worker.autoscale"):
        scaler.maybe_scale()
    assert pool.num_processes == 2
    assert "won't scale down: all processes busy" in caplog.text
    release.set()


def test_update_moves_the_bounds_and_reports_the_prefetch_difference(pool):
    changes: list[int] = []
    scaler = DemandAutoscaler(pool, 4, 1, demand=lambda: 0, on_max_change=changes.append, keepalive=30)
    pool.grow(3)
    wait_for(lambda: pool.idle == 4, message="the new threads to be idle")
    assert scaler.update(max=2, min=None) == (2, 1)
    assert pool.num_processes == 2 and changes == [-2]
    assert scaler.update(max=6, min=3) == (6, 3)
    assert pool.num_processes == 3 and changes == [-2, 4]


def test_threaded_mode_checks_every_second_with_a_real_lock(pool):
    demand = [3]
    scaler = DemandAutoscaler(pool, 3, 1, demand=lambda: demand[0], keepalive=30)
    scaler.start()
    try:
        assert isinstance(scaler.mutex, type(threading.RLock()))
        wait_for(lambda: pool.num_processes == 3, timeout=5, message="the thread to grow the pool")
    finally:
        scaler.stop()


def test_the_backlog_autoscaler_grows_for_messages_still_in_the_broker(pool):
    backlog = [10]
    scaler = BacklogAutoscaler(pool, 4, 1, demand=lambda: 0, backlog=lambda: backlog[0], keepalive=0)
    scaler.maybe_scale()
    assert pool.num_processes == 4
    assert scaler.info()["backlog"] == 10


def test_the_backlog_autoscaler_does_not_shrink_while_work_waits(pool):
    backlog = [5]
    scaler = BacklogAutoscaler(pool, 4, 1, demand=lambda: 0, backlog=lambda: backlog[0], keepalive=0)
    scaler.maybe_scale()
    backlog[0] = 1
    scaler._read_at = float("-inf")
    scaler.maybe_scale()
    assert pool.num_processes == 4  # demand 1 < 4 processes, but the broker still holds work
    backlog[0] = 0
    scaler._read_at = float("-inf")
    scaler.maybe_scale()
    assert pool.num_processes == 1


# -- in a real worker --------------------------------------------------------------------------


#: the worker the remote-control tests ask by name: a broadcast to named workers returns once each
#: replied, not after its timeout
SCALER = "scaler@test"


@pytest.mark.parametrize("autoscaler", ["default", "backlog"])
def test_a_worker_scales_up_under_load_and_down_after_the_keepalive(workers, embedded_broker, autoscaler):
    worker = workers.start("--autoscale", "3,1", "--autoscaler", autoscaler, "-n", "scaler@test",
                           pool="prefork", broker=embedded_broker,
                           env={"PYTHONPATH": str(TESTS), "AUTOSCALE_KEEPALIVE": "1"})
    assert len(children_of(worker.pid)) == 1
    results = [basic.sleep.delay(1.0) for _ in range(6)]
    wait_for(lambda: len(children_of(worker.pid)) == 3, timeout=10, message="three children")
    assert ask(basic.app, "stats", worker="scaler@test")["autoscaler"]["max"] == 3
    assert [r.get(timeout=30) for r in results] == [1.0] * 6
    wait_for(lambda: len(children_of(worker.pid)) == 1, timeout=40, message="back to one child")
    assert ask(basic.app, "stats", worker="scaler@test")["autoscaler"]["current"] == 1


def test_control_autoscale_changes_the_range_and_the_prefetch_at_run_time(workers, embedded_broker):
    workers.start("--autoscale", "4,1", "-n", "scaler@test", pool="threads", broker=embedded_broker,
                  env={"PYTHONPATH": str(TESTS)})
    before = ask(basic.app, "stats", worker="scaler@test")
    assert before["prefetch_count"] == 16  # max concurrency x multiplier
    assert ask(basic.app, "autoscale", worker=SCALER, max=6, min=2) == {"ok": "autoscale now max=6 min=2"}
    after = ask(basic.app, "stats", worker="scaler@test")
    assert (after["autoscaler"]["max"], after["autoscaler"]["min"]) == (6, 2)
    assert after["autoscaler"]["current"] >= 2
    assert after["prefetch_count"] == 24
    refused = ask(basic.app, "pool_grow", worker=SCALER, n=1)
    assert "not available while the autoscaler is on" in refused["error"]
    assert "MIN may not exceed MAX" in ask(basic.app, "autoscale", worker=SCALER, max=2, min=5)["error"]
