"""Every command ``celery inspect --list`` and ``celery control --list`` name, sent from Celery's
own client to this worker and to a real Celery worker running the same Celery app, on Redis and on
RabbitMQ: this worker answers each, and its reply has the shape of Celery's (the same kind of
value, the same ``ok``/``error`` answer, every field of Celery's with the same type)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import (
    AMQP_TEST_URL,
    REDIS_PORT,
    REDIS_TEST_URL,
    WorkerFactory,
    delete_queue,
    empty_redis,
    require_server,
)
from workers import wait_for

pytestmark = pytest.mark.timeout(240)

#: the arguments each command is sent with (Celery's client sends them as keywords)
ARGUMENTS: dict[str, dict[str, Any]] = {
    "query_task": {"ids": ["no-such-task"]},
    "registered": {"taskinfoitems": ["rate_limit", "max_retries"]},
    "conf": {"with_defaults": False},
    "memdump": {"samples": 3},
    "objgraph": {"type": "LogicalClock", "num": 1, "max_depth": 1},
    "rate_limit": {"task_name": "apps.basic.add", "rate_limit": "100/m"},
    "time_limit": {"task_name": "apps.basic.add", "soft": 10, "hard": 20},
    "revoke": {"task_id": ["no-such-task"]},
    "terminate": {"signal": "TERM", "task_id": ["no-such-task"]},
    "revoke_by_stamped_headers": {"headers": {"batch": "none"}},
    "autoscale": {"max": 2, "min": 1},
    "add_consumer": {"queue": "interop-extra"},
    "cancel_consumer": {"queue": "interop-extra"},
    "pool_grow": {"n": 1},
    "pool_shrink": {"n": 1},
}
#: commands not sent to Celery's worker: ``election`` with made-up arguments stops it
#: (IndexError in its gossip), and ``shutdown`` is sent last, on its own
NOT_TO_CELERY = {"election"}
LAST = "shutdown"
#: where the replies differ on purpose: Celery's ``memsample`` needs psutil (None without it);
#: this worker reads /proc
DIFFERENT = {"memsample"}


@pytest.fixture(scope="module", params=["redis", "amqp"])
def nodes(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    require_server(REDIS_PORT, "Redis")
    if request.param == "amqp":
        require_server(5672, "RabbitMQ")
        broker = AMQP_TEST_URL
    else:
        broker = empty_redis(REDIS_TEST_URL)
    queue = f"control-{uuid.uuid4().hex[:8]}"
    factory = WorkerFactory(tmp_path_factory.mktemp(f"interop-{request.param}"))
    env = {"CELERY_BROKER_URL": broker, "CELERY_RESULT_BACKEND": REDIS_TEST_URL}
    ours = factory.start("-Q", queue, "-c", "2", "-E", app="apps.celery_basic", pool="prefork", env=env)
    theirs = factory.start_celery("-Q", queue, "-c", "2", "-E", broker=broker, backend=REDIS_TEST_URL,
                                  pool="prefork")
    from celery import Celery

    client = Celery("control-client", broker=broker, backend=REDIS_TEST_URL)
    client.conf.broker_connection_retry_on_startup = True
    for worker in (ours, theirs):
        wait_for(lambda worker=worker: client.control.ping(destination=[worker.name], timeout=0.5),
                 timeout=30, message=f"{worker.name} to answer a ping")
    yield client, ours, theirs
    client.close()
    factory.cleanup()
    delete_queue(broker, queue)
    delete_queue(broker, ARGUMENTS["add_consumer"]["queue"])


def celerys_commands(kind: str) -> list[str]:
    from celery.worker.control import Panel

    return sorted(name for name, info in Panel.meta.items() if info.type == kind and info.visible)


def send(client: Any, worker: Any, kind: str, command: str) -> Any:
    arguments = ARGUMENTS.get(command, {})
    if kind == "inspect":
        replies = client.control.inspect(destination=[worker.name], timeout=10)._request(command, **arguments)
        assert replies and worker.name in replies, (
            f"{worker.name} did not answer {command}:\n{worker.log()[-3000:]}")
        return replies[worker.name]
    replies = client.control.broadcast(command, arguments=arguments, destination=[worker.name], reply=True,
                                       timeout=10)
    assert replies, f"{worker.name} did not answer {command}:\n{worker.log()[-3000:]}"
    return replies[0][worker.name]


def shape(value: Any) -> Any:
    if isinstance(value, dict) and value and set(value) <= {"ok", "error"}:
        return ("answer", tuple(sorted(value)))
    if isinstance(value, dict):
        return "dict"
    return type(value).__name__


def assert_like_celerys(command: str, ours: Any, theirs: Any) -> None:
    assert shape(ours) == shape(theirs), f"{command}: ours {ours!r}, Celery's {theirs!r}"
    if isinstance(theirs, dict) and shape(theirs) == "dict":
        missing = sorted(set(theirs) - set(ours))
        assert not missing, f"{command}: fields of Celery's reply missing from ours: {missing}"
        for field, value in theirs.items():
            if value is not None and ours[field] is not None and command != "conf":
                assert type(ours[field]) is type(value), (
                    f"{command}: {field} is a {type(ours[field]).__name__} here, a {type(value).__name__} "
                    f"in Celery's reply ({ours[field]!r} against {value!r})")


@pytest.mark.parametrize("kind", ["inspect", "control"])
def test_every_command_celerys_command_line_lists_is_answered_as_celery_answers(nodes, kind):
    client, ours, theirs = nodes
    commands = [command for command in celerys_commands(kind) if command != LAST]
    assert len(commands) >= 14
    for command in commands:
        mine = send(client, ours, kind, command)
        if command in NOT_TO_CELERY:
            assert mine is None, f"{command}: {mine!r}"  # as a Celery worker without gossip
            continue
        celerys = send(client, theirs, kind, command)
        if command in DIFFERENT:
            assert isinstance(mine, str) and mine.endswith("MB") and celerys is None
            continue
        assert_like_celerys(command, mine, celerys)


def test_the_replies_carry_what_celerys_carry(nodes):
    client, ours, theirs = nodes
    for worker in (ours, theirs):
        send(client, worker, "control", "rate_limit")
    registered = send(client, ours, "inspect", "registered")
    assert "apps.basic.add [rate_limit=100/m max_retries=3]" in registered  # as Celery formats it
    assert sorted(registered) == sorted(send(client, theirs, "inspect", "registered"))
    conf = send(client, ours, "inspect", "conf")
    celerys = send(client, theirs, "inspect", "conf")
    assert conf["result_backend"] == celerys["result_backend"]  # the app's own, not celery://...
    assert conf["worker_hijack_root_logger"] is False
    assert send(client, ours, "inspect", "stats")["broker"]["transport"] == send(
        client, theirs, "inspect", "stats")["broker"]["transport"]


def test_shutdown_stops_both_workers(nodes):
    client, ours, theirs = nodes
    assert send(client, ours, "control", LAST) == {"ok": "shutting down"}
    client.control.broadcast(LAST, destination=[theirs.name])  # Celery's worker stops without a reply
    for worker in (ours, theirs):
        assert worker.process.wait(timeout=60) == 0, worker.log()[-3000:]
