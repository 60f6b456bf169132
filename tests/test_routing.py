"""Celery's routing model against real brokers: task_queues and task_routes (topic exchanges,
bindings), queues that exist with other arguments (quorum, priority), a failed add_consumer that
leaves the other queues consuming, and the remote-control queue RabbitMQ 4.3 accepts."""

from __future__ import annotations

import json
import re
import uuid

import kombu
import pytest
from apps import basic
from conftest import AMQP_TEST_URL, delete_queue, redis_db
from workers import TESTS, ask, wait_for

from worker_core import App
from worker_core.control.client import broadcast
from worker_core.exceptions import ConfigurationError

RESULTS = redis_db(11)


def _names() -> tuple[str, str]:
    tag = uuid.uuid4().hex[:8]
    return f"routing-{tag}", f"routing-ex-{tag}"


def _client(broker: str, **settings) -> App:
    """A client of apps.basic's tasks on ``broker``, with results in Redis."""
    client = App("routing-client", broker_url=broker, result_backend=RESULTS, **settings)
    client.task(name="apps.basic.add")(basic.add.run)
    return client


@pytest.fixture
def amqp_channel(amqp_url):
    connection = kombu.Connection(amqp_url)
    made: list[tuple[str, str]] = []

    class Declarer:
        def channel(self):
            return connection.channel()

        def made(self, kind: str, name: str) -> None:
            made.append((kind, name))

    yield Declarer()
    channel = connection.channel()
    for kind, name in made:
        try:
            if kind == "queue":
                channel.queue_delete(name)
            else:
                channel.exchange_delete(name)
        except Exception:
            channel = connection.channel()
    connection.release()


# -- the client's routes ----------------------------------------------------------------------------


def test_task_routes_choose_the_exchange_and_routing_key_as_celery_does():
    app = App(
        "r",
        task_queues=[{"name": "feed", "exchange": "news", "exchange_type": "topic", "routing_key": "news.#"}],
        task_routes=[
            {
                "proj.exact": "feed",
                "proj.glob.*": {"queue": "other"},
                re.compile(r"proj\.re\.\d+"): {"exchange": "news", "routing_key": "news.sport"},
            },
            lambda name, args, kwargs, options, task=None: {"queue": "fn"} if name == "proj.fn" else None,
        ],
    )
    # a topic queue: its exchange and its routing key
    feed = app.route("proj.exact")
    assert (feed.exchange, feed.routing_key, feed.exchange_type) == ("news", "news.#", "topic")
    # a queue made on demand: direct, through the default exchange by its name
    other = app.route("proj.glob.x")
    assert (other.exchange, other.routing_key, other.queue.name) == ("", "other", "other")
    by_regex = app.route("proj.re.42")
    assert (by_regex.exchange, by_regex.routing_key, by_regex.exchange_type) == (
        "news",
        "news.sport",
        "topic",
    )
    assert app.route("proj.fn").routing_key == "fn"
    # the caller's queue wins over the route's; nothing matched: the default queue
    assert app.route("proj.exact", queue="mine").routing_key == "mine"
    default = app.route("proj.unrouted")
    assert (default.exchange, default.routing_key, default.queue.name) == ("", "celery", "celery")


def test_a_queue_in_task_queues_without_an_exchange_takes_the_default_exchange_as_in_celery():
    from celery import Celery
    from kombu import Queue

    ours = App(
        "r",
        task_queues=[{"name": "plain", "routing_key": "plain"}],
        task_default_exchange="tasks",
        task_default_exchange_type="topic",
    )
    celery = Celery(broker="amqp://")
    celery.conf.update(
        task_queues=[Queue("plain", routing_key="plain")],
        task_default_exchange="tasks",
        task_default_exchange_type="topic",
    )
    theirs = celery.amqp.queues["plain"]
    mine = ours.topology.queue("plain")
    assert (mine.exchange.name, mine.exchange.type, mine.routing_key) == (
        theirs.exchange.name,
        theirs.exchange.type,
        theirs.routing_key,
    )


def test_a_queue_not_in_task_queues_is_an_error_when_missing_queues_are_not_made():
    app = App("r", task_queues=[{"name": "only"}], task_create_missing_queues=False)
    with pytest.raises(
        ConfigurationError, match=r"queue 'onyl' is not in task_queues .* Did you mean 'only'\?"
    ):
        app.route("t", queue="onyl")


# -- topic exchanges end to end ---------------------------------------------------------------------


@pytest.fixture(params=["amqp", "redis"])
def any_broker(request):
    from conftest import empty_redis, require_server

    if request.param == "redis":
        return empty_redis(redis_db(12))
    require_server(5672, "RabbitMQ")
    return AMQP_TEST_URL


def test_a_celery_client_routing_through_a_topic_exchange_reaches_the_queue_task_queues_binds(
    workers, any_broker
):
    from celery import Celery

    queue, exchange = _names()
    workers.start(
        "-Q",
        queue,
        broker=any_broker,
        backend=RESULTS,
        env={
            "PYTHONPATH": str(TESTS),
            "WORKER_TASK_QUEUES": json.dumps(
                [{"name": queue, "exchange": exchange, "exchange_type": "topic", "routing_key": "feed.#"}]
            ),
        },
    )
    from kombu import Exchange, Queue

    # the producers' settings of a Celery deployment: the same queues, a route by queue and key
    celery = Celery("client", broker=any_broker, backend=RESULTS)
    celery.conf.task_queues = [Queue(queue, Exchange(exchange, "topic"), "feed.#")]
    celery.conf.task_routes = {"apps.basic.add": {"queue": queue, "routing_key": "feed.new"}}
    try:
        assert celery.send_task("apps.basic.add", (2, 3)).get(timeout=20) == 5
    finally:
        celery.close()
    # this project's client routes the same ways, by an exchange and a key too
    queues = [{"name": queue, "exchange": exchange, "exchange_type": "topic", "routing_key": "feed.#"}]
    ours = _client(
        any_broker,
        task_queues=queues,
        task_routes={"apps.basic.*": {"queue": queue, "routing_key": "feed.old"}},
    )
    assert ours.send_task("apps.basic.add", (4, 5)).get(timeout=20) == 9
    by_exchange = _client(
        any_broker,
        task_routes={
            "apps.basic.*": {"exchange": exchange, "exchange_type": "topic", "routing_key": "feed.other"}
        },
    )
    assert by_exchange.send_task("apps.basic.add", (5, 5)).get(timeout=20) == 10
    delete_queue(any_broker, queue)
    delete_queue(any_broker, exchange)


def test_a_fanout_exchange_in_task_queues_reaches_every_queue_bound_to_it(workers, amqp_url, amqp_channel):
    first, exchange = _names()
    second, _ = _names()
    for kind, name in (("queue", first), ("queue", second), ("exchange", exchange)):
        amqp_channel.made(kind, name)
    queues = [{"name": name, "exchange": exchange, "exchange_type": "fanout"} for name in (first, second)]
    env = {"PYTHONPATH": str(TESTS), "WORKER_TASK_QUEUES": json.dumps(queues)}
    worker = workers.start(broker=amqp_url, backend=RESULTS, env=env)  # no -Q: both queues
    assert f"queues     {first}, {second}" in worker.log()
    client = _client(amqp_url, task_queues=queues)
    name = worker.name
    assert ask(client, "conf", worker=name)["task_queues"] == queues  # as given
    described = ask(client, "active_queues", worker=name)  # as Celery's worker describes them
    assert [(q["name"], q["exchange"]["name"], q["exchange"]["type"]) for q in described] == [
        (first, exchange, "fanout"),
        (second, exchange, "fanout"),
    ]
    client.send_task("apps.basic.add", (1, 1), exchange=exchange, routing_key="anything")
    wait_for(lambda: worker.log().count("Task apps.basic.add[") >= 2, 20, message="both copies to run")


# -- queues that exist with other arguments ---------------------------------------------------------


def test_a_worker_adopts_a_quorum_queue_and_a_priority_queue_that_exist_and_consumes_them(
    workers, amqp_url, amqp_channel
):
    quorum, _ = _names()
    priority, _ = _names()
    channel = amqp_channel.channel()
    channel.queue_declare(quorum, durable=True, auto_delete=False, arguments={"x-queue-type": "quorum"})
    channel.queue_declare(
        priority,
        durable=True,
        auto_delete=False,
        arguments={"x-max-priority": 10, "x-dead-letter-exchange": "elsewhere"},
    )
    amqp_channel.made("queue", quorum)
    amqp_channel.made("queue", priority)
    worker = workers.start(
        "-Q", f"{quorum},{priority}", broker=amqp_url, backend=RESULTS, env={"PYTHONPATH": str(TESTS)}
    )
    log = worker.log()
    assert (
        f"Queue {quorum!r} exists on the broker with x-queue-type='quorum' where this worker declares none: "
        f"consuming it as it is (to declare it so, set the queue's queue_type in task_queues"
    ) in log
    assert f"Queue {priority!r} exists on the broker with x-dead-letter-exchange='elsewhere'" in log
    assert f"Quorum queue {quorum}: the prefetch window is per consumer" in log
    client = _client(amqp_url)
    assert client.send_task("apps.basic.add", (1, 1), queue=quorum).get(timeout=20) == 2
    assert client.send_task("apps.basic.add", (2, 2), queue=priority, priority=9).get(timeout=20) == 4


def test_task_default_queue_type_quorum_declares_a_quorum_queue(workers, amqp_url, amqp_channel):
    queue, _ = _names()
    amqp_channel.made("queue", queue)
    workers.start(
        broker=amqp_url,
        backend=RESULTS,
        env={
            "PYTHONPATH": str(TESTS),
            "WORKER_TASK_DEFAULT_QUEUE": queue,
            "WORKER_TASK_DEFAULT_QUEUE_TYPE": "quorum",
        },
    )
    channel = amqp_channel.channel()
    with pytest.raises(Exception, match=r"inequivalent arg .x-queue-type.*current is the value .quorum."):
        channel.queue_declare(queue, durable=True, auto_delete=False)


def test_a_failed_add_consumer_answers_why_and_every_other_queue_goes_on(workers, amqp_url, amqp_channel):
    main, _ = _names()
    quorum, exchange = _names()
    channel = amqp_channel.channel()
    channel.queue_declare(quorum, durable=True, auto_delete=False, arguments={"x-queue-type": "quorum"})
    channel.exchange_declare(exchange, "fanout", durable=True)
    for kind, name in (("queue", main), ("queue", quorum), ("exchange", exchange), ("queue", f"{main}-2")):
        amqp_channel.made(kind, name)
    worker = workers.start("-Q", main, broker=amqp_url, backend=RESULTS, env={"PYTHONPATH": str(TESTS)})
    name = worker.name
    client = _client(amqp_url)
    # a quorum queue cannot join a channel whose window is global
    answer = ask(client, "add_consumer", worker=name, queue=quorum)
    assert answer == {
        "error": f"cannot consume from {quorum!r}: queue {quorum!r} is a quorum queue, which "
        f"RabbitMQ does not let a channel with a global prefetch window consume (this "
        f"worker's queues are classic): restart the worker with it in -Q"
    }
    # an exchange that exists with another type
    answer = ask(client, "add_consumer", worker=name, queue=f"{main}-2", exchange=exchange,
                 exchange_type="direct")
    assert answer["error"].startswith(
        f"cannot consume from '{main}-2': exchange {exchange!r} (of queue '{main}-2') exists on the broker "
        f"with type='fanout', but this worker declares type='direct'"
    )
    assert client.send_task("apps.basic.add", (3, 4), queue=main).get(timeout=20) == 7
    assert [q["name"] for q in ask(client, "active_queues", worker=name)] == [main]
    assert ask(client, "ping", worker=name) == {"ok": "pong"}


def test_a_queue_that_exists_as_a_stream_stops_the_worker_in_one_line(workers, amqp_url, amqp_channel):
    stream, _ = _names()
    channel = amqp_channel.channel()
    channel.queue_declare(stream, durable=True, auto_delete=False, arguments={"x-queue-type": "stream"})
    amqp_channel.made("queue", stream)
    worker = workers.start("-Q", stream, broker=amqp_url, ready=False, env={"PYTHONPATH": str(TESTS)})
    assert worker.process.wait(timeout=30) != 0
    assert (
        f"queue {stream!r} exists on the broker with x-queue-type='stream', which this worker cannot "
        f"consume as a task queue"
    ) in worker.log()
    assert "Traceback" not in worker.log()


# -- remote control on RabbitMQ 4.3 -----------------------------------------------------------------


def test_the_remote_control_queue_is_exclusive_and_a_restart_under_the_same_name_answers(
    workers, amqp_url, amqp_channel
):
    name = f"ctl-{uuid.uuid4().hex[:8]}@localhost"
    worker = workers.start("-n", name, broker=amqp_url, env={"PYTHONPATH": str(TESTS)})
    client = _client(amqp_url)
    assert ask(client, "ping", worker=name) == {"ok": "pong"}
    # exclusive (RabbitMQ 4.3 refuses queues neither durable nor exclusive): another connection
    # cannot use it
    with pytest.raises(Exception, match="RESOURCE_LOCKED"):
        amqp_channel.channel().queue_declare(f"{name}.celery.pidbox", passive=True)
    worker.kill()
    workers.start("-n", name, broker=amqp_url, env={"PYTHONPATH": str(TESTS)})
    wait_for(
        lambda: broadcast(client, "ping", destination=[name], timeout=1, limit=1),
        20,
        message="the restarted worker to answer",
    )


def test_a_second_worker_of_the_same_name_says_remote_control_is_off(workers, amqp_url):
    name = f"ctl-{uuid.uuid4().hex[:8]}@localhost"
    queue, _ = _names()
    workers.start("-n", name, broker=amqp_url, env={"PYTHONPATH": str(TESTS)})
    second = workers.start(
        "-n", name, "-Q", queue, broker=amqp_url, backend=RESULTS, env={"PYTHONPATH": str(TESTS)}
    )
    second.wait_log(f"Remote control is off for this worker: another worker named {name} already listens")
    # and it works all the same
    assert _client(amqp_url).send_task("apps.basic.add", (1, 2), queue=queue).get(timeout=20) == 3
    delete_queue(amqp_url, queue)


# -- a Celery app's routing under workerctl worker ---------------------------------------------------


def test_a_celery_apps_task_queues_and_task_routes_run_unchanged_under_workerctl_worker(workers, amqp_url):
    queue, exchange = _names()
    env = {
        "PYTHONPATH": str(TESTS),
        "CELERY_BROKER_URL": amqp_url,
        "CELERY_RESULT_BACKEND": RESULTS,
        "ROUTED_QUEUE": queue,
        "ROUTED_EXCHANGE": exchange,
    }
    worker = workers.start(app="apps.celery_routed", env=env)  # no -Q: the queues of task_queues
    assert f"queues     {queue}" in worker.log()
    name = worker.name
    [shown] = ask(_client(amqp_url), "conf", worker=name)["task_queues"]  # kombu's queue, as data
    assert (shown["name"], shown["exchange"]["type"], shown["routing_key"]) == (queue, "topic", "feed.#")
    # a producer of the deployment: the same settings, sending by name through its routes
    from celery import Celery
    from kombu import Exchange, Queue

    producer = Celery("producer", broker=amqp_url, backend=RESULTS)
    producer.conf.update(
        task_queues=[Queue(queue, Exchange(exchange, "topic"), "feed.#")],
        task_routes={
            "apps.celery_routed.*": {
                "exchange": exchange,
                "exchange_type": "topic",
                "routing_key": "feed.add",
            }
        },
    )
    try:
        assert producer.send_task("apps.celery_routed.add", (20, 22)).get(timeout=20) == 42
    finally:
        producer.close()
    worker.stop()
    delete_queue(amqp_url, queue)
    delete_queue(amqp_url, exchange)


def test_a_queue_argument_the_broker_refuses_stops_the_worker_in_one_line(workers, amqp_url, amqp_channel):
    queue, _ = _names()
    amqp_channel.made("queue", queue)
    queues = [{"name": queue, "queue_arguments": {"x-max-length": "many"}}]
    worker = workers.start(
        "-Q",
        queue,
        broker=amqp_url,
        ready=False,
        env={"PYTHONPATH": str(TESTS), "WORKER_TASK_QUEUES": json.dumps(queues)},
    )
    assert worker.process.wait(timeout=30) != 0
    assert f"queue {queue!r}: the broker refused its declaration (" in worker.log()
    assert "x-max-length" in worker.log() and "Traceback" not in worker.log()


def test_a_router_function_in_a_config_module_is_task_routes():
    import types

    config = types.ModuleType("routing_config")
    config.task_routes = lambda name, args, kwargs, options, task=None: {"queue": f"q-{args[0]}"}
    app = App("r", config_source=config)
    assert app.route("proj.any", args=(7,)).routing_key == "q-7"


def test_a_worker_whose_old_connection_still_holds_its_control_queue_takes_it_back_once_it_closes(
    workers, amqp_url
):
    name = f"ctl-{uuid.uuid4().hex[:8]}@localhost"
    queue, _ = _names()
    old = kombu.Connection(amqp_url)  # as a restarted worker's old connection the broker keeps
    old.channel().queue_declare(f"{name}.celery.pidbox", exclusive=True, auto_delete=True)
    try:
        worker = workers.start(
            "-n", name, "-Q", queue, broker=amqp_url, backend=RESULTS, env={"PYTHONPATH": str(TESTS)}
        )
        worker.wait_log("Remote control is off for this worker")
        client = _client(amqp_url)
        assert client.send_task("apps.basic.add", (2, 2), queue=queue).get(timeout=20) == 4  # it works
    finally:
        old.release()
    worker.wait_log(
        f"Remote control is on: this worker's queue {name}.celery.pidbox is free again", timeout=30
    )
    assert ask(client, "ping", worker=name) == {"ok": "pong"}
    delete_queue(amqp_url, queue)
