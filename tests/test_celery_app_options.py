"""A Celery app is never refused for one task: a task whose options this worker once refused (a
soft time limit past the hard one) is named at start in one warning line and handled as Celery's
prefork pool handles it, a misspelt setting gets one warning with the closest name, and the app's
other tasks run."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from conftest import REDIS_PORT, WorkerFactory, empty_redis, redis_db, require_server

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    require_server(REDIS_PORT, "Redis")
    broker, results = empty_redis(redis_db(6)), empty_redis(redis_db(7))
    factory = WorkerFactory(tmp_path_factory.mktemp("odd"))
    yield factory.start("-c", "2", app="apps.celery_odd", pool="prefork",
                        env={"CELERY_BROKER_URL": broker, "CELERY_RESULT_BACKEND": results})
    factory.cleanup()


@pytest.fixture
def client(worker: Any) -> Iterator[Any]:
    from celery import Celery

    app = Celery("odd-client", broker=redis_db(6), backend=redis_db(7))
    yield app
    app.close()


def test_the_app_starts_with_one_warning_line_for_the_task_and_one_for_the_setting(worker):
    worker.wait_log("WARNING/MainProcess] Celery task odd.limits: soft_time_limit (2s) is not shorter than "
                    "time_limit (1s): as under celery worker, the soft limit is signalled at 2s and the task "
                    "is killed right after it (TimeLimitExceeded); set soft_time_limit below time_limit")
    worker.wait_log("WARNING/MainProcess] Celery setting worker_concurency: no such setting, it is ignored "
                    "(celery worker ignores it too). Did you mean 'worker_concurrency'?")


def test_the_other_tasks_run(client):
    assert client.send_task("odd.add", (2, 3)).get(timeout=20) == 5


def test_the_task_runs_past_its_hard_limit_until_its_soft_one_as_under_celery(worker, client):
    # Celery's prefork pool measured: a 1.5 s run succeeds; a longer one is signalled at 2 s, then
    # killed at once, and fails with the hard limit
    assert client.send_task("odd.limits", (1.5,)).get(timeout=20) == "slept"
    failed = client.send_task("odd.limits", (10,))
    with pytest.raises(Exception) as raised:
        failed.get(timeout=20)
    assert type(raised.value).__name__ == "TimeLimitExceeded"
    worker.wait_log(f"Soft time limit (2s) exceeded for odd.limits[{failed.id}]")
    worker.wait_log(f"Hard time limit (1s) exceeded for odd.limits[{failed.id}]")
