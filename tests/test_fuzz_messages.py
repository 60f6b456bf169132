"""Fuzzing: hypothesis-generated hostile messages through the real consumer of a running worker,
interleaved with good tasks; and the decoder alone on arbitrary input.

The worker must stay up, reject each hostile message with exactly one "Rejected message ..." line
naming why, and run every good task to the right result.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import kombu
import pytest
from apps import basic
from conftest import REDIS_TEST_URL, empty_redis
from hostile import (
    MAX_SIZE,
    Message,
    each_reason_has_its_own_line,
    good_messages,
    headers_for,
    hostile_messages,
    json_values,
    v2,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from workers import TESTS, WorkerProcess, wait_for

from worker_core.app.broker import connection_for, task_queue
from worker_core.exceptions import ContentDisallowed, ProtocolError
from worker_core.protocol import JSON, TaskEnvelope, decode_task, task_message

REJECTED = re.compile(r"Rejected message (.*)")
ACCEPT = frozenset({JSON})


# -- the decoder alone ---------------------------------------------------------------------------

HEADER_NAMES = ["task", "id", "retries", "eta", "expires", "timelimit", "root_id", "parent_id", "group",
                "group_index", "origin", "shadow", "ignore_result", "argsrepr", "kwargsrepr", "stamps"]
moments = st.datetimes(timezones=st.none() | st.just(timezone.utc))
header_values = json_values | moments | st.binary(max_size=8)
any_headers = st.one_of(
    st.none(),
    st.dictionaries(st.sampled_from(HEADER_NAMES) | st.text(max_size=8), header_values, max_size=8),
    st.fixed_dictionaries({"task": st.text(max_size=10) | header_values, "id": st.text(max_size=10)},
                          optional={name: header_values for name in HEADER_NAMES[2:]}),
    json_values,  # not a mapping at all
)
any_bodies = st.one_of(
    st.binary(max_size=64),
    st.text(max_size=64),
    json_values.map(lambda value: json.dumps(value).encode()),
    st.tuples(json_values, json_values, json_values).map(json.dumps),
    st.builds(lambda args, kwargs: v2(args, kwargs), st.lists(json_values, max_size=4),
              st.dictionaries(st.text(max_size=5), json_values, max_size=3)),
    st.integers(1, 5000).map(lambda depth: "[" * depth + "]" * depth),
)


def _well_formed(envelope: TaskEnvelope) -> None:
    assert isinstance(envelope.name, str) and envelope.name
    assert isinstance(envelope.id, str) and envelope.id
    assert isinstance(envelope.args, list)
    assert isinstance(envelope.kwargs, dict) and all(isinstance(key, str) for key in envelope.kwargs)
    assert envelope.embed is None or isinstance(envelope.embed, dict)
    assert type(envelope.retries) is int and envelope.retries >= 0
    for moment in (envelope.eta, envelope.expires):
        assert moment is None or (isinstance(moment, datetime) and moment.tzinfo is not None)
    for limit in (envelope.time_limit, envelope.soft_time_limit):
        assert limit is None or (isinstance(limit, float) and limit > 0)
    assert envelope.group_index is None or (type(envelope.group_index) is int and envelope.group_index >= 0)
    for text in (envelope.root_id, envelope.parent_id, envelope.group, envelope.origin, envelope.shadow):
        assert text is None or isinstance(text, str)
    assert isinstance(envelope.ignore_result, bool)
    assert isinstance(envelope.argsrepr, str) and isinstance(envelope.kwargsrepr, str)


content_types = st.sampled_from([None, JSON, "application/x-python-serialize", "text/plain"]) | st.text(
    max_size=12)
encodings = st.sampled_from([None, "utf-8", "latin-1", "utf-16", "base64", "nope"]) | st.text(max_size=8)


@given(headers=any_headers, properties=st.none() | json_values, body=any_bodies, content_type=content_types,
       content_encoding=encodings)
@settings(max_examples=600, deadline=None, database=None)
def test_decode_task_returns_a_well_formed_envelope_or_raises_protocol_error_and_nothing_else(
        headers: Any, properties: Any, body: Any, content_type: str | None,
        content_encoding: str | None) -> None:
    try:
        envelope = decode_task(headers, properties, body, content_type, content_encoding,
                               accept=ACCEPT, max_size=4096)
    except (ProtocolError, ContentDisallowed) as exc:
        assert str(exc), "a rejection must say why"
        return
    _well_formed(envelope)


seconds = st.none() | st.floats(0.001, 1e6)


@given(name=st.text(min_size=1, max_size=30), task_id=st.text(min_size=1, max_size=40),
       args=st.lists(json_values, max_size=5),
       kwargs=st.dictionaries(st.text(max_size=8), json_values, max_size=4),
       retries=st.integers(0, 10**6), countdown=st.none() | st.floats(-1e6, 1e6),
       expires=st.none() | st.floats(0, 1e6), limits=st.tuples(seconds, seconds))
@settings(max_examples=200, deadline=None, database=None)
def test_every_message_the_client_builds_decodes_to_what_it_carries(
        name: str, task_id: str, args: list[Any], kwargs: dict[str, Any], retries: int,
        countdown: float | None, expires: float | None, limits: tuple[float | None, float | None]) -> None:
    message = task_message(name, task_id, args, kwargs, countdown=countdown, expires=expires, retries=retries,
                           time_limit=limits[0], soft_time_limit=limits[1])
    body = json.dumps(message.body)
    wire_headers = json.loads(json.dumps(message.headers))  # what a JSON transport hands over
    envelope = decode_task(wire_headers, message.properties, body, JSON, "utf-8", accept=ACCEPT,
                           max_size=1 << 20)
    _well_formed(envelope)
    assert (envelope.name, envelope.id, envelope.args, envelope.kwargs) == (name, task_id, args, kwargs)
    assert envelope.retries == retries and (envelope.time_limit, envelope.soft_time_limit) == limits
    assert (envelope.eta is None) == (countdown is None) and (envelope.expires is None) == (expires is None)


@given(message=hostile_messages)
@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
def test_every_generated_hostile_message_is_refused_by_the_decoder_with_its_reason(message: Message) -> None:
    if message.reason in ("unknown task", "kombu cannot decode it"):
        return  # decided after decoding: by the task registry, and by kombu before the decoder
    with pytest.raises(ProtocolError, match=re.escape(message.reason)):
        decode_task(message.headers, {}, message.body, message.content_type, message.content_encoding,
                    accept=ACCEPT, max_size=MAX_SIZE)


# -- through a running worker ----------------------------------------------------------------------


class FuzzedWorker:
    """A ``workerctl worker`` (prefork, two processes) and a producer publishing raw messages."""

    def __init__(self, broker: str, backend: str, log: Path, queue: str) -> None:
        self.broker = broker
        self.queue = queue
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(TESTS), WORKER_BROKER_URL=broker,
                   WORKER_RESULT_BACKEND=backend, WORKER_WORKER_MAX_MESSAGE_SIZE=str(MAX_SIZE))
        args = ["-A", "apps.basic", "-P", "prefork", "-c", "2", "-l", "INFO", "-Q", queue,
                "-n", f"fuzz-{uuid.uuid4().hex[:8]}@localhost"]
        self.process = WorkerProcess(args, env, log)
        basic.app.conf.update(broker_url=broker, result_backend=backend)
        self.process.wait_ready()
        self.connection = connection_for(basic.app.plugins, broker, basic.app.settings)
        self.connection.connect()
        self.rejected_so_far = 0

    def publish(self, message: Message) -> None:
        kombu.Producer(self.connection).publish(
            message.body, exchange="", routing_key=self.queue, headers=message.headers,
            content_type=message.content_type, content_encoding=message.content_encoding,
            declare=[task_queue(self.queue, basic.app.settings)],
        )

    def rejections(self) -> list[str]:
        return REJECTED.findall(self.process.log())

    def close(self) -> None:
        self.connection.release()
        self.process.kill()
        basic.app.close()


@pytest.fixture(scope="module", params=["embedded", "redis"])
def fuzzed(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzedWorker]:
    directory = tmp_path_factory.mktemp(f"fuzz-{request.param}")
    if request.param == "embedded":
        broker = backend = f"embedded://{directory}/queue.db"
    else:
        broker = backend = empty_redis(REDIS_TEST_URL)
    worker = FuzzedWorker(broker, backend, directory / "worker.log", f"fuzz-{uuid.uuid4().hex[:8]}")
    yield worker
    worker.close()


def _check_batch(worker: FuzzedWorker, batch: Sequence[Message]) -> None:
    for message in batch:
        worker.publish(message)
    sentinel = Message(v2([20, 22]), headers_for("apps.basic.add"), result=42)
    worker.publish(sentinel)
    for message in [*batch, sentinel]:
        if message.reason is not None:
            continue
        outcome = basic.app.AsyncResult(message.task_id)
        if message.raises is not None:
            with pytest.raises(message.raises):
                outcome.get(timeout=30)
        else:
            assert outcome.get(timeout=30) == message.result
    # The sentinel ran, so every message before it was received: each hostile one is rejected by now.
    expected = [message.reason for message in batch if message.reason is not None]
    lines = worker.rejections()[worker.rejected_so_far:]
    worker.rejected_so_far += len(lines)
    sent = "\n".join(f"  {message.task_id}: {message.reason or 'runs'}" for message in batch)
    assert len(lines) == len(expected), f"sent:\n{sent}\nrejected:\n" + "\n".join(lines)
    assert each_reason_has_its_own_line(expected, lines), f"sent:\n{sent}\nrejected:\n" + "\n".join(lines)
    assert worker.process.process.poll() is None, worker.process.log()[-3000:]


@given(batch=st.lists(hostile_messages | good_messages(), min_size=1, max_size=6))
@settings(max_examples=60, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
def test_hostile_messages_are_rejected_one_line_each_while_good_tasks_complete(
        fuzzed: FuzzedWorker, batch: list[Message]) -> None:
    _check_batch(fuzzed, batch)


def test_the_fuzzed_worker_logged_no_internal_error_and_stops_warmly(fuzzed: FuzzedWorker) -> None:
    _check_batch(fuzzed, [Message(v2([1, 1]), headers_for("apps.basic.add"), result=2)])
    log = fuzzed.process.log()
    assert "internal error" not in log and "CRITICAL" not in log
    for line, following in itertools.pairwise(log.splitlines()):
        if "Rejected message" in line:  # one line each: the next line is a new log record
            assert following.startswith("["), (line, following)
    assert fuzzed.process.stop() == 0


@pytest.mark.parametrize("kind", ["embedded", "redis"])
def test_a_message_whose_headers_are_not_a_mapping_is_rejected_and_the_worker_goes_on(
        kind, workers, tmp_path, request):
    # kombu reads headers.get('compression') inside the transport: without the transports' own
    # message class, the list below raised out of drain_events and stopped the worker.
    broker = request.getfixturevalue("redis_url") if kind == "redis" else f"embedded://{tmp_path}/queue.db"
    backend = broker if kind == "redis" else None  # the embedded transport keeps results itself
    worker = workers.start(pool="solo", broker=broker, backend=backend, env={"PYTHONPATH": str(TESTS)})
    basic.app.conf.update(broker_url=broker, result_backend=backend)
    try:
        with connection_for(basic.app.plugins, broker, basic.app.settings) as connection:
            kombu.Producer(connection).publish(
                v2([1, 2]), exchange="", routing_key="celery", headers=["not", "a", "map"], content_type=JSON,
                content_encoding="utf-8", declare=[task_queue("celery", basic.app.settings)])
        wait_for(lambda: worker.process.poll() is not None or "Rejected message" in worker.log(), 10,
                 message="the rejection (or the worker's end)")
        assert worker.process.poll() is None, worker.log()[-2000:]
        assert "headers must be a mapping (got ['not', 'a', 'map'] that is a list)" in worker.log()
        assert basic.add.delay(2, 3).get(timeout=10) == 5
    finally:
        basic.app.close()
