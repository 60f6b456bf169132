"""A small Django project with Celery (settings under ``CELERY_``, ``app.autodiscover_tasks()``,
a task using the ORM against the PostgreSQL on 127.0.0.1:5432) under ``workerctl worker -A
djproj``, unchanged."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REDIS_PORT, empty_redis, redis_db, require_server

pytestmark = pytest.mark.timeout(120)

TESTS = Path(__file__).resolve().parent
TABLE = "worker_celery_djproj_note"


@pytest.fixture
def database() -> str:
    """The ``test`` database with the project's table, migrated by Django and emptied."""
    require_server(5432, "PostgreSQL")
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="apps.djproj.settings")
    migrated = subprocess.run([sys.executable, "-m", "django", "migrate", "notes"], cwd=TESTS, env=env,
                              capture_output=True, text=True, timeout=60)
    assert migrated.returncode == 0, migrated.stderr
    import psycopg

    with psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=test", autocommit=True) as connection:
        connection.execute(f"DELETE FROM {TABLE}")
    return "test"


def test_a_django_project_runs_with_its_orm_tasks_autodiscovered(database, workers):
    require_server(REDIS_PORT, "Redis")
    from celery import Celery

    broker, results = empty_redis(redis_db(3)), empty_redis(redis_db(4))
    worker = workers.start(app="apps.djproj", pool="prefork",
                           env={"CELERY_BROKER_URL": broker, "CELERY_RESULT_BACKEND": results})
    log = worker.log()
    assert ". apps.djproj.notes.tasks.add_note" in log  # found by autodiscover_tasks
    assert "concurrency 2" in log  # CELERY_WORKER_CONCURRENCY, read through the CELERY_ namespace
    client = Celery("django-client", broker=broker, backend=results)
    try:
        assert client.send_task("apps.djproj.notes.tasks.add_note", ("first",)).get(timeout=20) == 1
        assert client.send_task("apps.djproj.notes.tasks.add_note", ("second",)).get(timeout=20) == 2
        seen = client.send_task("apps.djproj.notes.tasks.notes").get(timeout=20)
    finally:
        client.close()
    assert seen == {"texts": ["first", "second"], "vendor": "postgresql"}
    import psycopg

    with psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=test") as connection:
        rows = connection.execute(f"SELECT text, pid FROM {TABLE} ORDER BY id").fetchall()
    assert [text for text, _ in rows] == ["first", "second"]
    assert worker.pid not in {pid for _, pid in rows}  # written from the pool's children
