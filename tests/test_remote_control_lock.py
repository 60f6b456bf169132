"""Locking remote control (worker_enable_remote_control, worker_remote_control_allow) and the audit
line of every command that changes a worker, with who sent it: real workers on the embedded
transport, Redis (database 9) and RabbitMQ, and Celery's own client and worker where interop is
the point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import kombu
import pytest
from apps import basic
from conftest import AMQP_TEST_URL, delete_queue, empty_redis, redis_db, require_server
from workers import TESTS, ask, drain

from worker_core.app.broker import connection_for
from worker_core.control.client import broadcast
from worker_core.protocol import origin_name

REDIS_URL = redis_db(9)  # this file's own database of the shared Redis
OFF = {"WORKER_WORKER_ENABLE_REMOTE_CONTROL": "false"}


def _allow(names: str) -> dict[str, str]:
    return {"WORKER_WORKER_REMOTE_CONTROL_ALLOW": names}


def _node(kind: str) -> str:
    return f"{kind}-{uuid.uuid4().hex[:8]}@localhost"


# -- brokers ------------------------------------------------------------------------------------


@pytest.fixture
def redis_db9() -> Iterator[str]:
    yield empty_redis(REDIS_URL)
    empty_redis(REDIS_URL)


@pytest.fixture(params=["embedded", "redis", "amqp"])
def broker(request: pytest.FixtureRequest, tmp_path) -> str:
    if request.param == "embedded":
        return f"embedded://{tmp_path}/queue.db"
    request.getfixturevalue("redis_db9")  # results live in Redis for both servers
    if request.param == "redis":
        return REDIS_URL
    require_server(5672, "RabbitMQ")
    return AMQP_TEST_URL


@pytest.fixture
def client(broker: str) -> Iterator[object]:
    """``apps.basic`` sending to ``broker`` (results in the embedded file or Redis database 9)."""
    backend = None if broker.startswith("embedded") else REDIS_URL
    basic.app.conf.update(broker_url=broker, result_backend=backend)
    yield basic.app
    basic.app.close()


@pytest.fixture
def queue(broker: str, workers) -> Iterator[str]:
    """A task queue of the test's own; deleted from RabbitMQ once the test's workers are gone."""
    name = f"lock-{uuid.uuid4().hex[:8]}"
    yield name
    workers.cleanup()
    delete_queue(broker, name)


@pytest.fixture
def celery_client(broker: str) -> Iterator[object]:
    if broker.startswith("embedded"):
        pytest.skip("Celery has no embedded transport")
    import kombu.pools
    from celery import Celery

    # Celery's producers come from kombu's process-wide pools, keyed by the broker URL: a
    # connection an earlier test left idle there may have been closed by RabbitMQ since.
    kombu.pools.reset()
    app = Celery("lock-client", broker=broker, backend=REDIS_URL)
    app.conf.update(broker_connection_retry_on_startup=True)
    yield app
    app.close()
    kombu.pools.reset()


def _start(workers, broker: str, queue: str, name: str, *args: str, env: dict[str, str] | None = None,
           ready: bool = True, pool: str = "solo"):
    backend = None if broker.startswith("embedded") else REDIS_URL
    return workers.start("-Q", queue, "-n", name, *args, broker=broker, backend=backend, ready=ready,
                         pool=pool, env={"PYTHONPATH": str(TESTS), **(env or {})})


def _control_queue_exists(broker: str, name: str) -> bool:
    """Whether the broker holds ``<name>.celery.pidbox`` (on Redis: its binding to the exchange)."""
    queue = f"{name}.celery.pidbox"
    if broker.startswith("redis"):
        import redis

        client = redis.Redis.from_url(broker)
        try:
            bindings = client.smembers("_kombu.binding.celery.pidbox")
            return any(member.endswith(queue.encode()) for member in bindings)
        finally:
            client.close()
    from amqp.exceptions import ChannelError, ResourceLocked

    with connection_for(basic.app.plugins, broker, basic.app.settings) as connection:
        channel = connection.channel()
        try:
            channel.queue_declare(queue=queue, passive=True)
        except ResourceLocked:  # RabbitMQ: exclusive to the worker's connection, so it exists
            return True
        except ChannelError as exc:
            if str(exc.reply_code) == "404":  # the embedded transport gives it as text
                return False
            raise
        return True


def _wait_for_heartbeat(url: str, name: str) -> None:
    """Wait for a worker-heartbeat of ``name`` on Redis's ``celeryev`` fanout."""
    seen: list[dict] = []
    with kombu.Connection(url) as connection:
        queue = kombu.Queue("", kombu.Exchange("celeryev", type="fanout"), routing_key="#", exclusive=True,
                            auto_delete=True)  # every event type
        with kombu.Consumer(connection, [queue], accept=["json"],
                            callbacks=[lambda body, message: seen.append(body)]):
            drain(connection, lambda: any(e.get("type") == "worker-heartbeat" and e.get("hostname") == name
                                          for e in seen), message=f"a heartbeat of {name}")


# -- remote control off -------------------------------------------------------------------------


def test_remote_control_off_answers_no_client_and_declares_no_control_queue(
        workers, broker, client, queue, request):
    off, on = _node("off"), _node("on")
    quiet = _start(workers, broker, queue, off, "--heartbeat-interval", "0.3", env=OFF)
    answering = _start(workers, broker, queue, on)
    assert "Remote control is off (worker_enable_remote_control is False)" in quiet.log()
    replies = broadcast(client, "ping", destination=[off, on], timeout=2)
    assert replies == [{on: {"ok": "pong"}}]
    assert _control_queue_exists(broker, on) and not _control_queue_exists(broker, off)
    if not broker.startswith("embedded"):
        celery_client = request.getfixturevalue("celery_client")
        assert celery_client.control.inspect(destination=[off, on], timeout=2).ping() == {on: {"ok": "pong"}}
    answering.stop()  # only the worker without remote control is left to run the task
    result = client.send_task("apps.basic.add", (2, 3), queue=queue)
    assert result.get(timeout=20) == 5
    quiet.wait_log(f"apps.basic.add[{result.id}] succeeded")
    if broker.startswith("redis"):
        _wait_for_heartbeat(broker, off)  # events still go out


def _environment() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if not key.startswith("WORKER_")}


def test_workerctl_steps_leaves_the_control_step_out_when_remote_control_is_off():
    def consumer_steps(env: dict[str, str]) -> dict[str, dict]:
        shown = subprocess.run(
            [sys.executable, "-m", "worker_core", "steps", "-A", "apps.basic", "--graph", "--format", "json"],
            cwd=TESTS, env={**_environment(), **env}, capture_output=True, text=True, check=True,
        )
        [consumer] = [b for b in json.loads(shown.stdout)["blueprints"] if b["name"] == "consumer"]
        return {"order": consumer["order"], **{s["name"]: s for s in consumer["steps"]}}

    on = consumer_steps({})
    assert "Control" in on["order"] and on["order"].index("Tasks") < on["order"].index("Control")
    off = consumer_steps(OFF)
    assert "Control" not in off["order"] and {"Events", "Heart", "Tasks"} <= set(off["order"])
    assert off["Control"]["disabled_reason"] == "only when worker_enable_remote_control is on"


# -- allow-list -----------------------------------------------------------------------------------


@pytest.mark.parametrize("broker", ["embedded"], indirect=True)
def test_an_allow_list_answers_what_it_names_and_refuses_the_rest_naming_the_sender(
        workers, broker, client, queue):
    readers, changers = _node("readers"), _node("changers")
    reading = _start(workers, broker, queue, readers, env=_allow("inspect,rate_limit"))
    _start(workers, broker, queue, changers, env=_allow("control"))
    reading.wait_log("Remote control answers only inspect, rate_limit (worker_remote_control_allow)")

    assert ask(client, "ping", worker=readers) == {"ok": "pong"}
    assert ask(client, "stats", worker=readers)["hostname"] == readers  # read-only: in the inspect group
    assert ask(client, "rate_limit", worker=readers, task_name="apps.basic.add", rate_limit="10/m") == {
        "ok": "new rate limit set successfully"}
    refused = ask(client, "shutdown", worker=readers, sender="ops-alice@console")
    assert refused == {"error": "remote control command 'shutdown' is not allowed on this worker: "
                                "worker_remote_control_allow allows only inspect, rate_limit; add 'shutdown' "
                                "(or 'control') to it on the worker to allow it"}
    reading.wait_log("Refused remote control command shutdown {} (sender ops-alice@console): "
                     "worker_remote_control_allow does not allow it")
    assert "Got shutdown from remote" not in reading.log() and reading.process.poll() is None
    refused = ask(client, "time_limit", worker=readers, task_name="apps.basic.add", soft=1)
    assert "time_limit" in refused["error"]
    reading.wait_log("Refused remote control command time_limit {'soft': 1, 'task_name': 'apps.basic.add'} "
                     f"(sender {origin_name()})")

    assert "not allowed" in ask(client, "ping", worker=changers)["error"]
    assert "not allowed" in ask(client, "active_queues", worker=changers)["error"]
    assert ask(client, "enable_events", worker=changers) == {"ok": "task events enabled"}
    assert ask(client, "disable_events", worker=changers) == {"ok": "task events disabled"}


@pytest.mark.parametrize("broker", ["embedded"], indirect=True)
def test_an_unknown_name_in_the_allow_list_stops_the_worker_before_it_takes_a_task(
        workers, broker, client, queue):
    waiting = client.send_task("apps.basic.add", (1, 1), queue=queue)
    refused = _start(workers, broker, queue, _node("typo"), env=_allow("pnig,stats"), ready=False)
    assert refused.process.wait(timeout=30) == 2  # refused before it starts, as any bad setting
    log = refused.log()
    assert "setting 'worker_remote_control_allow' names no command called 'pnig' (got ['pnig', 'stats']). " \
           "Did you mean 'ping'? The commands are active, active_queues, add_consumer," in log
    assert "the groups are 'inspect' (every read-only command), 'control' (every command that changes the " \
           "worker)" in log
    assert "received" not in log and " ready." not in log
    _start(workers, broker, queue, _node("fixed"), env=_allow("ping,stats"))
    assert waiting.get(timeout=20) == 2


EXTRA_COMMAND = """
from worker_core.hookspecs import hookimpl


@hookimpl
def worker_control_commands():
    return {"flush_cache": lambda worker, **arguments: {"ok": "flushed"}}
"""


@pytest.mark.parametrize("broker", ["embedded"], indirect=True)
def test_a_plugins_command_can_be_allowed_by_name_and_is_audited(workers, broker, client, queue, site):
    site.add("worker-control-extra", {"worker.plugins": {"extra": "extra_control"}},
             {"extra_control": EXTRA_COMMAND})
    environment = {"PYTHONPATH": f"{site.root}:{TESTS}"}
    name = _node("extra")
    worker = _start(workers, broker, queue, name, env={**environment, **_allow("inspect,flush_cache")})
    flushed = ask(client, "flush_cache", worker=name, sender="ops-alice@console", region="eu")
    assert flushed == {"ok": "flushed"}
    worker.wait_log("Remote control: flush_cache {'region': 'eu'} (sender ops-alice@console)")
    assert "not allowed" in ask(client, "add_consumer", worker=name, queue="more")["error"]
    typo = _start(workers, broker, queue, _node("typo"), env={**environment, **_allow("flush_cach")},
                  ready=False)
    assert typo.process.wait(timeout=30) == 2
    assert "no command called 'flush_cach' (got ['flush_cach']). Did you mean 'flush_cache'?" in typo.log()


# -- audit ------------------------------------------------------------------------------------------

#: every command that changes the worker, and its arguments as the audit line shows them
CHANGES = [
    ("rate_limit", {"task_name": "apps.basic.add", "rate_limit": "10/m"},
     "{'rate_limit': '10/m', 'task_name': 'apps.basic.add'}"),
    ("time_limit", {"task_name": "apps.basic.add", "soft": 5.0, "hard": 10.0},
     "{'hard': 10.0, 'soft': 5.0, 'task_name': 'apps.basic.add'}"),
    ("add_consumer", {"queue": "audited"}, "{'queue': 'audited'}"),
    ("cancel_consumer", {"queue": "audited"}, "{'queue': 'audited'}"),
    ("autoscale", {"max": 3, "min": 1}, "{'max': 3, 'min': 1}"),
    ("revoke", {"task_id": ["d9078da5-9915-40a0-bfa1-392c7bde42ed"]},
     "{'task_id': ['d9078da5-9915-40a0-bfa1-392c7bde42ed']}"),
    ("terminate", {"signal": "KILL", "task_id": ["f00d"]}, "{'signal': 'KILL', 'task_id': ['f00d']}"),
    ("pool_grow", {"n": 1}, "{'n': 1}"),
    ("pool_shrink", {"n": 1}, "{'n': 1}"),
]


@pytest.mark.parametrize("broker", ["embedded"], indirect=True)
def test_routine_commands_are_logged_at_debug(workers, broker, client, queue):
    name = _node("routine")
    worker = _start(workers, broker, queue, name, "-l", "DEBUG")
    sender = origin_name()
    for command in ("enable_events", "ping"):
        ask(client, command, worker=name)
        worker.wait_log(f"DEBUG/MainProcess] Remote control: {command} {{}} (sender {sender})")


@pytest.mark.parametrize("broker", ["embedded"], indirect=True)
def test_every_command_that_changes_the_worker_is_logged_with_its_sender(workers, broker, client, queue):
    name = _node("audited")
    worker = _start(workers, broker, queue, name)
    sender = origin_name()
    for command, arguments, shown in CHANGES:
        ask(client, command, worker=name, **arguments)
        worker.wait_log(f"INFO/MainProcess] Remote control: {command} {shown} (sender {sender})")
    ask(client, "revoke", worker=name, sender="ops-alice@console", task_id="a1")
    worker.wait_log("Remote control: revoke {'task_id': 'a1'} (sender ops-alice@console)")
    # what monitors send every few seconds (Flower: enable_events) and what only reads: DEBUG
    quiet = ("enable_events", "disable_events", "heartbeat", "ping", "stats", "active_queues", "conf",
             "registered")
    for command in quiet:
        ask(client, command, worker=name)
    assert not [c for c in quiet if f"Remote control: {c} " in worker.log()]

    assert ask(client, "shutdown", worker=name) == {"ok": "shutting down"}
    assert worker.process.wait(timeout=30) == 0
    log = worker.log()
    assert f"WARNING/MainProcess] Got shutdown from remote (sender {sender})\n" in log
    assert log.index("Got shutdown from remote") < log.index("worker: Warm shutdown (MainProcess)")
    assert "Cold shutdown" not in log


@pytest.mark.parametrize("broker", ["embedded"], indirect=True)
def test_a_second_remote_shutdown_does_not_turn_the_warm_shutdown_cold(workers, broker, client, queue):
    name = _node("draining")
    worker = _start(workers, broker, queue, name, pool="threads")  # the loop answers while a task runs
    running = client.send_task("apps.basic.sleep", (3,), queue=queue)
    worker.wait_log(f"apps.basic.sleep[{running.id}] received")
    assert ask(client, "shutdown", worker=name) == {"ok": "shutting down"}
    worker.wait_log("Warm shutdown: waiting for 1 running task(s)")
    assert ask(client, "shutdown", worker=name) == {"ok": "already shutting down"}
    assert worker.process.wait(timeout=30) == 0
    assert "Cold shutdown" not in worker.log()
    assert f"apps.basic.sleep[{running.id}] succeeded" in worker.log()


@pytest.mark.parametrize("broker", ["redis", "amqp"], indirect=True)
def test_celerys_client_is_answered_refused_and_logged_as_a_sender_that_did_not_name_itself(
        workers, broker, queue, celery_client):
    name = _node("celery-audited")
    worker = _start(workers, broker, queue, name, env=_allow("ping,rate_limit,shutdown"))
    inspect = celery_client.control.inspect(destination=[name], timeout=5)
    assert inspect.ping() == {name: {"ok": "pong"}}
    [answer] = inspect.stats()[name].values()
    assert "'stats' is not allowed on this worker: worker_remote_control_allow allows only ping, " \
           "rate_limit, shutdown" in answer
    worker.wait_log("Refused remote control command stats {} (sender unknown: it did not name itself; "
                    "its reply queue is ")
    replies = celery_client.control.rate_limit("apps.basic.add", "5/s", destination=[name], reply=True,
                                               timeout=5)
    assert replies == [{name: {"ok": "new rate limit set successfully"}}]
    worker.wait_log("Remote control: rate_limit {'rate_limit': '5/s', 'task_name': 'apps.basic.add'} "
                    "(sender unknown: it did not name itself; its reply queue is ")
    line = next(line for line in worker.log().splitlines() if "Remote control: rate_limit" in line)
    assert line.endswith(".reply.celery.pidbox)")
    celery_client.control.shutdown(destination=[name])
    assert worker.process.wait(timeout=30) == 0
    assert "Got shutdown from remote (sender unknown: it did not name itself and asked for no reply)" \
        in worker.log()


@pytest.mark.parametrize("broker", ["redis"], indirect=True)
def test_celerys_worker_answers_our_client_that_names_itself(workers, broker, queue, client):
    theirs = workers.start_celery("-Q", queue, broker=broker, backend=REDIS_URL)
    name = next(arg for arg in theirs.args if arg.startswith("celery-"))
    assert ask(client, "ping", worker=name) == {"ok": "pong"}
    assert ask(client, "rate_limit", worker=name, task_name="apps.basic.add", rate_limit="5/s") == {
        "ok": "new rate limit set successfully"}
    assert client.send_task("apps.basic.add", (4, 4), queue=queue).get(timeout=20) == 8
    assert "Control command error" not in theirs.log() and "No such control command" not in theirs.log()


# -- malformed messages -------------------------------------------------------------------------------


@pytest.mark.parametrize("broker", ["embedded"], indirect=True)
def test_malformed_control_messages_and_senders_never_stop_the_worker(workers, broker, client, queue):
    name = _node("sturdy")
    worker = _start(workers, broker, queue, name)
    exchange = kombu.Exchange("celery.pidbox", type="fanout", durable=False, delivery_mode="transient")
    with connection_for(client.plugins, broker, client.settings) as connection:
        producer = kombu.Producer(connection.default_channel)
        for body, headers in [
            ("just text", {}),
            ({"method": 7}, {}),
            ({"method": "ping", "arguments": [1, 2]}, {}),
            ({"method": "ping", "destination": name}, {}),
            ({"method": "revoke", "arguments": {"task_id": "b2"}, "destination": [name]},
             {"origin": {"a": 1}}),
            ({"method": "revoke", "arguments": {"task_id": "c3"}, "destination": [name]},
             {"origin": "evil\n[2026-01-01 00:00:00,000: WARNING/MainProcess] forged"}),
        ]:
            producer.publish(body, exchange=exchange, declare=[exchange], serializer="json", headers=headers)
    worker.wait_log("Remote control: revoke {'task_id': 'c3'}")
    log = worker.log()
    assert "Remote control: revoke {'task_id': 'b2'} (sender unknown: it did not name itself and asked for " \
           "no reply)" in log
    assert "(sender 'evil\\n[2026-01-01 00:00:00,000: WARNING/MainProcess] forged')" in log
    assert "\n[2026-01-01 00:00:00,000" not in log
    assert log.count("Rejected control message") == 4
    assert ask(client, "ping", worker=name) == {"ok": "pong"}
    assert worker.process.poll() is None
