"""Django's own tests of its task backends (``tests/tasks`` of the installed Django's source,
unpacked by ``make test-django6`` at DJANGO_SOURCE_TESTS) run against worker_django's backend:
``tests/django_suite/run.py`` runs them with Django's test runner, Django's ``ImmediateBackend``
replaced by worker_django's backend with a real worker running each task (prefork, on this
process's Redis) and ``DummyBackend`` by worker_django's backend on a broker no worker consumes
(see ``tests/django_suite/suite_backends.py``). Each of Django's tests is here: it passes, or it
is one of :data:`NOT_APPLY`, with the reason. Django 6 only (django.tasks); Django's code is
run where it was unpacked, never copied here."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REDIS_PORT, empty_redis, redis_db, require_server
from workers import WorkerProcess

if importlib.util.find_spec("django.tasks") is None:  # (tests/conftest.py leaves the module out then)
    pytest.skip("Django 6 only (django.tasks): make test-django6 runs it", allow_module_level=True)

pytestmark = pytest.mark.timeout(300)

SUITE = Path(__file__).resolve().parent / "django_suite"
MODULES = ["tasks.test_immediate_backend", "tasks.test_dummy_backend", "tasks.test_tasks",
           "tasks.test_custom_backend"]

_IMMEDIATE = "tasks.test_immediate_backend.ImmediateBackendTestCase."
_DUMMY = "tasks.test_dummy_backend.DummyBackendTestCase."
#: Django's tests that do not apply to a real queueing backend (a test id, or the id of a module
#: or class ending in "."), each with the reason
NOT_APPLY = {
    "tasks.test_custom_backend.":
        "tests Django's base class with backends of the test's own: none is this one",
    _IMMEDIATE + "test_throws_keyboard_interrupt":
        "the immediate backend lets a KeyboardInterrupt raised by the task reach the enqueuing "
        "caller; here the task runs in the worker's process, which the caller's exceptions never reach",
    _IMMEDIATE + "test_cannot_get_result":
        "the immediate backend keeps no results; this one reads them back (the DummyBackend and "
        "TaskTestCase tests of get_result run on it)",
    _IMMEDIATE + "test_cannot_refresh_result": "as test_cannot_get_result: refresh() is supported here",
    _IMMEDIATE + "test_cannot_pass_run_after":
        "the immediate backend refuses run_after; this one supports it (supports_defer: the "
        "message's ETA, proven by tests/test_django_tasks.py)",
    _DUMMY + "test_refresh_result":
        "changes the dummy backend's in-memory TaskResult and expects refresh() to see it; here "
        "the result lives in the result backend (refresh() reading the worker's record is proven "
        "by the ImmediateBackend tests and tests/test_django_tasks.py)",
    _DUMMY + "test_refresh_result_async": "as test_refresh_result",
    _DUMMY + "test_check":
        "expects no check message for QUEUES = []; this backend warns (worker_django.W001) that a "
        "worker without -Q then consumes only the queue 'default'",
}


def not_applying(test_id: str) -> str | None:
    for key, reason in NOT_APPLY.items():
        if test_id == key or (key.endswith(".") and test_id.startswith(key)):
            return reason
    return None


def source_tests() -> Path:
    source = Path(os.environ.get("DJANGO_SOURCE_TESTS", "")).resolve() / "tasks"
    if not os.environ.get("DJANGO_SOURCE_TESTS") or not source.is_dir():
        pytest.fail("DJANGO_SOURCE_TESTS must name the tests/ of the installed Django's source "
                    "(make test-django6 unpacks it)")
    return source.parent


def runner(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SUITE / "run.py"), *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=240)


def environment(**more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUITE_")}
    env.update(PYTHONPATH=os.pathsep.join([str(source_tests()), str(SUITE)]), **more)
    return env


@pytest.fixture(scope="module")
def listed(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The ids of every test of Django's test modules of its task framework."""
    directory = tmp_path_factory.mktemp("listed")
    done = runner("--list", str(directory / "ids.json"), *MODULES, env=environment(), cwd=directory)
    assert done.returncode == 0, done.stdout + done.stderr
    return list(json.loads((directory / "ids.json").read_text()))


@pytest.fixture(scope="module")
def outcomes(listed: list[str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, list[str]]]:
    """Every test that applies, run once: {id: [outcome, detail]}."""
    require_server(REDIS_PORT, "Redis")
    directory = tmp_path_factory.mktemp("suite")
    env = environment(SUITE_RUN_BROKER=empty_redis(redis_db(8)), SUITE_QUEUE_BROKER=empty_redis(redis_db(9)),
                      SUITE_TASK_LOG=str(directory / "tasks.jsonl"), PYTHONUNBUFFERED="1")
    name = f"django-suite-{uuid.uuid4().hex[:8]}@localhost"
    command = ["-A", "suite_settings", "-P", "prefork", "-c", "2", "-Q", "default", "-n", name, "-l", "INFO"]
    worker = WorkerProcess(command, dict(env, SUITE_LOG_TASKS="1"), directory / "worker.log", cwd=directory)
    try:
        worker.wait_ready(timeout=60)
        done = runner(str(directory / "outcomes.json"), *[i for i in listed if not_applying(i) is None],
                      env=env, cwd=directory)
        found = directory / "outcomes.json"
        assert found.exists(), done.stdout + done.stderr + worker.log()
        yield json.loads(found.read_text())
    finally:
        worker.kill()


def test_django_s_task_tests_are_found_and_each_is_run_or_said_not_to_apply(listed):
    assert len(listed) > 50, listed  # (Django 6.0 has 80 of them)
    assert any(i.startswith(_IMMEDIATE) for i in listed) and any(i.startswith(_DUMMY) for i in listed)
    stale = [key for key in NOT_APPLY if not any(i == key or i.startswith(key) for i in listed)]
    assert stale == [], f"said not to apply, but not among Django's tests: {stale}"


def test_every_test_of_django_that_applies_passes_on_this_backend(listed, outcomes):
    ran = [i for i in listed if not_applying(i) is None]
    assert sorted(outcomes) == sorted(ran), "tests that did not report"
    print(f"{len(ran)} of Django's {len(listed)} task tests run here, {len(listed) - len(ran)} do not apply")
    failed = {i: outcome for i, outcome in outcomes.items() if outcome[0] != "passed"}
    assert failed == {}, "\n\n".join(f"{i}: {kind}\n{detail}" for i, (kind, detail) in failed.items())
