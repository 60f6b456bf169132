"""A Django project whose tasks are Django's own (``@task``, ``enqueue``, ``TaskResult``) on
worker_django's backend, against the PostgreSQL on 127.0.0.1:5432 (a schema of this module's own):
tasks enqueued from views and from ``manage.py shell``, run by ``manage.py worker`` on prefork and
by ``workerctl worker -A site_tasks.settings`` on threads, their results read back in another
process. Runs on Django 5.2 with the django-tasks backport (the main virtualenv) and on Django 6
(``make test-django6``: the virtualenv of Python 3.12)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REDIS_PORT, empty_redis, redis_db, require_server
from postgres import POSTGRES_URL, drop_schema, schema_name
from workers import TESTS, WorkerProcess, wait_for

pytestmark = pytest.mark.timeout(180)

PROJECT = Path(__file__).resolve().parent / "django_project"


def environment(schema: str, broker: str, **more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DJTASKS_")}
    env.update(DJTASKS_SCHEMA=schema, DJTASKS_BROKER=broker, PYTHONPATH=str(PROJECT), **more)
    return env


def manage(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=PROJECT, env=env, capture_output=True,
                          text=True, timeout=90)
    if check:
        assert done.returncode == 0, done.stdout + done.stderr
    return done


def shell(env: dict[str, str], code: str) -> object:
    """Run ``code`` in ``manage.py shell`` and return the JSON it printed last."""
    out = manage(env, "shell", "-c", code).stdout.strip().splitlines()
    return json.loads(out[-1])


@pytest.fixture(scope="module")
def schema() -> Iterator[str]:
    require_server(5432, "PostgreSQL")
    name = schema_name("worker_django")
    import psycopg

    with psycopg.connect(POSTGRES_URL, autocommit=True) as connection:
        connection.execute(f'CREATE SCHEMA "{name}"')
    try:
        manage(environment(name, "embedded://"), "migrate", "--run-syncdb")
        yield name
    finally:
        drop_schema(POSTGRES_URL, name)


@pytest.fixture(scope="module")
def brokers() -> tuple[str, str]:
    require_server(REDIS_PORT, "Redis")
    return empty_redis(redis_db(5)), empty_redis(redis_db(6))


def start(tmp_path: Path, command: list[str], env: dict[str, str]) -> WorkerProcess:
    name = f"django-{uuid.uuid4().hex[:8]}@localhost"
    worker = WorkerProcess([*command, "-n", name, "-l", "INFO"], env, tmp_path / f"{name}.log", cwd=PROJECT)
    try:
        return worker.wait_ready(timeout=60)
    except BaseException:
        worker.kill()
        raise


class ManagePyWorker(WorkerProcess):
    """``python manage.py worker ...``: the project's own command."""

    program = ("manage.py", "worker")


@pytest.fixture(scope="module")
def prefork(schema: str, brokers: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[
        tuple[WorkerProcess, dict[str, str]]]:
    """``manage.py worker -P prefork -c 2`` on the first broker."""
    env = environment(schema, brokers[0])
    name = f"django-prefork-{uuid.uuid4().hex[:8]}@localhost"
    worker = ManagePyWorker(["-P", "prefork", "-c", "2", "-Q", "default", "-n", name, "-l", "INFO"], env,
                            tmp_path_factory.mktemp("prefork") / "worker.log", cwd=PROJECT)
    try:
        worker.wait_ready(timeout=60)
        yield worker, env
    finally:
        worker.kill()


@pytest.fixture(scope="module")
def threads(schema: str, brokers: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[
        tuple[WorkerProcess, dict[str, str]]]:
    """``workerctl worker -A site_tasks.settings -P threads -c 4`` on the second broker."""
    env = environment(schema, brokers[1])
    command = ["-A", "site_tasks.settings", "-P", "threads", "-c", "4", "-Q", "default"]
    worker = start(tmp_path_factory.mktemp("threads"), command, env)
    try:
        yield worker, env
    finally:
        worker.kill()


WAIT = f"""
import json, sys
sys.path.insert(0, {str(TESTS)!r})
from workers import wait_for
""" + """
def finished(result, timeout=30):
    def done():
        result.refresh()
        return result.is_finished
    wait_for(done, timeout, interval=0.05, message=lambda: f"{result.id} to finish (it is {result.status})")
    return result
def shown(result):
    return {"status": result.status, "value": result.return_value if result.status == "SUCCESSFUL" else None,
            "attempts": result.attempts, "worker_ids": result.worker_ids, "args": result.args,
            "errors": [[e.exception_class_path, e.traceback] for e in result.errors],
            "enqueued_at": str(result.enqueued_at), "started_at": str(result.started_at),
            "finished_at": str(result.finished_at), "last_attempted_at": str(result.last_attempted_at),
            "ordered": result.enqueued_at <= result.started_at <= result.finished_at, "id": result.id}
"""


def test_a_task_enqueued_from_the_shell_runs_on_prefork_and_its_result_is_read_in_another_process(prefork):
    worker, env = prefork
    task_id = shell(env, "import json\nfrom notes.tasks import add\nr = add.enqueue(2, 3)\n"
                         "print(json.dumps(r.id))")
    seen = shell(env, WAIT + "from notes.tasks import add\n"
                             f"print(json.dumps(shown(finished(add.get_result({task_id!r})))))")
    assert seen["status"] == "SUCCESSFUL" and seen["value"] == 5 and seen["args"] == [2, 3]
    assert seen["attempts"] == 1 and seen["worker_ids"] == [worker.name] and seen["errors"] == []
    assert seen["ordered"] and seen["last_attempted_at"] == seen["started_at"]
    assert "notes.tasks.add" in worker.log()  # found in the installed app's tasks module at start


def test_a_failing_task_keeps_its_exception_and_traceback(prefork):
    _, env = prefork
    seen = shell(env, WAIT + "from notes.tasks import fail\n"
                             "print(json.dumps(shown(finished(fail.enqueue('boom')))))")
    assert seen["status"] == "FAILED" and seen["value"] is None
    [(path, traceback)] = seen["errors"]
    assert path == "builtins.ValueError"
    assert traceback.startswith("Traceback (most recent call last):")
    assert traceback.endswith("ValueError: boom\n")
    assert 'notes/tasks.py", line' in traceback


def test_takes_context_async_tasks_and_the_orm_inside_the_worker(prefork):
    worker, env = prefork
    seen = shell(env, WAIT + """
from notes.tasks import whoami, add_async, write_note
from notes.models import Note
w, a, n = whoami.enqueue(), add_async.enqueue(4, 5), write_note.enqueue("written by a task")
finished(w), finished(a), finished(n)
note = Note.objects.get(pk=n.return_value)
print(json.dumps({"context": w.return_value, "id": w.id, "async": a.return_value, "text": note.text,
                  "pid": note.pid}))
""")
    assert seen["context"] == {"id": seen["id"], "attempt": 1}
    assert seen["async"] == 9
    assert seen["text"] == "written by a task" and seen["pid"] != worker.pid  # a prefork child wrote it


def test_a_task_enqueued_from_a_view_runs_on_threads_and_an_async_view_awaits_its_result(threads):
    worker, env = threads
    seen = shell(env, WAIT + """
import asyncio
from django.test import AsyncClient, Client
from notes.tasks import add
sent = Client().get("/add/?x=20&y=22").json()
waited = asyncio.run(AsyncClient().get("/add-and-wait/?x=1&y=2")).json()
print(json.dumps({"sent": sent, "ran": shown(finished(add.get_result(sent["id"]))), "waited": waited}))
""")
    assert seen["sent"]["status"] == "READY"
    assert seen["ran"]["value"] == 42 and seen["ran"]["worker_ids"] == [worker.name]
    assert seen["waited"]["status"] == "SUCCESSFUL" and seen["waited"]["value"] == 3


def test_run_after_holds_the_task_until_its_time(threads):
    _, env = threads
    seen = shell(env, WAIT + """
from datetime import timedelta
from django.utils import timezone
from notes.tasks import add
after = timezone.now() + timedelta(seconds=2)
result = add.using(run_after=after).enqueue(1, 1)
ready = add.get_result(result.id).status
done = finished(result)
print(json.dumps({"ready": ready, "early": (after - done.started_at).total_seconds(),
                  "task_run_after": str(done.task.run_after), "after": str(after)}))
""")
    assert seen["ready"] == "READY"
    # held for 2 s: the worker holds an ETA by the broker's clock, which it reads over the network
    # (here the same machine's clock, known to within half that read's round trip)
    assert seen["early"] <= 0.1, seen
    assert seen["task_run_after"] == seen["after"]


def test_the_higher_priority_runs_first(schema, brokers, tmp_path):
    """Six tasks wait on the queue ``low`` before its only worker (one process, one message at a
    time) starts: the three of priority 100 run before the three of -100, each three in order."""
    env = environment(schema, empty_redis(redis_db(7)))
    shell(env, """
import json
from notes.tasks import log_order
from notes.models import Note
Note.objects.filter(text__startswith="priority ").delete()
for n in range(3):
    log_order.using(queue_name="low", priority=-100).enqueue(f"priority low {n}")
for n in range(3):
    log_order.using(queue_name="low", priority=100).enqueue(f"priority high {n}")
print(json.dumps(None))
""")
    worker = start(tmp_path, ["-A", "site_tasks.settings", "-P", "solo", "-Q", "low",
                              "--prefetch-multiplier", "1"], env)
    try:
        code = ("import json\nfrom notes.models import Note\nprint(json.dumps(list(Note.objects.filter("
                "text__startswith='priority ').order_by('id').values_list('text', flat=True))))")
        wait_for(lambda: len(shell(env, code)) == 6, timeout=60, interval=0.5)
        expected = [f"priority high {n}" for n in range(3)] + [f"priority low {n}" for n in range(3)]
        assert shell(env, code) == expected
    finally:
        worker.kill()


def test_a_view_enqueues_after_its_transaction_commits_and_not_after_a_rollback(threads):
    _, env = threads
    seen = shell(env, WAIT + """
from django.test import Client
from notes.models import Note
from notes.tasks import write_note
committed = Client().get("/order/?text=committed").json()
rolled = Client().get("/order/?text=rolled&fail=1").json()
[task_id] = committed["ids"]
done = finished(write_note.get_result(task_id))
print(json.dumps({"rolled": rolled["ids"], "note": Note.objects.get(pk=done.return_value).text,
                  "rows": sorted(Note.objects.filter(text__in=["committed", "rolled"])
                                 .values_list("text", flat=True))}))
""")
    assert seen["rolled"] == []
    assert seen["note"] == "committed (task)"
    assert seen["rows"] == ["committed"]


def test_with_the_postgresql_transport_a_task_is_enqueued_inside_the_transaction(schema, tmp_path):
    """``enqueue_in(connection)`` writes the message in the view's own transaction: a rollback
    leaves no task; the commit sends it."""
    broker_schema = schema_name("worker_django_broker")
    env = environment(schema, POSTGRES_URL, DJTASKS_TRANSPORT_OPTIONS=json.dumps({"schema": broker_schema}))
    try:
        worker = start(tmp_path, ["-A", "django", "-P", "threads", "-c", "2", "-Q", "default"], env)
        try:
            seen = shell(env, WAIT + """
from django.db import connection, transaction
from notes.models import Note
from notes.tasks import write_note
from worker_transport_postgres import enqueue_in
class Rollback(Exception):
    pass
try:
    with transaction.atomic():
        with enqueue_in(connection):
            lost = write_note.enqueue("inside a rolled back transaction")
        raise Rollback()
except Rollback:
    pass
with transaction.atomic():
    with enqueue_in(connection):
        sent = write_note.enqueue("inside a committed transaction")
done = finished(sent)
kept = finished(write_note.enqueue("after both"))
lost.refresh()
print(json.dumps({"note": Note.objects.get(pk=done.return_value).text, "lost": lost.status,
                  "rows": sorted(Note.objects.filter(text__startswith="inside")
                                 .values_list("text", flat=True))}))
""")
        finally:
            worker.kill()
        assert seen["note"] == "inside a committed transaction"
        # the READY record is written before the transaction ends; its message went with the rollback
        assert seen["lost"] == "READY"
        assert seen["rows"] == ["inside a committed transaction"]
        assert "site_tasks.settings" in worker.log()  # -A django: the settings manage.py names
    finally:
        drop_schema(POSTGRES_URL, broker_schema)


@pytest.mark.parametrize(("more", "code", "words"), [
    ({"DJTASKS_BROKER": "sqs://localhost"}, "worker_django.E002", "sqs"),
    ({"DJTASKS_MORE_OPTIONS": '{"brokr_url": "redis://"}'}, "worker_django.E001", "broker_url"),
    ({"DJTASKS_QUEUES": '["default"]'}, "worker_django.E004", "Queue 'low' is not valid"),
    ({"DJTASKS_BROKER": "amqp://guest:guest@127.0.0.1:5672//"}, "worker_django.E004",
     "does not support setting priority"),
    ({"DJTASKS_QUEUES": "[]"}, "worker_django.W001", "QUEUES is empty"),
    ({"DJTASKS_BROKER": "amqp://guest:guest@127.0.0.1:5672//",
      "DJTASKS_MORE_OPTIONS": '{"task_queue_max_priority": 10}'}, "worker_django.W002", "get_result"),
], ids=["missing transport", "unknown setting", "unknown queue", "unsupported priority", "no queues",
        "no results"])
def test_manage_py_check_reports_what_the_backend_cannot_do(more, code, words):
    env = environment("public", more.pop("DJTASKS_BROKER", "embedded://"), **more)
    done = manage(env, "check", check=False)
    out = done.stdout + done.stderr
    assert code in out and words in out, out
    assert (done.returncode != 0) == (".E" in code), out


def test_a_worker_refuses_to_start_on_what_check_calls_an_error(schema, tmp_path):
    env = environment(schema, "embedded://", DJTASKS_QUEUES='["default"]')
    done = subprocess.run([sys.executable, "-m", "worker_core", "worker", "-A", "site_tasks.settings"],
                          cwd=PROJECT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "Queue 'low' is not valid for backend" in done.stderr and "Traceback" not in done.stderr
