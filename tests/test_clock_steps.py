"""Time from one clock: a worker's wall clock stepped back or forward an hour (libfaketime, for
the worker's processes only) while it holds countdowns, and a worker whose clock is an hour off
beside a correct one. Countdowns wait on the monotonic clock and the broker's (Redis ``TIME``),
so they run on time; leases are scored and judged by Redis's clock, so no worker takes another's.
Each test has its own redis-server (visibility timeout 2 s); runs are counted in another Redis."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
import redis
from apps import basic
from conftest import REDIS_TEST_URL
from faults import FakeClock, RedisServer
from workers import TESTS, ask, wait_for

VISIBILITY_TIMEOUT = 2
OPTIONS = json.dumps({"visibility_timeout": VISIBILITY_TIMEOUT, "unacked_restore_interval": 0.5,
                      "interval_start": 0.2, "interval_step": 0.2, "interval_max": 0.5})
ENV = {"PYTHONPATH": str(TESTS), "WORKER_BROKER_TRANSPORT_OPTIONS": OPTIONS}
HOUR = 3600
#: the countdown held through the step (long enough to see it neither early nor stranded)
COUNTDOWN = 8.0


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


@pytest.mark.parametrize("step", [-HOUR, HOUR], ids=["back", "forward"])
def test_countdowns_held_through_a_clock_step_run_on_time(workers, server, client, tmp_path, step):
    clock = FakeClock(tmp_path)
    worker = workers.start("-c", "4", pool="threads", broker=server.url, env={**ENV, **clock.env()})
    key = f"runs-{uuid.uuid4().hex[:8]}"
    sent = time.monotonic()
    for n in range(10):
        basic.count.apply_async((REDIS_TEST_URL, key, n), countdown=COUNTDOWN)
    wait_for(lambda: worker.log().count(" received") == 10, message="the ten countdowns held")
    clock.set(step)
    direction = "back" if step < 0 else "forward"
    worker.wait_log(f"The wall clock jumped {direction} by 36", timeout=5)
    assert basic.runs(REDIS_TEST_URL, key) == {}  # not early: by the broker's clock nothing is due yet
    wait_for(lambda: len(basic.runs(REDIS_TEST_URL, key)) == 10, timeout=COUNTDOWN + 10, interval=0.1,
             message="the ten countdowns to run")
    ran = time.monotonic() - sent
    assert COUNTDOWN - 1 <= ran <= COUNTDOWN + 8, ran  # on time, by the real clock
    assert basic.runs(REDIS_TEST_URL, key) == dict.fromkeys(range(10), 1)
    log = worker.log()
    assert log.count("The wall clock jumped") == 1
    assert "10 task(s) held for their countdown or ETA re-armed at once" in log
    assert ask(basic.app, "stats", worker=worker.name)["wall_clock"]["wall_jumps"] == 1


@pytest.mark.parametrize("offset", [-HOUR, HOUR], ids=["behind", "ahead"])
def test_a_worker_an_hour_off_beside_a_correct_one_takes_no_lease_and_loses_none(
        workers, server, client, tmp_path, offset):
    clock = FakeClock(tmp_path, offset)
    # the correct worker is up first, on another queue; the skewed one holds at most twelve
    # countdowns, then the correct one consumes their queue too and takes the other six
    correct = workers.start("-Q", "elsewhere", "-c", "2", pool="threads", broker=server.url, env=ENV)
    skewed = workers.start("-c", "2", pool="threads", broker=server.url,
                           env={**ENV, **clock.env(), "WORKER_WORKER_ETA_TASK_LIMIT": "12"})
    key = f"runs-{uuid.uuid4().hex[:8]}"
    for n in range(12):
        basic.count.apply_async((REDIS_TEST_URL, key, n), countdown=6 * VISIBILITY_TIMEOUT)
    wait_for(lambda: skewed.log().count(" received") == 12, message="the skewed worker to hold twelve")
    added = ask(basic.app, "add_consumer", worker=correct.name, timeout=10, queue="celery")
    assert "ok" in added, added
    for n in range(12, 18):
        basic.count.apply_async((REDIS_TEST_URL, key, n), countdown=6 * VISIBILITY_TIMEOUT)
    wait_for(lambda: correct.log().count(" received") == 6, message="the correct worker to hold six")
    skew = ask(basic.app, "stats", worker=skewed.name)["wall_clock"]["broker_skew"]
    assert abs(skew + offset) < 5, skew  # the broker's clock minus the worker's
    wait_for(lambda: len(basic.runs(REDIS_TEST_URL, key)) == 18, timeout=30, message="every countdown to run")
    wait_for(lambda: redis.Redis.from_url(server.url).hlen("unacked") == 0, message="every task acknowledged")
    assert basic.runs(REDIS_TEST_URL, key) == dict.fromkeys(range(18), 1)
    # (a task counts its run before its worker logs its success)
    wait_for(lambda: skewed.log().count(" succeeded") + correct.log().count(" succeeded") == 18,
             message="every success logged")
    # each ran where it was first received: no restore took a lease from either worker
    assert skewed.log().count(" succeeded") == 12 and skewed.log().count(" received") == 12
    assert correct.log().count(" succeeded") == 6 and correct.log().count(" received") == 6
    word = "behind" if offset < 0 else "ahead of"
    assert skewed.log().count("This worker's clock is 3600") == 1
    assert f"s {word} the broker's" in skewed.log()
    assert "This worker's clock is" not in correct.log()
