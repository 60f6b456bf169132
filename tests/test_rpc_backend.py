"""The ``rpc://`` result backend against the real Celery 5.7, over RabbitMQ and Redis: a Celery
client with ``result_backend='rpc://'`` reads this worker's results, failures (as Celery encodes
exceptions), retries and states, under prefork and threads; this project's client reads this
worker's and a Celery worker's; this worker's replies and this client's reply queue and task
messages are Celery's on the wire; and what the backend cannot do (chords, saving groups, reading
another client's results) is refused or answered as Celery does.

One worker per broker and pool serves most of the module; each test uses task ids, queues and
gate files of its own. Redis databases 10 (this worker), 11 (Celery's) and 14 (the tests of the
wire, with workers of their own) hold the Redis brokers.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from apps import rpc
from conftest import AMQP_TEST_URL, WorkerFactory, delete_queue, empty_redis, redis_db, require_server
from wire import messages_on, normalized
from workers import WorkerProcess, wait_for

from worker_core.exceptions import ConfigurationError, NotRegistered, ResultTimeout

RPC_URL = redis_db(10)  # the Redis broker of this module's workers
CELERY_RPC_URL = redis_db(11)  # ... of its Celery workers
WIRE_URL = redis_db(14)  # ... of the tests of the wire
SERVED = [("amqp", "prefork"), ("amqp", "threads"), ("redis", "prefork"), ("redis", "threads")]
CELERY_SERVED = [("amqp", "prefork"), ("redis", "threads")]
TIMEOUT = 20


def _broker(kind: str, redis_url: str = RPC_URL) -> str:
    if kind == "redis":
        return empty_redis(redis_url)
    require_server(5672, "RabbitMQ")
    return AMQP_TEST_URL


@attrs.frozen
class Served:
    """A worker (this one or Celery's) with ``rpc://`` results, on its own queue."""

    broker: str
    pool: str
    queue: str
    worker: WorkerProcess


def _serve(request: pytest.FixtureRequest, factory: WorkerFactory, celery: bool) -> Iterator[Served]:
    kind, pool = request.param
    broker = _broker(kind, CELERY_RPC_URL if celery else RPC_URL)
    queue = f"rpc-{uuid.uuid4().hex[:8]}"
    try:
        if celery:
            worker = factory.start_celery("-Q", queue, "-c", "2", app="apps.celery_rpc", pool=pool,
                                          broker=broker, backend="rpc://",
                                          env={"CELERY_DEFAULT_QUEUE": queue})
        else:
            worker = factory.start("-Q", queue, "-c", "2", app="apps.rpc", pool=pool, broker=broker,
                                   backend="rpc://", env={"WORKER_TASK_TRACK_STARTED": "true"})
        yield Served(broker, pool, queue, worker)
    finally:
        factory.cleanup()
        delete_queue(broker, queue)


@pytest.fixture(scope="module", params=SERVED, ids=[f"{kind}-{pool}" for kind, pool in SERVED])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """This worker, with task_track_started."""
    yield from _serve(request, WorkerFactory(tmp_path_factory.mktemp("rpc")), celery=False)


@pytest.fixture(scope="module", params=CELERY_SERVED,
                ids=[f"celery-{kind}-{pool}" for kind, pool in CELERY_SERVED])
def celery_served(request: pytest.FixtureRequest,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A Celery worker, with task_track_started."""
    yield from _serve(request, WorkerFactory(tmp_path_factory.mktemp("rpc-celery")), celery=True)


def _celery_client(broker: str) -> Any:
    from celery import Celery

    app = Celery("rpc-client", broker=broker, backend="rpc://", set_as_current=False)
    app.conf.update(broker_connection_retry_on_startup=True)
    return app


@pytest.fixture
def celery_client(served: Served) -> Iterator[Any]:
    app = _celery_client(served.broker)
    yield app
    app.close()


@contextlib.contextmanager
def _ours(broker: str, queue: str, backend: str = "rpc://") -> Iterator[Any]:
    """``apps.rpc``'s app as this project's client, sending to ``queue``."""
    rpc.app.conf.update(broker_url=broker, result_backend=backend, task_default_queue=queue)
    try:
        yield rpc.app
    finally:
        rpc.app.conf.update(broker_url=None, result_backend=None, task_default_queue="celery")
        rpc.app.close()


@pytest.fixture
def ours(served: Served) -> Iterator[Any]:
    """This project's client of the served worker."""
    with _ours(served.broker, served.queue) as app:
        yield app


# -- a Celery client and this worker -----------------------------------------------------------------


def test_a_celery_client_gets_our_workers_results_in_any_order_failures_and_retries(
        served: Served, celery_client: Any) -> None:
    from celery.exceptions import NotRegistered as CeleryNotRegistered

    send = celery_client.send_task
    results = [send("apps.rpc.add", (n, n), queue=served.queue) for n in range(10)]
    failed = send("apps.rpc.boom", ("from celery", 7), queue=served.queue)
    retried = send("apps.rpc.flaky", (2,), queue=served.queue)
    unknown = send("apps.rpc.missing", queue=served.queue)
    assert [result.get(timeout=TIMEOUT) for result in reversed(results)] == [2 * n for n in range(9, -1, -1)]
    with pytest.raises(rpc.Boom) as raised:
        failed.get(timeout=TIMEOUT)
    assert raised.value.args == ("from celery", 7)
    assert failed.state == "FAILURE" and "Boom" in failed.traceback
    assert retried.get(timeout=TIMEOUT) == 2  # the retry's message keeps the client's reply_to
    with pytest.raises(CeleryNotRegistered):
        unknown.get(timeout=TIMEOUT)


def test_a_celery_client_sees_the_started_and_custom_states_of_our_running_task(
        served: Served, celery_client: Any, tmp_path: Path) -> None:
    result = celery_client.send_task("apps.rpc.stages", (str(tmp_path),), queue=served.queue)
    wait_for(lambda: result.state == "STARTED", TIMEOUT, message="STARTED")
    (tmp_path / "1").touch()
    wait_for(lambda: result.state == "PROGRESS", TIMEOUT, message="PROGRESS")
    assert result.info == {"step": 1}
    (tmp_path / "2").touch()
    assert result.get(timeout=TIMEOUT) == "done"
    assert result.state == "SUCCESS"


# -- this project's client and this worker ---------------------------------------------------------------


def test_our_client_gets_our_workers_results_in_any_order_failures_retries_and_states(
        served: Served, ours: Any, tmp_path: Path) -> None:
    results = [rpc.add.delay(n, n) for n in range(10)]
    failed = rpc.boom.delay("from us", 8)
    retried = rpc.flaky.delay(2)
    unknown = ours.send_task("apps.rpc.missing")
    staged = rpc.stages.delay(str(tmp_path))
    assert [result.get(timeout=TIMEOUT) for result in reversed(results)] == [2 * n for n in range(9, -1, -1)]
    with pytest.raises(rpc.Boom) as raised:
        failed.get(timeout=TIMEOUT)
    assert raised.value.args == ("from us", 8)
    assert retried.get(timeout=TIMEOUT) == 2
    with pytest.raises(NotRegistered):
        unknown.get(timeout=TIMEOUT)
    wait_for(lambda: staged.state == "STARTED", TIMEOUT, message="STARTED")
    (tmp_path / "1").touch()
    wait_for(lambda: staged.state == "PROGRESS", TIMEOUT, message="PROGRESS")
    assert staged.info == {"step": 1}
    (tmp_path / "2").touch()
    assert staged.get(timeout=TIMEOUT) == "done"
    assert [result.state for result in results] == ["SUCCESS"] * 10


def test_only_the_thread_that_sent_a_task_reads_its_result_and_forget_drops_it(
        served: Served, ours: Any) -> None:
    result = rpc.add.delay(20, 1)
    elsewhere: dict[str, Any] = {}

    def read_in_another_thread() -> None:
        other = ours.AsyncResult(result.id)
        elsewhere["state"] = other.state
        try:
            other.get(timeout=0.5)
        except ResultTimeout as exc:
            elsewhere["timeout"] = str(exc)

    thread = threading.Thread(target=read_in_another_thread)
    thread.start()
    thread.join()
    assert elsewhere["state"] == "PENDING"
    assert result.id in elsewhere["timeout"] and "only the client that sent a task" in elsewhere["timeout"]
    assert result.get(timeout=TIMEOUT) == 21
    assert ours.AsyncResult(result.id).state == "SUCCESS"  # another handle, same client
    result.forget()
    assert ours.AsyncResult(result.id).state == "PENDING"


def test_a_task_revoked_before_it_is_sent_reaches_its_client_as_revoked(served: Served, ours: Any) -> None:
    """The worker stores nothing for a revoked id it holds no message for (it could reach no
    client), and answers REVOKED to the client whose message then comes."""
    from worker_core.exceptions import TaskRevokedError

    task_id = str(uuid.uuid4())
    ours.AsyncResult(task_id).revoke()
    served.worker.wait_log(f"Tasks flagged as revoked: {task_id}")
    result = rpc.add.apply_async((1, 1), task_id=task_id)
    with pytest.raises(TaskRevokedError):
        result.get(timeout=TIMEOUT)


def test_a_task_sent_by_a_task_in_a_worker_declares_no_reply_queue() -> None:
    """As Celery's prefork children: nobody reads a worker's reply queue, so none is declared
    (the broker here cannot be reached: declaring would fail)."""
    from worker_core.app.context import TaskContext, pushed
    from worker_core.app.settings import Settings
    from worker_core.results.rpc.backend import RPCBackend

    backend = RPCBackend("rpc://", Settings(broker_url="amqp://guest:guest@127.0.0.1:1//"))
    running = TaskContext("running-task", "apps.rpc.flaky")
    running.called_directly = False
    with pushed(running):
        backend.on_task_call("sent-by-the-running-task")
    backend.close()


def test_a_group_gets_every_result_and_a_chord_or_saving_a_group_is_refused_before_anything_is_sent(
        served: Served, ours: Any) -> None:
    from worker_core import chord, group

    grouped = group(rpc.add.s(n, 1) for n in range(5)).delay()
    assert grouped.get(timeout=TIMEOUT) == [1, 2, 3, 4, 5]
    with pytest.raises(ConfigurationError, match="does not support chords, as Celery's rpc backend does not"):
        chord([rpc.add.s(1, 1)], rpc.add.s(1)).delay()
    with pytest.raises(ConfigurationError, match="keeps no results"):
        grouped.save()
    sent = rpc.add.delay(40, 2)  # nothing of the chord reached the queue before this task
    assert sent.get(timeout=TIMEOUT) == 42


def test_a_chain_whose_first_step_fails_sends_the_failure_of_every_later_step_to_its_client(
        served: Served, ours: Any) -> None:
    from worker_core import chain

    chained = chain(rpc.boom.s("first step", 3), rpc.add.s(1), rpc.add.s(2)).delay()
    last = ours.AsyncResult(chained.id)  # its own state, not its parent's failure re-raised
    with pytest.raises(rpc.Boom) as raised:
        last.get(timeout=TIMEOUT)
    assert raised.value.args == ("first step", 3) and last.state == "FAILURE"


# -- this project's client and a Celery worker ------------------------------------------------------------


@pytest.fixture
def ours_of_celery(celery_served: Served) -> Iterator[Any]:
    with _ours(celery_served.broker, celery_served.queue) as app:
        yield app


def test_our_client_gets_a_celery_workers_results_failures_retries_states_and_chains(
        celery_served: Served, ours_of_celery: Any, tmp_path: Path) -> None:
    from worker_core import chain, group

    results = [rpc.add.delay(n, n) for n in range(10)]
    failed = rpc.boom.delay("from celery's worker", 9)
    retried = rpc.flaky.delay(2)
    staged = rpc.stages.delay(str(tmp_path))
    chained = chain(rpc.add.s(1, 1), rpc.add.s(10), rpc.add.s(100)).delay()  # Celery's worker sends each step
    assert [result.get(timeout=TIMEOUT) for result in reversed(results)] == [2 * n for n in range(9, -1, -1)]
    with pytest.raises(rpc.Boom) as raised:
        failed.get(timeout=TIMEOUT)
    assert raised.value.args == ("from celery's worker", 9)
    assert retried.get(timeout=TIMEOUT) == 2
    assert chained.get(timeout=TIMEOUT) == 112 and chained.parent.get(timeout=TIMEOUT) == 12
    assert group(rpc.add.s(n, 1) for n in range(3)).delay().get(timeout=TIMEOUT) == [1, 2, 3]
    wait_for(lambda: staged.state == "STARTED", TIMEOUT, message="STARTED")
    (tmp_path / "1").touch()
    wait_for(lambda: staged.state == "PROGRESS", TIMEOUT, message="PROGRESS")
    assert staged.info == {"step": 1}
    (tmp_path / "2").touch()
    assert staged.get(timeout=TIMEOUT) == "done"


# -- on the wire --------------------------------------------------------------------------------------------


@pytest.fixture
def redis_broker() -> Iterator[Any]:
    import redis

    client = redis.Redis.from_url(empty_redis(WIRE_URL))
    yield client
    client.close()


def _replies_on(client: Any, queue: str, count: int) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []

    def arrived() -> bool:
        found[:] = messages_on(client, queue)
        return len(found) >= count

    wait_for(arrived, TIMEOUT, message=f"{count} messages on {queue}")
    return found


def _comparable(message: dict[str, Any]) -> Any:
    """A reply with what differs between two runs replaced: ids and times (``normalized``), the
    delivery tag, the reply queue's name, the traceback's text, and the pid and host name a
    STARTED state names."""
    message = dict(message, properties=dict(message["properties"]), body=dict(message["body"]))
    message["properties"].pop("delivery_tag")
    assert message["properties"]["delivery_info"]["routing_key"].startswith("replies-")
    message["properties"]["delivery_info"] = dict(message["properties"]["delivery_info"],
                                                  routing_key="<replies>")
    body = message["body"]
    if body.get("traceback"):
        body["traceback"] = "<traceback>"
    if body["status"] == "STARTED":
        body["result"] = {key: f"<{key}>" for key in body["result"]}
    return normalized(message)


@pytest.mark.parametrize("persistent", [False, True], ids=["transient", "result_persistent"])
def test_our_worker_sends_each_state_as_celerys_worker_does(
        redis_broker: Any, workers: WorkerFactory, persistent: bool) -> None:
    url = WIRE_URL
    ours_queue, theirs_queue = f"rpc-ours-{uuid.uuid4().hex[:8]}", f"rpc-theirs-{uuid.uuid4().hex[:8]}"
    workers.start("-Q", ours_queue, app="apps.rpc", broker=url, backend="rpc://",
                  env={"WORKER_TASK_TRACK_STARTED": "true",
                       "WORKER_RESULT_PERSISTENT": str(persistent).lower()})
    workers.start_celery("-Q", theirs_queue, app="apps.celery_rpc", broker=url, backend="rpc://",
                         env={"CELERY_RESULT_PERSISTENT": str(persistent).lower()})
    client = _celery_client(url)
    try:
        for queue, replies in ((ours_queue, "replies-ours"), (theirs_queue, "replies-theirs")):
            client.send_task("apps.rpc.add", (2, 3), queue=queue, reply_to=replies)
            client.send_task("apps.rpc.boom", ("wire", 1), queue=queue, reply_to=replies)
        ours_sent = _replies_on(redis_broker, "replies-ours", 4)
        theirs_sent = _replies_on(redis_broker, "replies-theirs", 4)
    finally:
        client.close()
    assert [_comparable(message) for message in ours_sent] == [_comparable(message)
                                                               for message in theirs_sent]
    assert [message["body"]["status"] for message in ours_sent] == ["STARTED", "SUCCESS", "STARTED",
                                                                     "FAILURE"]
    assert {message["properties"]["delivery_mode"] for message in ours_sent} == {2 if persistent else 1}
    assert ours_sent[3]["body"]["result"] == {"exc_type": "Boom", "exc_message": ["wire", 1],
                                              "exc_module": "apps.rpc"}


def test_our_clients_task_message_names_its_reply_queue_as_celerys_client_does(redis_broker: Any) -> None:
    queue = f"rpc-wire-{uuid.uuid4().hex[:8]}"
    celery = _celery_client(WIRE_URL)
    try:
        celery.send_task("apps.rpc.add", (1, 2), queue=queue, ignore_result=False)  # as its Task sends it
    finally:
        celery.close()
    theirs = messages_on(redis_broker, queue)
    redis_broker.delete(queue)
    with _ours(WIRE_URL, queue) as app:
        rpc.add.delay(1, 2)
        oid = app.thread_oid
    mine = messages_on(redis_broker, queue)
    assert mine[0]["properties"]["reply_to"] == oid and theirs[0]["properties"]["reply_to"]
    assert normalized(mine) == normalized(theirs)


def test_our_client_declares_its_reply_queue_as_celerys_client_does() -> None:
    """Declaring an existing RabbitMQ queue with other arguments fails: Celery's declaration of
    the reply queue this client declared succeeds, one with another expiry does not."""
    from amqp.exceptions import PreconditionFailed

    broker = _broker("amqp")
    celery = _celery_client(broker)
    try:
        with _ours(broker, f"rpc-declare-{uuid.uuid4().hex[:8]}") as app:
            app.backend.on_task_call("some-task")
            oid = app.thread_oid
        backend = celery.backend
        backend.__dict__["oid"] = oid  # Celery's own reply queue, under this client's name
        with celery.connection_for_write() as connection:
            try:
                backend.binding(connection.default_channel).declare()
                other = backend.Queue(oid, backend.exchange, oid, durable=True, auto_delete=True, expires=10)
                with pytest.raises(PreconditionFailed):
                    other(connection.channel()).declare()
            finally:
                connection.default_channel.queue_delete(oid)
    finally:
        celery.close()


def test_without_reply_to_our_worker_sends_nothing_and_says_so_once(
        redis_broker: Any, workers: WorkerFactory) -> None:
    queue = f"rpc-nowhere-{uuid.uuid4().hex[:8]}"
    worker = workers.start("-Q", queue, app="apps.rpc", broker=WIRE_URL, backend="rpc://")
    with _ours(WIRE_URL, queue, backend="disabled"):  # plain tasks: an empty reply_to
        ids = [rpc.add.delay(n, n).id for n in range(3)]
    for task_id in ids:
        worker.wait_log(f"Task apps.rpc.add[{task_id}] succeeded")
    assert worker.log().count("its message has no reply_to") == 1
    lists = [key for key in redis_broker.scan_iter() if redis_broker.type(key) == b"list"]
    assert lists == []  # nothing was sent anywhere
