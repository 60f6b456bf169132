"""Results expire on the PostgreSQL backend as ``result_expires`` says: a result, a saved group and
a chord's counters older than that are not read, and are deleted by the backend's clean-up
(``cleanup()``, which every process storing results runs at its first store and then once a
minute at most), while younger ones stay, in a schema of this module's own."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from apps import basic
from conftest import require_server
from postgres import POSTGRES_URL, drop_schema, schema_name
from workers import TESTS, wait_for

from worker_core.app.settings import Settings
from worker_transport_postgres import PostgresBackend
from worker_transport_postgres.schema import Names


@pytest.fixture(scope="module")
def schema() -> Iterator[str]:
    require_server(5432, "PostgreSQL")
    name = schema_name("worker_expiry")
    yield name
    drop_schema(POSTGRES_URL, name)


def backend_for(schema: str, expires: float) -> PostgresBackend:
    return PostgresBackend(POSTGRES_URL, Settings(result_expires=expires,
                                                  result_backend_transport_options={"schema": schema}))


def counts(schema: str, task_id: str, group_id: str, chord_id: str) -> tuple[int, int, int, int]:
    """The rows of a result, a saved group and a chord (its row and its parts)."""
    import psycopg

    n = Names(schema)
    with psycopg.connect(POSTGRES_URL) as db:
        return tuple(db.execute(sql, (key,)).fetchone()[0] for sql, key in (
            (f"SELECT count(*) FROM {n.taskmeta} WHERE task_id = %s", task_id),
            (f"SELECT count(*) FROM {n.tasksetmeta} WHERE taskset_id = %s", group_id),
            (f"SELECT count(*) FROM {n.chords} WHERE group_id = %s", chord_id),
            (f"SELECT count(*) FROM {n.chord_parts} WHERE group_id = %s", chord_id),
        ))


def store_each_kind(backend: PostgresBackend) -> tuple[str, str, str]:
    task_id, group_id, chord_id = (str(uuid.uuid4()) for _ in range(3))
    backend.store_result(task_id, 42, "SUCCESS")
    backend.save_group(group_id, [[group_id, None], [[[task_id, None], None]]])
    backend.set_chord_size(chord_id, 2)
    backend.count_chord_part(chord_id, task_id, 0, "SUCCESS", 42, claim_seconds=10)
    return task_id, group_id, chord_id


def age(schema: str, task_id: str, group_id: str, chord_id: str, seconds: float) -> None:
    """Make these rows ``seconds`` older, as if stored that long ago."""
    import psycopg

    n, by = Names(schema), f"{float(seconds)!r} * interval '1 second'"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as db:
        db.execute(f"UPDATE {n.taskmeta} SET date_done = date_done - {by} WHERE task_id = %s", (task_id,))
        db.execute(f"UPDATE {n.tasksetmeta} SET date_done = date_done - {by} WHERE taskset_id = %s",
                   (group_id,))
        db.execute(f"UPDATE {n.chords} SET expires_at = expires_at - {by} WHERE group_id = %s", (chord_id,))


def test_a_result_past_result_expires_is_read_as_pending_from_then_on(schema: str) -> None:
    backend = backend_for(schema, expires=2)
    try:
        task_id = str(uuid.uuid4())
        backend.get_task_meta(task_id)  # the tables made first (a migration may take a second)
        backend.store_result(task_id, 42, "SUCCESS")
        assert backend.get_task_meta(task_id)["result"] == 42
        wait_for(lambda: backend.get_task_meta(task_id)["status"] == "PENDING", timeout=15,
                 message="the result to expire after two seconds")
    finally:
        backend.close()


def test_the_cleanup_deletes_expired_results_groups_and_chords_and_keeps_the_younger_ones(
        schema: str) -> None:
    backend = backend_for(schema, expires=600)
    try:
        old, young = store_each_kind(backend), store_each_kind(backend)
        age(schema, *old, seconds=601)
        assert counts(schema, *old) == (1, 1, 1, 1)  # expired, not yet deleted ...
        assert backend.get_task_meta(old[0])["status"] == "PENDING"  # ... and not read
        assert backend.restore_group(old[1]) is None
        backend.cleanup()
        assert counts(schema, *old) == (0, 0, 0, 0)
        assert counts(schema, *young) == (1, 1, 1, 1)
        assert backend.get_task_meta(young[0])["result"] == 42
        assert backend.restore_group(young[1]) == [[young[1], None], [[[young[0], None], None]]]
        assert backend.chord_parts(young[2]) == [(young[0], "SUCCESS", 42)]
    finally:
        backend.close()


def test_a_worker_deletes_expired_results_by_itself_when_it_stores_one(workers, schema: str) -> None:
    writer = backend_for(schema, expires=600)
    try:
        old, young = store_each_kind(writer), store_each_kind(writer)
    finally:
        writer.close()
    age(schema, *old, seconds=601)
    basic.app.conf.update(broker_url=POSTGRES_URL, result_backend=POSTGRES_URL, result_expires=600,
                          broker_transport_options={"schema": schema},
                          result_backend_transport_options={"schema": schema})
    try:
        options = json.dumps({"schema": schema})
        workers.start(pool="threads", broker=POSTGRES_URL, backend=POSTGRES_URL,
                      env={"PYTHONPATH": str(TESTS), "WORKER_RESULT_EXPIRES": "600",
                           "WORKER_BROKER_TRANSPORT_OPTIONS": options,
                           "WORKER_RESULT_BACKEND_TRANSPORT_OPTIONS": options})
        assert basic.add.delay(2, 3).get(timeout=30) == 5  # its first store prunes
        wait_for(lambda: counts(schema, *old) == (0, 0, 0, 0), timeout=10,
                 message="the worker to delete the expired rows")
        assert counts(schema, *young) == (1, 1, 1, 1)
    finally:
        basic.app.close()
