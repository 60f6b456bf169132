"""``workerctl postgres``: a plugin's own command, found through the ``worker.commands`` entry
points, migrating and reporting on the tables in a schema of the test's own."""

from __future__ import annotations

import json
import subprocess
import sys

import psycopg
import pytest
from conftest import require_server
from postgres import POSTGRES_URL, temporary_schema

from worker_transport_postgres.schema import LATEST


def workerctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "worker_core", *args], capture_output=True, text=True,
                          timeout=60)


@pytest.fixture
def schema():
    require_server(5432, "PostgreSQL")
    with temporary_schema() as name:
        yield name


def test_migrate_creates_the_tables_once_and_status_reports_them(schema: str) -> None:
    first = workerctl("postgres", "migrate", POSTGRES_URL, "--schema", schema)
    assert first.returncode == 0, first.stderr
    assert f"broker tables in schema {schema}: migrated from 0 to version {LATEST['broker']}" in first.stdout
    again = workerctl("postgres", "migrate", POSTGRES_URL, "--schema", schema)
    assert f"broker tables in schema {schema}: already at version {LATEST['broker']}" in again.stdout
    with psycopg.connect(POSTGRES_URL, autocommit=True) as db:
        db.execute(f'INSERT INTO "{schema}".kombu_queue (name) VALUES (%s)', ("emails",))
    out = workerctl("postgres", "status", POSTGRES_URL, "--schema", schema, "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["versions"] == LATEST
    assert report["queues"] == {"emails": {"ready": 0, "delayed": 0, "taken": 0}}
    assert {"kombu_message", "celery_taskmeta"} <= set(report["tables"])


def test_tables_of_a_newer_version_are_refused_naming_the_upgrade(schema: str) -> None:
    assert workerctl("postgres", "migrate", POSTGRES_URL, "--schema", schema).returncode == 0
    with psycopg.connect(POSTGRES_URL, autocommit=True) as db:
        db.execute(f"UPDATE \"{schema}\".worker_schema SET version = 99 WHERE part = 'broker'")
    out = workerctl("postgres", "migrate", POSTGRES_URL, "--schema", schema)
    assert out.returncode == 1
    assert "are at version 99, newer than this worker-transport-postgres knows" in out.stderr
    assert "pip install ./plugins/transport_postgres" in out.stderr


def test_a_bad_schema_name_is_refused_with_an_example() -> None:
    out = workerctl("postgres", "migrate", POSTGRES_URL, "--schema", "no;pe")
    assert out.returncode == 2
    assert "must be a plain PostgreSQL identifier" in out.stderr
