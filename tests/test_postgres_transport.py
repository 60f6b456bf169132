"""The PostgreSQL transport and result backend against the shared server's database ``test``, in
a schema of this module's own: both contract suites, the tables it creates, and real workers
(priorities, countdowns held in the table, expiry, leases renewed past the visibility timeout,
remote control through the tables)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import kombu
import pytest
from apps import basic
from conftest import require_server
from postgres import POSTGRES_URL, drop_schema, schema_name
from workers import TESTS, drain, wait_for

from worker_core.app.broker import task_queue
from worker_core.app.settings import Settings
from worker_core.testing import result_backend_contract, transport_contract
from worker_transport_postgres import PostgresBackend, PostgresTransport
from worker_transport_postgres.schema import LATEST, Names, versions


@pytest.fixture(scope="module")
def schema() -> Iterator[str]:
    require_server(5432, "PostgreSQL")
    name = schema_name("worker_pg")
    yield name
    drop_schema(POSTGRES_URL, name)


@pytest.fixture(scope="module")
def settings(schema: str) -> Settings:
    return Settings(
        broker_transport_options={"schema": schema}, result_backend_transport_options={"schema": schema}
    )


@pytest.mark.parametrize("check", transport_contract.CHECKS, ids=transport_contract.check_name)
def test_the_postgres_transport_honours_the_transport_contract(
    check: transport_contract.Check, settings: Settings
) -> None:
    check(PostgresTransport, POSTGRES_URL, settings=settings)


BACKEND_CHECKS = [
    check
    for check in result_backend_contract.CHECKS
    if result_backend_contract.applies(check, PostgresBackend)
]


@pytest.mark.parametrize("check", BACKEND_CHECKS, ids=result_backend_contract.check_name)
def test_the_postgres_backend_honours_the_result_backend_contract(
    check: result_backend_contract.Check, settings: Settings
) -> None:
    check(PostgresBackend, POSTGRES_URL, settings=settings)


def _connect(settings: Settings) -> kombu.Connection:
    transport = PostgresTransport(POSTGRES_URL, settings)
    connection = kombu.Connection(
        POSTGRES_URL, transport=transport.kombu_transport(), **transport.connection_options()
    )
    connection.connect()
    return connection


def _receive(connection: kombu.Connection, queue: kombu.Queue, count: int, timeout: float = 10) -> list:
    received: list = []
    with kombu.Consumer(
        connection, [queue], accept=["json"], on_message=received.append, prefetch_count=count
    ):
        drain(connection, lambda: len(received) >= count, timeout, message=f"{count} message(s)")
    return received


def test_the_tables_are_made_at_the_latest_version_with_kombus_names(settings: Settings, schema: str) -> None:
    import psycopg

    with _connect(settings):
        pass
    with psycopg.connect(POSTGRES_URL) as db:
        assert versions(db, Names(schema)) == LATEST
        tables = {
            row[0]
            for row in db.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
            )
        }
    assert {"kombu_queue", "kombu_message", "celery_taskmeta", "celery_tasksetmeta"} <= tables


def test_higher_priorities_are_delivered_first_then_in_publication_order(settings: Settings) -> None:
    with _connect(settings) as connection:
        queue = task_queue(f"prio-{uuid.uuid4().hex[:8]}", settings)
        queue(connection.default_channel).declare()
        producer = kombu.Producer(connection)
        for n, priority in enumerate([1, 9, 5, 9, 0]):
            producer.publish(
                {"n": n},
                exchange=queue.exchange,
                routing_key=queue.routing_key,
                priority=priority,
                serializer="json",
            )
        received = _receive(connection, queue, 5)
        assert [message.decode()["n"] for message in received] == [1, 3, 2, 0, 4]
        for message in received:
            message.ack()


def test_an_expired_message_is_never_delivered_and_is_deleted(settings: Settings, schema: str) -> None:
    import psycopg

    with _connect(settings) as connection:
        queue = task_queue(f"ttl-{uuid.uuid4().hex[:8]}", settings)
        queue(connection.default_channel).declare()
        producer = kombu.Producer(connection)
        producer.publish(
            {"n": "old"},
            exchange=queue.exchange,
            routing_key=queue.routing_key,
            expiration=0.2,
            serializer="json",
        )
        producer.publish(
            {"n": "new"}, exchange=queue.exchange, routing_key=queue.routing_key, serializer="json"
        )
        time.sleep(0.5)  # past the first message's expiry: the behaviour under test
        [message] = _receive(connection, queue, 1)
        assert message.decode() == {"n": "new"}
        message.ack()
        connection.transport.maintain(force=True)
        with psycopg.connect(POSTGRES_URL) as db:
            left = db.execute(
                f'SELECT count(*) FROM "{schema}".kombu_message m JOIN "{schema}".kombu_queue q '
                f"ON q.id = m.queue_id WHERE q.name = %s AND m.visible",
                (queue.name,),
            ).fetchone()[0]
        assert left == 0  # (the one delivered is taken until its acknowledgement is written)


# -- real workers -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def environment(schema: str) -> dict[str, str]:
    return {
        "PYTHONPATH": str(TESTS),
        "WORKER_BROKER_TRANSPORT_OPTIONS": json.dumps({"schema": schema, "visibility_timeout": 2}),
        "WORKER_RESULT_BACKEND_TRANSPORT_OPTIONS": json.dumps({"schema": schema}),
    }


@pytest.fixture
def client(schema: str) -> Iterator[object]:
    basic.app.conf.update(
        broker_url=POSTGRES_URL,
        result_backend=POSTGRES_URL,
        broker_transport_options={"schema": schema, "visibility_timeout": 2},
        result_backend_transport_options={"schema": schema},
    )
    yield basic.app
    basic.app.close()


def test_a_worker_runs_tasks_and_stores_their_results(workers, client, environment) -> None:
    worker = workers.start(
        "-c", "2", pool="prefork", broker=POSTGRES_URL, backend=POSTGRES_URL, env=environment
    )
    assert basic.add.delay(2, 3).get(timeout=20) == 5
    results = [basic.add.delay(n, n) for n in range(50)]
    assert [result.get(timeout=30) for result in results] == [2 * n for n in range(50)]
    with pytest.raises(basic.Boom):
        basic.boom.delay("bad").get(timeout=20)
    assert worker.stop() == 0


def test_a_countdown_waits_in_the_table_not_in_the_worker(workers, client, environment, schema: str) -> None:
    import psycopg

    worker = workers.start(pool="threads", broker=POSTGRES_URL, backend=POSTGRES_URL, env=environment)
    result = basic.add.apply_async((4, 4), countdown=3)
    with psycopg.connect(POSTGRES_URL) as db:
        row = db.execute(
            f'SELECT not_before > now(), visible FROM "{schema}".kombu_message '
            f"WHERE payload::jsonb -> 'headers' ->> 'id' = %s",
            (result.id,),
        ).fetchone()
    assert row == (True, True)
    time.sleep(1.0)  # a second of the countdown: the worker must not have the task yet
    assert result.id not in worker.log()
    assert result.get(timeout=20) == 8
    assert f"{result.id}] received" in worker.log()


def test_a_task_running_past_the_visibility_timeout_runs_once_on_two_workers(
    workers, client, environment, tmp_path: Path
) -> None:
    proof = tmp_path / "ran"
    for _ in range(2):
        workers.start(pool="threads", broker=POSTGRES_URL, backend=POSTGRES_URL, env=environment)
    results = [basic.record_slowly.delay(str(proof), n, 5) for n in range(2)]  # 2.5 leases long
    assert sorted(result.get(timeout=40) for result in results) == [0, 1]
    time.sleep(3)  # a lapsed lease would have had another worker run a task again by now
    assert sorted(basic.lines(proof)) == ["0", "1"]


def test_remote_control_reaches_a_worker_through_the_tables(workers, client, environment) -> None:
    worker = workers.start(pool="threads", broker=POSTGRES_URL, backend=POSTGRES_URL, env=environment)
    command = [
        sys.executable,
        "-m",
        "worker_core",
        "inspect",
        "ping",
        "-A",
        "apps.basic",
        "-d",
        worker.name,
        "--timeout",
        "5",
        "--json",
    ]
    env = dict(environment, WORKER_BROKER_URL=POSTGRES_URL)
    out = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env={**__import__("os").environ, **env},
        cwd=TESTS,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert worker.name in out.stdout


def test_a_killed_workers_tasks_run_once_on_another_worker(
    workers, client, environment, tmp_path: Path
) -> None:
    proof = tmp_path / "ran"
    first = workers.start(
        "-c", "2", pool="prefork", broker=POSTGRES_URL, backend=POSTGRES_URL, env=environment
    )
    results = [basic.record_slowly.delay(str(proof), n, 2) for n in range(4)]
    wait_for(lambda: first.log().count(" received") >= 4, message="all four tasks received")
    first.crash()
    assert basic.lines(proof) == []
    second = workers.start(
        "-c", "2", pool="prefork", broker=POSTGRES_URL, backend=POSTGRES_URL, env=environment
    )
    assert sorted(result.get(timeout=60) for result in results) == [0, 1, 2, 3]
    assert sorted(map(int, basic.lines(proof))) == [0, 1, 2, 3]
    second.wait_log("whose lease lapsed")


def test_a_worker_holds_the_connections_the_page_says(workers, client, environment) -> None:
    """prefork -c 2 with results: about 4 + N (consumer, LISTEN, leases, publisher, results in the
    main process and in each child that stores results)."""
    import psycopg
    from workers import children_of

    worker = workers.start("-c", "2", pool="prefork", broker=POSTGRES_URL, backend=POSTGRES_URL,
                           env=environment)
    results = [basic.record_slowly.delay("/dev/null", n, 0.3) for n in range(6)]  # held, then stored
    assert [result.get(timeout=30) for result in results] == list(range(6))
    pids = [worker.pid, *children_of(worker.pid)]
    query = "SELECT application_name FROM pg_stat_activity WHERE application_name LIKE 'worker %'"
    with psycopg.connect(POSTGRES_URL) as db:
        names = [row[0] for row in db.execute(query).fetchall()]
    mine = [name for name in names if int(name.rpartition(":")[2]) in pids]
    assert 3 <= len(mine) <= 4 + 2, mine


def test_the_metrics_gauges_show_the_queue_lengths_read_from_sql(settings: Settings) -> None:
    from worker_transport_postgres.plugin import worker_gauges

    with _connect(settings) as connection:
        queue = task_queue(f"gauges-{uuid.uuid4().hex[:8]}", settings)
        queue(connection.default_channel).declare()
        producer = kombu.Producer(connection)
        where = {"exchange": queue.exchange, "routing_key": queue.routing_key, "serializer": "json"}
        for _ in range(3):
            producer.publish({"n": 1}, **where)
        producer.publish({"n": 2}, headers={"eta": "2999-01-01T00:00:00+00:00"}, **where)
        with kombu.Consumer(connection, [queue], accept=["json"], on_message=lambda message: None,
                            prefetch_count=1):
            transport = connection.transport
            transport.pump()  # one taken; the maintenance reads the lengths
            transport._read_depths(transport.db())
            gauges = {(gauge.labels["queue"], gauge.labels["state"]): gauge.value
                      for gauge in worker_gauges(None) if gauge.name == "worker_postgres_queue_messages"}
    assert gauges[(queue.name, "delayed")] == 1
    assert gauges[(queue.name, "ready")] == 2 and gauges[(queue.name, "taken")] == 1


def test_the_transport_tells_the_databases_clock(settings: Settings) -> None:
    from worker_core.slots import TellsTime

    assert isinstance(PostgresTransport, TellsTime)
    with _connect(settings) as connection:
        assert abs(PostgresTransport.broker_time(connection) - time.time()) < 2  # the same machine's clock
