"""Celery's clients and workers on the same PostgreSQL: a Celery client on kombu's
``sqla+postgresql://`` transport and Celery's ``db+postgresql://`` results feeds this worker (the
tables kombu and Celery made first are migrated in place), and this project's client feeds a
Celery worker on kombu's transport, reading what Celery's database backend stored."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from apps import basic
from conftest import require_server
from postgres import POSTGRES_URL, drop_schema, schema_name
from workers import TESTS

from worker_transport_postgres.schema import LATEST, Names, versions


@pytest.fixture
def schema() -> Iterator[str]:
    require_server(5432, "PostgreSQL")
    name = schema_name("worker_celery")
    with psycopg.connect(POSTGRES_URL, autocommit=True) as db:
        db.execute(f'CREATE SCHEMA "{name}"')  # (kombu and Celery make tables, not schemas)
    yield name
    drop_schema(POSTGRES_URL, name)


def celery_urls(schema: str) -> tuple[str, str]:
    """Celery's broker and result URLs for the same database and schema (SQLAlchemy passes the
    query to psycopg, which gives the session that search_path)."""
    where = f"postgres@127.0.0.1:5432/test?options=-csearch_path%3D{schema}"
    return f"sqla+postgresql+psycopg://{where}", f"db+postgresql+psycopg://{where}"


def our_environment(schema: str) -> dict[str, str]:
    return {"PYTHONPATH": str(TESTS), "WORKER_BROKER_TRANSPORT_OPTIONS": json.dumps({"schema": schema}),
            "WORKER_RESULT_BACKEND_TRANSPORT_OPTIONS": json.dumps({"schema": schema})}


def test_a_celery_client_on_kombus_sqlalchemy_transport_feeds_our_worker(workers, schema: str) -> None:
    from celery import Celery

    broker, backend = celery_urls(schema)
    client = Celery("pg-client", broker=broker, backend=backend)
    client.conf.update(broker_connection_retry_on_startup=True)
    try:
        early = client.send_task("apps.basic.add", (20, 22))  # kombu and Celery create their tables
        with psycopg.connect(POSTGRES_URL) as db:
            assert versions(db, Names(schema))["broker"] == 0  # kombu's own tables, not ours yet
        workers.start(pool="threads", broker=broker, backend=backend, env=our_environment(schema))
        assert early.get(timeout=30) == 42
        with psycopg.connect(POSTGRES_URL) as db:
            assert versions(db, Names(schema)) == LATEST
        assert client.send_task("apps.basic.add", (1, 2), countdown=1).get(timeout=30) == 3
        assert client.send_task("apps.basic.add", (2, 2), priority=7).get(timeout=30) == 4
        with pytest.raises(Exception) as caught:
            client.send_task("apps.basic.boom", ("from celery",)).get(timeout=30)
        assert type(caught.value).__name__ == "Boom" and "from celery" in str(caught.value)
    finally:
        client.close()


def test_our_client_feeds_a_celery_worker_on_kombus_sqlalchemy_transport(workers, schema: str,
                                                                         tmp_path: Path) -> None:
    broker, backend = celery_urls(schema)
    workers.start_celery(broker=broker, backend=backend)
    basic.app.conf.update(broker_url=POSTGRES_URL, result_backend=POSTGRES_URL,
                          broker_transport_options={"schema": schema},
                          result_backend_transport_options={"schema": schema})
    try:
        started = time.monotonic()
        assert basic.add.delay(5, 6).get(timeout=30) == 11  # kombu polls once a second
        proof = tmp_path / "ran"
        results = [basic.record.delay(str(proof), n) for n in range(5)]
        assert sorted(result.get(timeout=30) for result in results) == [0, 1, 2, 3, 4]
        # (apps.celery_basic's record ends each value with a backslash and an n)
        assert sorted(map(int, filter(None, proof.read_text().split("\\n")))) == [0, 1, 2, 3, 4]
        assert time.monotonic() - started < 60
    finally:
        basic.app.close()


def test_celery_reads_what_our_worker_stores_in_its_database_layout(workers, schema: str) -> None:
    from celery import Celery

    broker, backend = celery_urls(schema)
    workers.start(pool="threads", broker=POSTGRES_URL, backend=POSTGRES_URL, env=our_environment(schema))
    basic.app.conf.update(broker_url=POSTGRES_URL, result_backend=POSTGRES_URL,
                          broker_transport_options={"schema": schema},
                          result_backend_transport_options={"schema": schema})
    reader = Celery("pg-reader", broker=broker, backend=backend)
    try:
        done = basic.add.delay(7, 8)
        failed = basic.boom.delay("stored here")
        assert done.get(timeout=30) == 15
        with pytest.raises(basic.Boom):
            failed.get(timeout=30)
        assert reader.AsyncResult(done.id).get(timeout=10) == 15
        seen = reader.AsyncResult(failed.id)
        assert seen.state == "FAILURE"
        assert type(seen.result).__name__ == "Boom" and "stored here" in str(seen.result)
        assert reader.AsyncResult(str(uuid.uuid4())).state == "PENDING"
    finally:
        reader.close()
        basic.app.close()
