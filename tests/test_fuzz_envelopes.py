"""Fuzzing below the task protocol: malformed envelopes and content headers put straight into
Redis, the embedded transport's file and RabbitMQ, between good tasks, under the async and the
sync event loops.

The worker must stay up, reject each bad delivery with one "Rejected message ..." line saying why,
fail the result of each that names a task id (so its client gets the error at once), leave
nothing unacknowledged in the broker, and run each good task exactly once.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import amqp
import pytest
from apps import basic
from conftest import AMQP_TEST_URL, AMQP_VHOST, REDIS_PORT, REDIS_TEST_URL, require_server
from envelopes import Bad, Raw, RawMessage, broken_amqp_properties, broken_envelopes, task_body, two_tags
from hostile import each_reason_has_its_own_line
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from workers import TESTS, WorkerProcess, wait_for

from worker_core.transports.embedded.store import QueueStore

REJECTED = re.compile(r"Rejected message (.*)")
QUEUE = f"envelopes-{uuid.uuid4().hex[:8]}"


class EnvelopeWorker:
    """A worker on one transport and loop, and ways to put raw deliveries in front of it."""

    def __init__(self, kind: str, directory: Path) -> None:
        self.kind = kind
        self.runs = directory / "runs.txt"
        transport, _, loop = kind.partition("-")
        if transport == "embedded":
            self.broker = backend = f"embedded://{directory}/queue.db"
        else:  # results on Redis; the tasks on Redis or RabbitMQ
            require_server(REDIS_PORT, "Redis")
            import redis

            self.redis = redis.Redis.from_url(REDIS_TEST_URL)
            self.redis.flushdb()
            backend = REDIS_TEST_URL
            if transport == "redis":
                self.broker = REDIS_TEST_URL
            else:
                require_server(5672, "RabbitMQ")
                self.broker = AMQP_TEST_URL
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(TESTS), WORKER_BROKER_URL=self.broker,
                   WORKER_RESULT_BACKEND=backend)
        args = ["-A", "apps.basic", "-P", "solo", "-l", "INFO", "-Q", QUEUE,
                "-n", f"envelopes-{uuid.uuid4().hex[:8]}@localhost"]
        if loop:
            args += ["--loop", loop]
        basic.app.conf.update(broker_url=self.broker, result_backend=backend)
        self.process = WorkerProcess(args, env, directory / "worker.log")
        self.process.wait_ready()
        self.rejected_so_far = 0
        self.amqp: Any = None
        if transport == "amqp":
            # Confirmed publishes: a raw delivery is in the queue before the good tasks that follow
            # it on the client's own connection (two connections' messages are not ordered).
            self.amqp = amqp.Connection("127.0.0.1:5672", userid="guest", password="guest",
                                        virtual_host=AMQP_VHOST, confirm_publish=True)
            self.amqp.connect()
            self.channel = self.amqp.channel()

    @property
    def transport(self) -> str:
        return self.kind.partition("-")[0]

    def push(self, bad: Bad | Raw) -> None:
        """Put a raw delivery in the queue, behind what is there."""
        if self.transport == "redis":
            self.redis.lpush(QUEUE, bad.raw)
        elif self.transport == "embedded":
            store = QueueStore(self.broker.removeprefix("embedded://"))
            try:
                store.put(QUEUE, bad.raw, 0, None)
            finally:
                store.close()
        else:
            properties, body = bad.raw if isinstance(bad.raw, tuple) else (bad.raw, task_body())
            self.channel.basic_publish(RawMessage(body, properties), exchange="", routing_key=QUEUE)

    def send_good(self) -> str:
        task_id = f"good-{uuid.uuid4()}"
        basic.app.send_task("apps.basic.record", (str(self.runs), task_id), queue=QUEUE, task_id=task_id)
        return task_id

    def rejections(self) -> list[str]:
        return REJECTED.findall(self.process.log())

    def nothing_left(self) -> bool:
        """Whether the broker holds nothing for this worker: no message waiting, none delivered
        and unacknowledged (RabbitMQ's count is read when the worker has stopped)."""
        if self.transport == "redis":
            return self.held() == (0, 0)
        if self.transport == "embedded":
            store = QueueStore(self.broker.removeprefix("embedded://"))
            try:
                with store.db.locked() as connection:
                    held = connection.execute("SELECT COUNT(*) FROM messages WHERE queue = ?", (QUEUE,))
                    return held.fetchone()[0] == 0
            finally:
                store.close()
        return self.channel.queue_declare(QUEUE, passive=True).message_count == 0

    def held(self) -> tuple[int, int]:
        """On Redis: the messages waiting in the queue, and those delivered and unacknowledged."""
        return self.redis.llen(QUEUE), self.redis.zcard("unacked_index")

    def close(self) -> None:
        try:
            status = self.process.stop()
            assert status == 0, self.process.log()[-3000:]
            assert self.nothing_left(), f"messages left in the broker after {self.kind}"
        finally:
            self.process.kill()
            if self.amqp is not None:
                self.channel.queue_delete(QUEUE)
                self.amqp.close()
            basic.app.close()


@pytest.fixture(scope="module", params=["embedded", "redis-async", "redis-sync", "amqp-async", "amqp-sync"])
def worker(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[EnvelopeWorker]:
    running = EnvelopeWorker(request.param, tmp_path_factory.mktemp(f"envelopes-{request.param}"))
    yield running
    running.close()


def _runs(worker: EnvelopeWorker) -> list[str]:
    return worker.runs.read_text().split() if worker.runs.exists() else []


def check_batch(worker: EnvelopeWorker, batch: Sequence[Bad | Raw | None]) -> None:
    goods = []
    for item in batch:
        if item is None:
            goods.append(worker.send_good())
        else:
            worker.push(item)
            if isinstance(item, Raw):
                goods.append(item.task_id)
    goods.append(worker.send_good())  # the sentinel: once it ran, everything before it was received
    for task_id in goods:
        assert basic.app.AsyncResult(task_id).get(timeout=30) == task_id
    bads = [item for item in batch if isinstance(item, Bad)]
    lines = worker.rejections()[worker.rejected_so_far:]
    worker.rejected_so_far += len(lines)
    sent = "\n".join(f"  {bad.reason}: {bad.raw!r:.200}" for bad in bads)
    assert len(lines) == len(bads), f"sent:\n{sent}\nrejected:\n" + "\n".join(lines)
    assert each_reason_has_its_own_line([bad.reason for bad in bads], lines), \
        f"sent:\n{sent}\nrejected:\n" + "\n".join(lines)
    for bad in bads:
        if bad.task_id is not None:  # its client is told at once, not left to time out
            assert bad.raises is not None
            with pytest.raises(bad.raises):
                basic.app.AsyncResult(bad.task_id).get(timeout=10)
    runs = _runs(worker)
    assert all(runs.count(task_id) == 1 for task_id in goods), runs
    if worker.transport != "amqp":
        wait_for(worker.nothing_left, 10, message="the broker to hold nothing for the worker "
                 f"(held: {worker.held() if worker.transport == 'redis' else '?'})")
    assert worker.process.process.poll() is None, worker.process.log()[-3000:]


def deliveries(worker: EnvelopeWorker) -> st.SearchStrategy[list[Bad | Raw | None]]:
    if worker.transport == "amqp":
        return st.lists(broken_amqp_properties() | st.none(), min_size=1, max_size=6)
    unusual = st.builds(two_tags, st.just(QUEUE), st.just(str(worker.runs)))
    return st.lists(broken_envelopes(QUEUE, tags=worker.transport == "redis") | unusual | st.none(),
                    min_size=1, max_size=6)


@given(data=st.data())
@settings(max_examples=25, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
def test_malformed_deliveries_are_rejected_and_failed_while_good_tasks_run_once(
        worker: EnvelopeWorker, data: st.DataObject) -> None:
    check_batch(worker, data.draw(deliveries(worker)))


def test_the_worker_logged_no_internal_error(worker: EnvelopeWorker) -> None:
    check_batch(worker, [None])
    log = worker.process.log()
    assert "CRITICAL" not in log and "Traceback" not in log, log[-3000:]
