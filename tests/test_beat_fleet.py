"""Five workers run ``-B`` with a 1 s entry, each through a TCP proxy of the test's own, while the
leader is killed (SIGKILL), paused past its lease (SIGSTOP, then SIGCONT) and cut off from the
broker: every tick arrives exactly once, none is missing, and none later than the stated takeover
(the lease's ttl plus half a second) allows, with room for a loaded machine.

The ticks go to a queue the test reads itself, so it sees when each was sent whichever worker
would have run it (a paused worker runs nothing)."""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import AMQP_TEST_URL, REDIS_ADDRESS, delete_queue, empty_redis, redis_db, require_server
from kombu.connection import Connection
from kombu.entity import Exchange, Queue
from kombu.messaging import Consumer, Producer
from workers import TESTS, WorkerProcess, wait_for

from worker_core.testing.proxy import TcpProxy, proxied

TICKS = "beat-ticks"
#: the takeover the documentation states: beat_lease_timeout (3 s) plus half a second
TAKEOVER = 3.5
#: seconds a tick may arrive after its due time beyond the takeover, on a loaded machine
SLACK = 6.0
#: seconds the leader stays paused or cut off: longer than TAKEOVER + SLACK, so a takeover that
#: waited for it to come back would show as ticks that late
OUTAGE = 12.0
FLEET = 5
REDIS_FLEET_URL = redis_db(9)
RETRY = '{"interval_start": 0.2, "interval_step": 0.2, "interval_max": 1}'
LEADS = re.compile(r"beat: (\S+) sends the periodic tasks now")


class Arrivals:
    """Reads the tick queue on a thread: each tick's due time, task id and arrival time."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.seen: list[tuple[datetime, str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._caught_up = threading.Event()
        self.error: BaseException | None = None

    def __enter__(self) -> Arrivals:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(10)

    def _read(self) -> None:
        queue = Queue(TICKS, Exchange(TICKS), TICKS)

        def arrived(body: Any, message: Any) -> None:
            if message.headers.get("marker"):
                message.ack()
                self._caught_up.set()
                return
            self.seen.append(
                (
                    datetime.fromisoformat(message.headers["periodic_task_due"]),
                    message.headers["id"],
                    time.time(),
                )
            )
            message.ack()

        try:
            with (
                Connection(self.url) as connection,
                Consumer(connection, [queue], callbacks=[arrived], accept=["json"]),
            ):
                while not self._stop.is_set():
                    with contextlib.suppress(TimeoutError):
                        connection.drain_events(timeout=0.5)
        except BaseException as exc:  # the assertions say so
            self.error = exc

    def count(self) -> int:
        return len(self.seen)

    def catch_up(self) -> None:
        """Wait until every tick sent so far has arrived: a marker sent behind them has (one
        queue, first in, first out)."""
        self._caught_up.clear()
        queue = Queue(TICKS, Exchange(TICKS), TICKS)
        with Connection(self.url) as connection:
            Producer(connection).publish({}, exchange=queue.exchange, routing_key=TICKS, declare=[queue],
                                         headers={"marker": True}, serializer="json")
        wait_for(self._caught_up.is_set, 20, message="the ticks sent so far (a marker sent behind them)")


class Fleet:
    """The workers, each behind a proxy of its own."""

    def __init__(self, url: str, tmp_path: Path) -> None:
        self.url = url
        self.tmp_path = tmp_path
        self.workers: list[WorkerProcess] = []
        self.proxies: dict[str, TcpProxy] = {}
        self._exits = contextlib.ExitStack()

    def start(self, index: int) -> WorkerProcess:
        through = self._exits.enter_context(proxied(self.url))
        assert through is not None
        proxy, url = through
        name = f"w{index}@beat-test"
        env = {
            "PYTHONPATH": str(TESTS),
            "PYTHONUNBUFFERED": "1",
            "BEAT_BROKER": url,
            "WORKER_BROKER_TRANSPORT_OPTIONS": RETRY,
        }
        worker = WorkerProcess(
            ["-A", "apps.beat_fleet", "-B", "-P", "solo", "-n", name, "-l", "INFO", "-b", url],
            dict(os.environ, **env),
            self.tmp_path / f"{name}.log",
        )
        self.workers.append(worker)
        self.proxies[name] = proxy
        return worker

    def terms(self) -> collections.Counter[str]:
        """How many times each worker took the lease, from its log."""
        counted: collections.Counter[str] = collections.Counter()
        for worker in self.workers:
            counted[worker.name] = len(LEADS.findall(worker.log()))
        return counted

    def new_leader(self, before: collections.Counter[str], timeout: float = 30.0) -> WorkerProcess:
        """The worker that took the lease since ``before`` was counted."""

        def taken() -> WorkerProcess | None:
            now = self.terms()
            return next((worker for worker in self.workers if now[worker.name] > before[worker.name]), None)

        found = wait_for(taken, timeout, message="another worker to take the lease")
        assert isinstance(found, WorkerProcess)
        return found

    def close(self) -> None:
        for worker in self.workers:
            worker.signal(signal.SIGCONT)
            worker.kill()
        self._exits.close()


@pytest.fixture
def broker(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "redis":
        yield empty_redis(REDIS_FLEET_URL)
        empty_redis(REDIS_FLEET_URL)
        return
    require_server(5672, "RabbitMQ")
    _forget_amqp(AMQP_TEST_URL)
    yield AMQP_TEST_URL
    _forget_amqp(AMQP_TEST_URL)


def _forget_amqp(url: str) -> None:
    """Delete the tick queue and the lease's queue (which holds the schedule's state)."""
    delete_queue(url, TICKS)
    with Connection(url) as connection:
        connection.default_channel.queue_delete("worker.lease.beat")


@pytest.mark.parametrize("broker", ["redis", "amqp"], indirect=True)
def test_five_schedulers_send_each_tick_once_through_kill_pause_and_cut(broker: str, tmp_path: Path) -> None:
    assert REDIS_ADDRESS  # (the fleet's Redis is the suite's own under pytest-xdist)
    fleet = Fleet(broker, tmp_path)
    try:
        with Arrivals(broker) as arrivals:
            for index in range(FLEET):
                fleet.start(index)
            for worker in fleet.workers:
                worker.wait_ready(60)
            leader = fleet.new_leader(collections.Counter())
            wait_for(lambda: arrivals.count() >= 3, 30, message="the first ticks")
            started = time.monotonic()

            # SIGKILL: the leader's lease lapses (Redis) or its connection closes (RabbitMQ)
            before = fleet.terms()
            leader.crash()
            leader = fleet.new_leader(before)
            fleet.start(FLEET).wait_ready(60)  # the fleet scales back up
            seen = arrivals.count()
            wait_for(lambda: arrivals.count() >= seen + 3, 30, message="ticks after the kill")

            # SIGSTOP past the lease, then SIGCONT: the resumed leader is refused what it sends
            before = fleet.terms()
            paused = leader
            paused.signal(signal.SIGSTOP)
            leader = fleet.new_leader(before)
            time.sleep(max(0.0, OUTAGE - TAKEOVER))  # the pause itself, past the lease
            paused.signal(signal.SIGCONT)
            paused.wait_log("no longer sends the periodic tasks", 30)

            # the leader's broker connection cut, then back
            before = fleet.terms()
            cut = leader
            fleet.proxies[cut.name].cut()
            leader = fleet.new_leader(before)
            time.sleep(max(0.0, OUTAGE - TAKEOVER))  # the outage itself
            fleet.proxies[cut.name].restore()
            cut.wait_log("no longer sends the periodic tasks", 30)

            wait_for(lambda: time.monotonic() - started >= 55, 60, interval=0.5, message="a minute of ticks")
            for worker in fleet.workers:
                if worker.process.poll() is None:
                    assert worker.stop(timeout=60) == 0
            arrivals.catch_up()  # what the last leader sent as it stopped
        assert arrivals.error is None, arrivals.error
        seen = arrivals.seen
        dues = [due for due, _, _ in seen]
        duplicates = [due for due, count in collections.Counter(dues).items() if count > 1]
        assert not duplicates, f"ticks sent more than once: {duplicates}"
        assert len({task_id for _, task_id, _ in seen}) == len(seen)
        ordered = sorted(dues)
        gaps = [(a, b) for a, b in itertools.pairwise(ordered) if b - a != timedelta(seconds=1)]
        assert not gaps, f"ticks missing between {gaps}"
        late = max(arrival - due.timestamp() for due, _, arrival in seen)
        assert late <= TAKEOVER + SLACK, f"a tick arrived {late:.1f}s after its due time"
        assert len(seen) >= 50
        for worker in fleet.workers:
            assert "Traceback" not in worker.log(), worker.log()[-5000:]
    except BaseException:
        for worker in fleet.workers:
            print(f"--- {worker.name} ---\n{worker.log()[-8000:]}")
        raise
    finally:
        fleet.close()
