"""Enqueue in the application's transaction: tasks sent inside ``enqueue_in(conn)`` are written on
the application's own connection (psycopg 3, SQLAlchemy's Connection and Session, Django's), so a
rollback leaves no task and no row, and a commit runs the task once, on a real worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from apps import basic
from conftest import require_server
from postgres import POSTGRES_URL, drop_schema, schema_name
from workers import TESTS, wait_for

from worker_core.exceptions import ConfigurationError, TransportError
from worker_transport_postgres import enqueue_in


@pytest.fixture(scope="module")
def schema() -> Iterator[str]:
    require_server(5432, "PostgreSQL")
    name = schema_name("worker_enqueue")
    with psycopg.connect(POSTGRES_URL, autocommit=True) as db:
        db.execute(f'CREATE SCHEMA "{name}"')
        db.execute(f'CREATE TABLE "{name}".orders (id serial PRIMARY KEY, note text NOT NULL)')
    yield name
    drop_schema(POSTGRES_URL, name)


@pytest.fixture(scope="module")
def worker(schema: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from conftest import WorkerFactory

    factory = WorkerFactory(tmp_path_factory.mktemp("workers"))
    env = {"PYTHONPATH": str(TESTS), "WORKER_BROKER_TRANSPORT_OPTIONS": json.dumps({"schema": schema})}
    try:
        yield factory.start(pool="threads", broker=POSTGRES_URL, env=env)
    finally:
        factory.cleanup()


@pytest.fixture
def client(schema: str) -> Iterator[object]:
    basic.app.conf.update(broker_url=POSTGRES_URL, result_backend=None,
                          broker_transport_options={"schema": schema})
    yield basic.app
    basic.app.close()


def _task_rows(schema: str, task_id: str) -> int:
    with psycopg.connect(POSTGRES_URL) as db:
        return int(db.execute(f"SELECT count(*) FROM \"{schema}\".kombu_message "
                              f"WHERE payload::jsonb -> 'headers' ->> 'id' = %s", (task_id,)).fetchone()[0])


def _orders(schema: str, note: str) -> int:
    with psycopg.connect(POSTGRES_URL) as db:
        query = f'SELECT count(*) FROM "{schema}".orders WHERE note = %s'
        return int(db.execute(query, (note,)).fetchone()[0])


def _ran_once(worker, proof: Path, value: str, task_id: str) -> None:
    wait_for(lambda: f"{task_id}] succeeded" in worker.log(), timeout=20, message=f"task {task_id} to run")
    time.sleep(0.5)  # room for a second run, if there were one
    assert basic.lines(proof) == [value]


def test_a_rollback_of_a_psycopg_transaction_leaves_no_task_and_a_commit_runs_it_once(
        worker, client, schema: str, tmp_path: Path) -> None:
    proof = tmp_path / "ran"
    with psycopg.connect(POSTGRES_URL) as conn:
        with pytest.raises(ZeroDivisionError), conn.transaction():
            conn.execute(f'INSERT INTO "{schema}".orders (note) VALUES (%s)', ("lost",))
            with enqueue_in(conn):
                lost = basic.record.delay(str(proof), "lost")
            1 / 0  # noqa: B018 - the application fails before its commit
        assert _task_rows(schema, lost.id) == 0 and _orders(schema, "lost") == 0
        with conn.transaction():
            conn.execute(f'INSERT INTO "{schema}".orders (note) VALUES (%s)', ("kept",))
            with enqueue_in(conn):
                kept = basic.record.delay(str(proof), "kept")
            time.sleep(1.5)  # past a fallback poll: uncommitted, the task is nobody's to take
            assert f"{kept.id}] received" not in worker.log()
    assert _orders(schema, "kept") == 1
    _ran_once(worker, proof, "kept", kept.id)
    assert lost.id not in worker.log()


def test_sqlalchemy_connections_and_sessions_enlist_the_same_way(worker, client, schema: str,
                                                                 tmp_path: Path) -> None:
    from sqlalchemy import create_engine, text
    from sqlalchemy.orm import Session

    proof = tmp_path / "ran"
    engine = create_engine(POSTGRES_URL.replace("postgresql://", "postgresql+psycopg://"))
    try:
        connection = engine.connect()
        with connection.begin() as transaction:
            connection.execute(text(f'INSERT INTO "{schema}".orders (note) VALUES (:n)'), {"n": "core-lost"})
            with enqueue_in(connection):
                lost = basic.record.delay(str(proof), "core-lost")
            transaction.rollback()
        connection.close()
        with Session(engine) as session, session.begin():
            session.execute(text(f'INSERT INTO "{schema}".orders (note) VALUES (:n)'), {"n": "orm-kept"})
            with enqueue_in(session):
                kept = basic.record.delay(str(proof), "orm-kept")
        assert _task_rows(schema, lost.id) == 0 and _orders(schema, "core-lost") == 0
        assert _orders(schema, "orm-kept") == 1
        _ran_once(worker, proof, "orm-kept", kept.id)
    finally:
        engine.dispose()


@pytest.mark.parametrize("outcome", ["rollback", "commit"])
def test_a_django_transaction_enlists_the_task(worker, client, schema: str, tmp_path: Path,
                                               outcome: str) -> None:
    proof = tmp_path / "ran"
    value = f"django-{outcome}"
    out = subprocess.run([sys.executable, str(TESTS / "apps" / "pg_django.py"), outcome, str(proof), value],
                         capture_output=True, text=True, cwd=TESTS, timeout=60,
                         env=dict(os.environ, PYTHONPATH=str(TESTS), PG_SCHEMA=schema))
    assert out.returncode == 0, out.stderr
    task_id = out.stdout.split()[-1]
    if outcome == "rollback":
        assert _task_rows(schema, task_id) == 0 and _orders(schema, value) == 0
    else:
        assert _orders(schema, value) == 1
        _ran_once(worker, proof, value, task_id)


def test_a_connection_of_another_kind_is_refused_naming_what_is_taken() -> None:
    refused = "takes the application's PostgreSQL connection on psycopg 3"
    with pytest.raises(ConfigurationError, match=refused), enqueue_in(object()):
        pass


def test_a_connection_to_another_database_fails_the_send_naming_the_schema(client, schema: str) -> None:
    refused = f"the tables of schema '{schema}' are"
    with psycopg.connect(POSTGRES_URL.rsplit("/", 1)[0] + "/postgres") as elsewhere, \
            pytest.raises(TransportError, match=refused), enqueue_in(elsewhere):
        basic.add.delay(1, 2)
