"""A worker that stands still (SIGSTOP to all its processes, as a paused VM or a throttled
container) for longer than Redis's visibility timeout: alone it runs every task once; beside a
second worker that took its messages meanwhile, only the tasks that were running when it stopped
run twice (the documented limit), and a copy that comes back to it is dropped. Each test has its
own redis-server and a visibility timeout of 2 seconds; runs are counted in another Redis."""

from __future__ import annotations

import json
import os
import re
import signal
import time
import uuid
from pathlib import Path

import kombu
import pytest
import redis
from apps import basic
from conftest import REDIS_TEST_URL
from faults import RedisServer
from workers import TESTS, ask, children_of, wait_for

VISIBILITY_TIMEOUT = 2
#: every worker looks for leases older than the timeout twice a second (kombu: every 10 s)
OPTIONS = json.dumps({"visibility_timeout": VISIBILITY_TIMEOUT, "unacked_restore_interval": 0.5,
                      "interval_start": 0.2, "interval_step": 0.2, "interval_max": 0.5})
ENV = {"PYTHONPATH": str(TESTS), "WORKER_BROKER_TRANSPORT_OPTIONS": OPTIONS}
#: the pause: three visibility timeouts (a sleep that is the fault under test)
PAUSE = 3 * VISIBILITY_TIMEOUT


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
    basic.app.conf.update(broker_url=None, broker_transport_options={})


def _left(url: str) -> tuple[int, int]:
    """Records in ``unacked`` and messages in the queue."""
    broker = redis.Redis.from_url(url)
    return int(broker.hlen("unacked")), int(broker.llen("celery"))


def _pause(worker, seconds: float) -> None:
    """Stop the worker and every process it started, for ``seconds``, then let them go on."""
    pids = [worker.pid, *children_of(worker.pid)]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)  # the pause under test
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_a_lone_worker_stopped_past_the_visibility_timeout_runs_each_task_once(workers, server, client, pool):
    worker = workers.start("-c", "4", pool=pool, broker=server.url, env=ENV)
    key = f"runs-{uuid.uuid4().hex[:8]}"
    for n in range(16):  # four run, twelve wait in the prefetch window
        basic.count_slowly.delay(REDIS_TEST_URL, key, n, 1.5)
    wait_for(lambda: len(basic.runs(REDIS_TEST_URL, key)) == 4, message="four tasks to start")
    wait_for(lambda: worker.log().count(" received") == 16, message="the sixteen tasks received")
    _pause(worker, PAUSE)
    wait_for(lambda: len(basic.runs(REDIS_TEST_URL, key)) == 16, timeout=30, message="every task to run")
    wait_for(lambda: _left(server.url) == (0, 0), timeout=15, message="every task to be acknowledged")
    assert basic.runs(REDIS_TEST_URL, key) == dict.fromkeys(range(16), 1)
    log = worker.log()
    assert log.count(" succeeded") == 16
    assert "Lost the leases" not in log and "came back" not in log  # nobody took them meanwhile


def _succeeded(log: str) -> dict[int, float]:
    """Each task's value -> how long it ran, from a worker's log."""
    found = {}
    for line in log.splitlines():
        if " succeeded in " in line:
            runtime, value = line.rsplit(" succeeded in ", 1)[1].split("s: ")
            found[int(value)] = float(runtime)
    return found


def _consume(worker, queue: str) -> None:
    """Have ``worker`` consume ``queue`` too (remote ``add_consumer``)."""
    added = ask(basic.app, "add_consumer", worker=worker.name, timeout=10, queue=queue)
    assert "ok" in added, added


def test_beside_another_worker_only_the_tasks_running_at_the_pause_run_twice(workers, server, client):
    # the other worker is up first, on another queue: it takes none of the twelve before the pause
    other = workers.start("-Q", "elsewhere", "-c", "4", pool="threads", broker=server.url, env=ENV)
    paused = workers.start("-c", "4", pool="threads", broker=server.url, env=ENV)
    key = f"runs-{uuid.uuid4().hex[:8]}"
    for n in range(12):
        basic.count_slowly.delay(REDIS_TEST_URL, key, n, 2)
    wait_for(lambda: len(basic.runs(REDIS_TEST_URL, key)) == 4, message="four tasks to start")
    wait_for(lambda: paused.log().count(" received") == 12, message="the twelve tasks held by one worker")
    _consume(other, "celery")
    _pause(paused, PAUSE)  # the other worker restores what it holds meanwhile, and runs it
    wait_for(lambda: "Lost the leases" in paused.log(), timeout=15, message="the paused worker's loss")
    wait_for(lambda: len(basic.runs(REDIS_TEST_URL, key)) == 12, timeout=30, message="every task to run")
    wait_for(lambda: _left(server.url) == (0, 0), timeout=15, message="every task to be acknowledged")
    ran_here = _succeeded(paused.log())
    # the tasks running when it stopped (they ran through the pause) finish here; none starts here after it
    across = {n for n, runtime in ran_here.items() if runtime >= PAUSE}
    before = set(ran_here) - across
    assert 1 <= len(across) <= 4
    wait_for(lambda: len(_succeeded(other.log())) == 12 - len(before), timeout=15,
             message="the other worker to run every task the paused one lost")
    runs = basic.runs(REDIS_TEST_URL, key)
    assert sorted(runs) == list(range(12))
    assert {n for n, times in runs.items() if times == 2} == across  # as documented: those only
    assert max(runs.values()) == 2
    log = paused.log()
    lost = 12 - len(before)
    [line] = [line for line in log.splitlines() if f"Lost the leases of {lost} message(s)" in line]
    dropped, started = map(int, re.search(r": (\d+) not started .*, (\d+) started finish", line).groups())
    assert dropped + started == lost and started >= len(across)


def test_copies_that_come_back_to_the_worker_that_ran_them_are_dropped(workers, server, client):
    # Another process restores the stopped worker's messages (kombu's own restore, by the test's
    # clock, as a Celery worker does) and nobody else takes them: the copies come back to it.
    worker = workers.start("-c", "4", pool="threads", broker=server.url, env=ENV)
    key = f"runs-{uuid.uuid4().hex[:8]}"
    for n in range(8):
        basic.count_slowly.delay(REDIS_TEST_URL, key, n, 1.5)
    wait_for(lambda: len(basic.runs(REDIS_TEST_URL, key)) == 4, message="four tasks to start")
    wait_for(lambda: worker.log().count(" received") == 8, message="the eight tasks received")
    pids = [worker.pid, *children_of(worker.pid)]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(VISIBILITY_TIMEOUT + 1)  # the pause under test: the leases go stale
        options = {"visibility_timeout": VISIBILITY_TIMEOUT}
        with kombu.Connection(server.url, transport_options=options) as connection:
            connection.default_channel.qos.restore_visible(num=None, interval=1)
        assert _left(server.url) == (0, 8)  # all eight back in the queue
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    wait_for(lambda: len(basic.runs(REDIS_TEST_URL, key)) == 8, timeout=30, message="every task to run")
    wait_for(lambda: _left(server.url) == (0, 0), timeout=15, message="every task to be acknowledged")
    assert basic.runs(REDIS_TEST_URL, key) == dict.fromkeys(range(8), 1)
    log = worker.log()
    assert log.count("Lost the leases of 8 message(s)") == 1
    # each of the eight copies is dropped with one line or is the one run of its task: the four
    # that ran (or ran on) are dropped; of the four not started, a copy that arrives before the
    # worker let go of the message it holds is dropped too (that message runs instead, or, when
    # an executor had stopped it as it started, goes back to its queue and comes back once more),
    # the others run
    dropped = log.count("the copy is dropped")
    requeued = log.count("the message goes back to its queue, to run once")
    run_again = log.count(" received") - 8
    assert dropped >= 4 and dropped + run_again - requeued == 8, log
