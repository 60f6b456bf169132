"""Bad configuration is refused before anything starts: exit status 2, one "Error: ..." line naming
the option or setting, the value received and how to fix it, no traceback, no process left
behind, and the message waiting in the queue still there.

Each case runs the real ``workerctl`` in a subprocess (they take a fraction of a second: nothing
starts), against an embedded queue holding one message.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
from conftest import FakeSite, redis_db
from workers import TESTS

from worker_core import App
from worker_core.app.broker import connection_for, transport_for
from worker_core.exceptions import ConfigurationError
from worker_core.options import parse_hostname

MARKER = "BAD_CONFIGURATION_RUN"
AMQP = "amqp://guest:guest@127.0.0.1:5672//"
REDIS = redis_db(13)


@attrs.frozen
class Run:
    code: int
    out: str
    err: str
    marker: str

    @property
    def errors(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.startswith("Error:")]


@pytest.fixture
def queue_url(tmp_path: Path) -> Iterator[str]:
    """An embedded queue with one task in it, which no refused command may take."""
    url = f"embedded://{tmp_path}/queue.db"
    app = App("probe", broker=url, result_backend="disabled")
    app.send_task("apps.basic.add", (1, 2))
    app.close()
    yield url
    assert _waiting(url) == 1


def _waiting(url: str) -> int:
    app = App("probe", broker=url, result_backend="disabled")
    with connection_for(app.plugins, url, app.settings) as connection:
        return int(transport_for(app.plugins, url, app.settings).queue_depth(connection, "celery"))


def _alive_with(marker: str) -> list[int]:
    """Processes whose environment holds ``marker`` (what the command started inherits it)."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if f"{MARKER}={marker}".encode() in environ.read_bytes():
                found.append(int(environ.parent.name))
        except OSError:
            continue
    return found


def workerctl(*args: str, env: Mapping[str, str] | None = None, path: Sequence[Path] = ()) -> Run:
    """Run ``workerctl`` with a clean ``WORKER_*`` environment plus ``env``, marked so that any
    process it leaves behind can be found."""
    marker = uuid.uuid4().hex
    environment = {key: value for key, value in os.environ.items() if not key.startswith("WORKER_")}
    environment.update(PYTHONPATH=os.pathsep.join([*map(str, path), str(TESTS)]), **(env or {}))
    environment[MARKER] = marker
    done = subprocess.run([sys.executable, "-m", "worker_core", *args], cwd=TESTS, env=environment,
                          capture_output=True, text=True, timeout=20)
    return Run(done.returncode, done.stdout, done.stderr, marker)


def assert_refused(run: Run, *expected: str, queue_url: str | None = None) -> None:
    """Exit status 2, exactly one ``Error:`` line holding every expected text, nothing else ran."""
    assert run.code == 2, (run.code, run.out, run.err)
    assert "Traceback" not in run.out + run.err, run.err
    assert len(run.errors) == 1, run.err
    for text in expected:
        assert text in run.errors[0], f"{text!r} not in {run.errors[0]!r}"
    assert "ready." not in run.out and "transport " not in run.out, run.out  # no banner: nothing started
    assert _alive_with(run.marker) == []
    if queue_url is not None:
        assert _waiting(queue_url) == 1


def worker(queue_url: str, *args: str, env: Mapping[str, str] | None = None) -> Run:
    return workerctl("worker", "-A", "apps.basic", *args, env={"WORKER_BROKER_URL": queue_url, **(env or {})})


# -- workerctl worker: option families ---------------------------------------------------------------


@pytest.mark.parametrize(("args", "expected"), [
    (["-P", "nope"], ["no pool named 'nope'", "-P/--pool", "Available: ", "prefork (worker-pool-prefork)"]),
    (["-P", "prefork", "-p", "no:prefork"],
     ["pool 'prefork'", "is blocked by -p no:prefork", "choose another pool"]),
    (["-P", "solo", "-c", "x"], ["--concurrency must be a whole number or auto", "(got 'x')"]),
    (["-P", "threads", "-c", "-3"], ["--concurrency must be 0 or more, or auto", "(got -3)"]),
])
def test_a_bad_pool_or_concurrency_is_refused(queue_url: str, args: list[str], expected: list[str]) -> None:
    assert_refused(worker(queue_url, *args), *expected, queue_url=queue_url)


@pytest.mark.parametrize(("args", "expected"), [
    (["-P", "threads", "--autoscale", "x"],
     ["--autoscale must be MAX[,MIN]", "for example 10,3", "(got 'x')"]),
    (["-P", "threads", "--autoscale", "0"], ["--autoscale MAX must be at least 1", "(got '0')"]),
    (["-P", "solo", "--autoscale", "4,1"], ["--autoscale needs a pool that can grow", "solo", "-P threads"]),
    (["-P", "threads", "--autoscale", "4,1", "--autoscaler", "nope"],
     ["no autoscaler named 'nope'", "default"]),
])
def test_a_bad_autoscale_is_refused(queue_url: str, args: list[str], expected: list[str]) -> None:
    assert_refused(worker(queue_url, *args), *expected, queue_url=queue_url)


@pytest.mark.parametrize(("args", "env", "expected"), [
    (["--prefetch-multiplier", "0"], {}, ["--prefetch-multiplier must be greater than 0", "(got 0)"]),
    (["--prefetch-multiplier", "x"], {}, ["'--prefetch-multiplier'", "'x' is not a valid integer"]),
    ([], {"WORKER_WORKER_PREFETCH_MULTIPLIER": "1.5"},
     ["WORKER_WORKER_PREFETCH_MULTIPLIER must be a whole number", "(got '1.5')"]),
    ([], {"WORKER_WORKER_PREFETCH_MULTIPLIER": "0"},
     ["WORKER_WORKER_PREFETCH_MULTIPLIER='0'", "'worker_prefetch_multiplier' must be at least 1"]),
])
def test_a_bad_prefetch_multiplier_is_refused(queue_url: str, args: list[str], env: dict[str, str],
                                              expected: list[str]) -> None:
    assert_refused(worker(queue_url, "-P", "solo", *args, env=env), *expected, queue_url=queue_url)


@pytest.mark.parametrize(("args", "expected"), [
    (["--loop", "foo"], ["--loop must be one of auto, async, sync", "(got 'foo')"]),
    (["--loop", "asnyc"], ["--loop must be one of", "(got 'asnyc')", "Did you mean 'async'?"]),
    (["--loop", "async"], ["--loop async needs a transport that supports it", "'embedded'", "--loop sync"]),
])
def test_a_bad_loop_is_refused(queue_url: str, args: list[str], expected: list[str]) -> None:
    assert_refused(worker(queue_url, "-P", "solo", *args), *expected, queue_url=queue_url)


@pytest.mark.parametrize(("args", "env", "expected"), [
    (["-Q", ","], {}, ["--queues must be comma-separated queue names", "-Q emails,reports", "(got ','"]),
    (["-Q", "a,,b"], {}, ["--queues must be comma-separated queue names", "(got 'a,,b'"]),
    ([], {"WORKER_TASK_DEFAULT_QUEUE": ""}, ["WORKER_TASK_DEFAULT_QUEUE=''", "'task_default_queue'"]),
])
def test_bad_queues_are_refused(queue_url: str, args: list[str], env: dict[str, str],
                                expected: list[str]) -> None:
    assert_refused(worker(queue_url, "-P", "solo", *args, env=env), *expected, queue_url=queue_url)


@pytest.mark.parametrize(("level", "expected"), [
    ("LOUD", ["--loglevel must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL", "(got 'LOUD')"]),
    ("WARN", ["(got 'WARN')", "Did you mean 'WARNING'?"]),
    ("", ["--loglevel must be one of", "(got '')"]),
])
def test_a_bad_loglevel_is_refused(queue_url: str, level: str, expected: list[str]) -> None:
    assert_refused(worker(queue_url, "-P", "solo", "-l", level), *expected, queue_url=queue_url)


@pytest.mark.parametrize(("args", "env", "expected"), [
    (["--time-limit", "-1"], {}, ["--time-limit must be greater than 0", "(got -1.0)"]),
    (["--time-limit", "abc"], {}, ["'--time-limit'", "'abc' is not a valid float"]),
    (["--time-limit", "nan"], {}, ["--time-limit must be a finite number", "(got nan)"]),
    (["--time-limit", "inf"], {}, ["--time-limit must be a finite number", "(got inf)", "leave it out"]),
    (["--soft-time-limit", "0"], {}, ["--soft-time-limit must be greater than 0", "(got 0.0)"]),
    (["--time-limit", "1", "--soft-time-limit", "2"], {},
     ["--soft-time-limit (2s) must be shorter than --time-limit (1s)"]),
    ([], {"WORKER_TASK_TIME_LIMIT": "-5"},
     ["WORKER_TASK_TIME_LIMIT='-5'", "'task_time_limit' must be at least 0"]),
    ([], {"WORKER_TASK_SOFT_TIME_LIMIT": "soon"},
     ["WORKER_TASK_SOFT_TIME_LIMIT must be a number", "(got 'soon')"]),
])
def test_bad_time_limits_are_refused(queue_url: str, args: list[str], env: dict[str, str],
                                     expected: list[str]) -> None:
    assert_refused(worker(queue_url, "-P", "solo", *args, env=env), *expected, queue_url=queue_url)


@pytest.mark.parametrize(("args", "env", "expected"), [
    (["--max-tasks-per-child", "0"], {}, ["--max-tasks-per-child must be greater than 0", "(got 0)"]),
    (["--max-tasks-per-child", "1.5"], {}, ["'--max-tasks-per-child'", "'1.5' is not a valid integer"]),
    (["--max-memory-per-child", "-5"], {}, ["--max-memory-per-child must be greater than 0", "(got -5)"]),
    ([], {"WORKER_WORKER_MAX_TASKS_PER_CHILD": "0"},
     ["WORKER_WORKER_MAX_TASKS_PER_CHILD='0'", "'worker_max_tasks_per_child' must be at least 1"]),
])
def test_bad_recycling_limits_are_refused(queue_url: str, args: list[str], env: dict[str, str],
                                          expected: list[str]) -> None:
    assert_refused(worker(queue_url, "-P", "prefork", *args, env=env), *expected, queue_url=queue_url)


@pytest.mark.parametrize(("args", "env", "expected"), [
    (["-O", "fast"], {}, ["-O must be one of fair, fcfs", "(got 'fast')"]),
    (["-O", "fiar"], {}, ["(got 'fiar')", "Did you mean 'fair'?"]),
    (["-p", "prefork"], {}, ["-p takes no:NAME to block a plugin", "(got 'prefork')", "-p no:prefork"]),
    (["-p", "no:"], {}, ["-p takes no:NAME", "(got 'no:')"]),
    (["-p", "no:thraeds"], {}, ["thraeds", "Did you mean 'threads'?"]),
    (["-p", "no:worker"], {}, ["'worker'", "essential"]),
    ([], {"WORKER_DISABLE_PLUGINS": "prefork"}, ["is blocked by WORKER_DISABLE_PLUGINS=prefork"]),
    ([], {"WORKER_DISABLE_PLUGINS": "solo,worker"}, ["'worker' cannot be blocked",
                                                      "remove it from WORKER_DISABLE_PLUGINS=solo,worker"]),
    (["-p", "no:prefork"], {}, ["is blocked by -p no:prefork"]),
    (["--child-scheduler", "fifo"], {}, ["Invalid value for '--child-scheduler': must be batch or normal",
                                         "(got 'fifo')"]),
])
def test_bad_scheduling_and_plugin_switches_are_refused(queue_url: str, args: list[str], env: dict[str, str],
                                                        expected: list[str]) -> None:
    assert_refused(worker(queue_url, "-P", "prefork", *args, env=env), *expected, queue_url=queue_url)


@pytest.mark.parametrize(("name", "expected"), [
    (" worker@host", ["--hostname must be a node name without surrounding spaces", "(got ' worker@host')"]),
    ("worker@%q", ["--hostname 'worker@%q' has an unknown placeholder '%q'", "%h (host name)"]),
])
def test_a_bad_node_name_is_refused(queue_url: str, name: str, expected: list[str]) -> None:
    assert_refused(worker(queue_url, "-P", "solo", "-n", name), *expected, queue_url=queue_url)


def test_a_node_name_expands_host_placeholders_as_celery_does() -> None:
    host = "box.example.com"
    assert parse_hostname("worker1@%h", host) == "worker1@box.example.com"
    assert parse_hostname("%n-%d@%h", host) == "box-example.com@box.example.com"
    assert parse_hostname("100%%@%n", host) == "100%@box"
    assert parse_hostname("w1", host) == "celery@w1"  # a name without @ is a host, as in Celery
    assert parse_hostname("w%i%I@%h", host) == "w0@box.example.com"  # the main process: 0 and nothing


# -- broker and result backend URLs -------------------------------------------------------------------


@pytest.mark.parametrize(("url", "expected"), [
    ("nope", ["broker URL 'nope' has no scheme", "redis://127.0.0.1:6379/0"]),
    ("foo://host", ["no transport named 'foo' is installed", "Available: amqp", "-b/--broker"]),
    ("redis://a:6379/0;amqp://b//", ["mixes transports (amqp, redis)", "failover servers of one kind"]),
    ("redis://127.0.0.1:6379/abc", ["broker URL 'redis://127.0.0.1:6379/abc' names database 'abc'",
                                    "the path must be the database number"]),
    ("redis://127.0.0.1:99999/0", ["broker URL 'redis://127.0.0.1:99999/0'", "for example redis://"]),
    ("rediss://a:6380/0;redis://b:6379/0", ["mixes transports (redis, rediss)"]),
    ("amqp://guest@127.0.0.1:99999//", ["broker URL 'amqp://guest@127.0.0.1:99999//' is malformed",
                                        "for example amqp://"]),
    ("embedded:///tmp/", ["embedded URL 'embedded:///tmp/' names the directory", "add a file name"]),
    ("embedded://queue.db?mode=x", ["has a query or fragment", "broker_transport_options"]),
    ("", ["-b/--broker needs a URL (got '')"]),
])
def test_a_bad_broker_url_is_refused(queue_url: str, url: str, expected: list[str]) -> None:
    assert_refused(worker(queue_url, "-P", "solo", "-b", url), *expected, queue_url=queue_url)


@pytest.mark.parametrize(("url", "options", "expected"), [
    (None, '{"visiblity_timeout": 3}', ["unknown broker transport option 'visiblity_timeout'",
                                        "embedded transport", "Did you mean 'visibility_timeout'?"]),
    (None, '{"polling_interval": -1}', ["broker transport option 'polling_interval' must be greater than 0",
                                        "(got -1)"]),
    (None, '{"interval_start": "x"}',
     ["broker_transport_options['interval_start'] must be a number of seconds", "(got 'x')"]),
    (None, "[1]", ["WORKER_BROKER_TRANSPORT_OPTIONS must be a JSON object", "(got a JSON list)"]),
    (REDIS, '{"visibility_timeout": "soon"}',
     ["broker transport option 'visibility_timeout' must be a number", "(got 'soon' that is a str)",
      "for example"]),
    (REDIS, '{"fetch_limit": 0}', ["'fetch_limit' must be a whole number, at least 1", "(got 0"]),
    (REDIS, '{"queue_order_strategy": "robin"}', ["'queue_order_strategy'", "(got 'robin'"]),
    (AMQP, '{"confirm_publish": "yes"}', ["'confirm_publish' must be True or False", "(got 'yes'"]),
    (AMQP, '{"heartbaet": 10}', ["unknown broker transport option 'heartbaet' for the AMQP transport"]),
], ids=lambda value: "redis" if value == REDIS else None)  # (the same IDs whichever Redis the suite uses)
def test_bad_broker_transport_options_are_refused(queue_url: str, url: str | None, options: str,
                                                  expected: list[str]) -> None:
    run = worker(queue_url, "-P", "solo", *(["-b", url] if url else []),
                 env={"WORKER_BROKER_TRANSPORT_OPTIONS": options})
    assert_refused(run, *expected, queue_url=queue_url)


@pytest.mark.parametrize(("env", "expected"), [
    ({"WORKER_RESULT_BACKEND": "nope"},
     ["no result_backend named 'nope' is installed", "disabled (worker-core)"]),
    ({"WORKER_RESULT_BACKEND": "redis://127.0.0.1:6379/abc"},
     ["result backend URL 'redis://127.0.0.1:6379/abc' names database 'abc'"]),
    ({"WORKER_RESULT_BACKEND": "embedded:///tmp/"}, ["embedded URL 'embedded:///tmp/' names the directory"]),
    ({"WORKER_RESULT_BACKEND": REDIS, "WORKER_RESULT_BACKEND_TRANSPORT_OPTIONS": '{"retry_polcy": {}}'},
     ["unknown result_backend_transport_options entry 'retry_polcy'"]),
])
def test_a_bad_result_backend_is_refused(queue_url: str, env: dict[str, str], expected: list[str]) -> None:
    assert_refused(worker(queue_url, "-P", "solo", env=env), *expected, queue_url=queue_url)


# -- settings: WORKER_* variables and App(...) --------------------------------------------------------


@pytest.mark.parametrize(("env", "expected"), [
    ({"WORKER_WORKER_CONCURRENCY": "x"}, ["WORKER_WORKER_CONCURRENCY must be a whole number", "(got 'x')"]),
    ({"WORKER_WORKER_CONCURRENCY": "0"}, ["WORKER_WORKER_CONCURRENCY='0'", "must be at least 1"]),
    ({"WORKER_TASK_ACKS_LATE": "maybe"}, ["WORKER_TASK_ACKS_LATE must be true or false", "(got 'maybe')"]),
    ({"WORKER_WORKER_CONCURENCY": "2"}, ["WORKER_WORKER_CONCURENCY is not a setting",
                                         "Did you mean WORKER_WORKER_CONCURRENCY?"]),
    ({"WORKER_BROKER_URLL": "redis://x"}, ["WORKER_BROKER_URLL is not a setting", "WORKER_BROKER_URL?"]),
    ({"WORKER_BROKER_CONNECTION_TIMEOUT": "nan"}, ["WORKER_BROKER_CONNECTION_TIMEOUT='nan'",
                                                   "must be a finite number"]),
    ({"WORKER_RESULT_EXPIRES": "abc"}, ["WORKER_RESULT_EXPIRES must be a number", "(got 'abc')"]),
    ({"WORKER_TASK_ROUTES": "nope"}, ["'task_routes': 'nope' is not a dotted path to a router function"]),
    ({"WORKER_TASK_ROUTES": "{nope"}, ["WORKER_TASK_ROUTES must be JSON", "(got text that is not JSON"]),
    ({"WORKER_TASK_QUEUES": '[{"name": "a", "exchange_type": "topc"}]'},
     ["task_queues[0]: exchange type must be one of direct, topic, fanout, headers (got 'topc')",
      "Did you mean 'topic'?"]),
    ({"WORKER_TASK_DEFAULT_QUEUE_TYPE": "qurum"}, ["must be one of classic, quorum (got 'qurum')"]),
    ({"WORKER_ACCEPT_CONTENT": ""}, ["WORKER_ACCEPT_CONTENT=''", "non-empty list", "['json']"]),
    ({"WORKER_ACCEPT_CONTENT": "json,nope"}, ["'accept_content' names no serializer", "(got 'nope')",
                                              "Known: json"]),
    ({"WORKER_TASK_SERIALIZER": "jsn"}, ["'task_serializer' names no serializer", "(got 'jsn')",
                                         "Did you mean 'json'?"]),
    ({"WORKER_BROKER_URL": "nope"}, ["broker URL 'nope' has no scheme"]),
    ({"WORKER_WORKER_POOL": "nope"}, ["no pool named 'nope'"]),
    ({"WORKER_WORKER_DISABLE_RATE_LIMITS": "sometimes"}, ["WORKER_WORKER_DISABLE_RATE_LIMITS must be true or "
                                                          "false", "(got 'sometimes')"]),
    ({"WORKER_WORKER_STATE_DB": "/nowhere/at/all/state"}, ["--statedb '/nowhere/at/all/state'",
                                                          "the directory /nowhere/at/all does not exist"]),
])
def test_a_bad_worker_environment_variable_is_refused_by_name(queue_url: str, env: dict[str, str],
                                                              expected: list[str]) -> None:
    run = workerctl("worker", "-A", "apps.basic", env={"WORKER_BROKER_URL": queue_url, **env})
    assert_refused(run, *expected, queue_url=queue_url)


def test_unrelated_worker_variables_are_left_alone(queue_url: str) -> None:
    run = worker(queue_url, "-P", "solo", "-c", "-1", env={"WORKER_HOME": "/srv", "WORKER_ID": "7"})
    assert_refused(run, "--concurrency must be 0 or more")  # refused for -c, not for those


@pytest.mark.parametrize(("settings", "expected"), [
    ({"worker_concurrency": "2"}, "'worker_concurrency' must be int or None (got '2' that is a str)"),
    ({"worker_concurrency": True}, "'worker_concurrency' must be int or None (got True that is a bool)"),
    ({"task_acks_late": "yes"}, "setting 'task_acks_late' must be bool (got 'yes' that is a str)"),
    ({"broker_transport_options": [1]}, "'broker_transport_options' must be dict (got [1] that is a list)"),
    ({"accept_content": []}, "setting 'accept_content' must be a non-empty list"),
    ({"result_expires": float("nan")}, "setting 'result_expires' must be a finite number (got nan)"),
    ({"broker_failback_interval": float("inf")}, "'broker_failback_interval' must be a finite number"),
    ({"broker": "nope"}, "broker URL 'nope' has no scheme"),
    ({"broker": "redis://a//;amqp://b//"}, "setting 'broker_url' mixes transports (amqp, redis)"),
    ({"broker_urll": "redis://x"}, "unknown setting 'broker_urll'. Did you mean 'broker_url'?"),
    ({"config_source": {"brokr_url": "redis://x"}}, "unknown setting 'brokr_url'. Did you mean"),
    ({"task_default_queue": ""}, "setting 'task_default_queue' must be a name"),
])
def test_app_settings_of_the_wrong_kind_or_name_are_refused_when_the_app_is_made(settings: dict[str, Any],
                                                                                 expected: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        App("bad", **settings)
    assert expected in str(refused.value)


def _app_module(tmp_path: Path, source: str) -> Path:
    (tmp_path / "badapp.py").write_text(textwrap.dedent(source))
    return tmp_path


@pytest.mark.parametrize(("source", "expected"), [
    ("from worker_core import App\napp = App('bad', worker_concurency=2)\n",
     ["the app module 'badapp' failed to import", "unknown setting 'worker_concurency'",
      "Did you mean 'worker_concurrency'?"]),
    ("from worker_core import App\napp = App('bad', accept_content=['json', 'pikle'])\n",
     ["'accept_content' names no serializer", "(got 'pikle')", "Did you mean 'pickle'?"]),
    ("from worker_core import App\napp = App('bad')\n@app.task(max_retries='x')\ndef f(): pass\n",
     ["@app.task for 'badapp.f': max_retries must be a whole number", "(got 'x')"]),
    ("from worker_core import App\napp = App('bad')\n@app.task(serializer='jsn')\ndef f(): pass\n",
     ["@app.task for 'badapp.f': serializer 'jsn'", "Did you mean 'json'?"]),
    ("from worker_core import App\napp = App('bad', result_serializer='pickle')\n",
     ["setting 'result_serializer' is 'pickle', but pickle is not accepted for results (accepted: json)",
      "Add 'pickle' to result_accept_content"]),
    ("from worker_core import App\napp = App('bad')\n@app.task(result_serializer='pickle')\ndef f(): pass\n",
     ["@app.task for 'badapp.f': result_serializer is 'pickle', but pickle is not accepted for results"]),
    ("from worker_core import App\napp = App('bad', result_accept_content=['jsn'])\n",
     ["'result_accept_content' names no serializer or content type kombu knows (got 'jsn')"]),
    ("from worker_core import App\nclass B: pass\napp = App('bad')\n@app.task(base=B)\ndef f(): pass\n",
     ["@app.task for 'badapp.f': base must be a subclass of worker_core.Task (got <class 'badapp.B'>"]),
])
def test_an_app_module_with_bad_settings_or_tasks_stops_the_worker_before_it_starts(
        queue_url: str, tmp_path: Path, source: str, expected: list[str]) -> None:
    run = workerctl("worker", "-A", "badapp", "-P", "solo", env={"WORKER_BROKER_URL": queue_url},
                    path=[_app_module(tmp_path, source)])
    assert_refused(run, *expected, queue_url=queue_url)


@pytest.mark.parametrize(("setting", "value", "package"), [
    ("WORKER_RESULT_SERIALIZER", "msgpack", "msgpack"),
    ("WORKER_ACCEPT_CONTENT", "json,yaml", "PyYAML"),
])
def test_a_serializer_whose_library_is_missing_is_refused_naming_the_pip_install(
        queue_url: str, tmp_path: Path, setting: str, value: str, package: str) -> None:
    module = "msgpack" if package == "msgpack" else "yaml"
    (tmp_path / f"{module}.py").write_text(f"raise ImportError('no module named {module} here')\n")
    run = workerctl("worker", "-A", "apps.basic", "-P", "solo",
                    env={"WORKER_BROKER_URL": queue_url, setting: value}, path=[tmp_path])
    setting_name = setting.removeprefix("WORKER_").lower()
    assert_refused(run, f"setting {setting_name!r} names {module!r}, whose library is not installed: "
                        f"pip install {package}", queue_url=queue_url)


# -- task decorator options -------------------------------------------------------------------------


@pytest.mark.parametrize(("options", "expected"), [
    ({"max_retries": "x"}, "max_retries must be a whole number, 0 or more, or None (got 'x')"),
    ({"max_retries": -1}, "max_retries must be a whole number, 0 or more, or None (got -1)"),
    ({"bind": "yes"}, "bind must be True or False (got 'yes')"),
    ({"acks_late": "yes"}, "acks_late must be True, False or None (got 'yes')"),
    ({"default_retry_delay": -1}, "default_retry_delay must be a number, 0 or more, or None (got -1)"),
    ({"autoretry_for": "ValueError"}, "autoretry_for must be exception classes (got 'ValueError')"),
    ({"retry_backoff": "x"}, "retry_backoff must be a number, 0 or more, or None (got 'x')"),
    ({"retry_jitter": "x"}, "retry_jitter must be True or False (got 'x')"),
    ({"time_limit": float("nan")}, "time_limit must be a number, 0 or more, or None (got nan)"),
    ({"time_limit": 1, "soft_time_limit": 2}, "soft_time_limit (2s) must be shorter than time_limit (1s)"),
    ({"reject_on_worker_lost": 1}, "reject_on_worker_lost must be True, False or None (got 1)"),
    ({"queue": ""}, "queue must be a name without surrounding spaces, or None (got '')"),
    ({"priority": 300}, "priority must be a whole number from 0 to 255, or None (got 300)"),
    ({"serializer": 1}, "serializer must be a name without surrounding spaces, or None (got 1)"),
    ({"retry_kwargs": [1]}, "retry_kwargs must be a mapping (got [1])"),
    ({"max_retry": 3}, "unknown option 'max_retry'. Did you mean 'max_retries'?"),
    ({"name": ""}, "name must be a non-empty string without surrounding spaces (got '')"),
    ({"name": " proj.add"}, "name must be a non-empty string without surrounding spaces (got ' proj.add')"),
    ({"name": 3}, "name must be a non-empty string without surrounding spaces (got 3)"),
    ({"typing": False}, "'typing' is a Celery task option this worker does not have"),
    ({"base": dict}, "base must be a subclass of worker_core.Task (got <class 'dict'> that is a type)"),
    ({"on_success": 3}, "on_success must be a function taking the task first (got 3)"),
    ({"result_serializer": ""},
     "result_serializer must be a name without surrounding spaces, or None (got '')"),
    ({"rate_limit": "10/d"}, "rate_limit: a rate limit is a number of tasks per second or a string like "
                             "'10/s', '100/m' or '2/h' (got '10/d')"),
])
def test_bad_task_options_are_refused_naming_the_task_the_option_and_the_value(options: dict[str, Any],
                                                                               expected: str) -> None:
    app = App("bad")

    def f() -> None: ...

    with pytest.raises(ConfigurationError) as refused:
        app.task(**options)(f)
    assert f"@app.task for '{f.__module__}.f': " in str(refused.value)
    assert expected in str(refused.value)


# -- workerctl call, inspect and control --------------------------------------------------------------


@pytest.mark.parametrize(("args", "expected"), [
    (["--args", "[1,"], ["Invalid value for --args: must be JSON", "for example [2, 3]"]),
    (["--args", '{"a": 1}'], ["Invalid value for --args: must be a JSON array", """(got '{"a": 1}')"""]),
    (["--kwargs", "[1]"], ["Invalid value for --kwargs: must be a JSON object", "(got '[1]')"]),
    (["--kwargs", "x"], ["Invalid value for --kwargs: must be JSON", 'for example {"x": 1}']),
    (["--countdown", "x"], ["'--countdown'", "'x' is not a valid float"]),
    (["--countdown", "nan"], ["countdown must be a finite number of seconds (got nan)"]),
    (["--expires", "0"], ["'--expires'", "0.0 is not in the range x>0"]),
    (["--priority", "300"], ["'--priority'", "300 is not in the range 0<=x<=255"]),
    (["--wait", "--timeout", "-1"], ["'--timeout'", "-1.0 is not in the range x>=0"]),
    (["--timeout", "5"],
     ["--timeout applies only with --wait (got --timeout 5 without --wait)", "add --wait"]),
    (["-Q", ""], ["Invalid value for --queue: must be a queue name (got '')"]),
    (["-b", "nope"], ["broker URL 'nope' has no scheme"]),
    (["-b", "foo://x"], ["no transport named 'foo' is installed"]),
    (["-A", "apps.nothere"], ["cannot import the app module 'apps.nothere'"]),
])
def test_bad_call_options_are_refused_and_nothing_is_sent(queue_url: str, args: list[str],
                                                          expected: list[str]) -> None:
    run = workerctl("call", "apps.basic.add", *args, env={"WORKER_BROKER_URL": queue_url})
    assert_refused(run, *expected, queue_url=queue_url)


def test_call_with_b_sends_to_that_broker_even_when_worker_broker_url_is_set(queue_url: str,
                                                                              tmp_path: Path) -> None:
    other = f"embedded://{tmp_path}/other.db"
    run = workerctl("call", "apps.basic.add", "--args", "[1, 2]", "-b", other,
                    env={"WORKER_BROKER_URL": queue_url})
    assert run.code == 0, run.err
    assert (_waiting(other), _waiting(queue_url)) == (1, 1)


@pytest.mark.parametrize(("args", "expected"), [
    (["inspect", "pign"], ["no inspect command 'pign'. Did you mean 'ping'?", "commands are: active, "]),
    (["inspect", "ping", "-t", "x"], ["'-t' / '--timeout'", "'x' is not a valid float"]),
    (["inspect", "ping", "-t", "0"], ["'-t' / '--timeout'", "not in the range x>0"]),
    (["inspect", "ping", "-b", "nope"], ["broker URL 'nope' has no scheme"]),
    (["control", "nope"], ["no control command 'nope'.", "commands are: add_consumer, autoscale"]),
    (["control", "pool-grow", "x"], ["Invalid value for N: must be a whole number (got 'x')"]),
    (["control", "pool-grow", "0"], ["Invalid value for N: must be a whole number, 1 or more (got 0)"]),
    (["control", "pool-grow", "1", "2"], ["pool_grow takes [N] (got 2 arguments)"]),
    (["control", "autoscale"], ["autoscale takes MAX [MIN] (got 0 arguments)",
                                "for example: autoscale 10 3"]),
    (["control", "autoscale", "1", "5"], ["MIN may not exceed MAX", "did you mean 5,1?"]),
    (["control", "shutdown", "now"], ["shutdown takes no arguments (got 1 argument)"]),
    (["control", "revoke"], ["revoke takes TASK_ID... (got 0 arguments)", "for example: revoke "]),
    (["control", "terminate", "KILL"], ["terminate takes SIGNAL TASK_ID... (got 1 argument)",
                                        "terminate KILL "]),
    (["control", "terminate", "NOPE", "some-id"], ["Invalid value for SIGNAL: unknown signal 'NOPE'"]),
    (["control", "rate-limit", "proj.add"], ["rate_limit takes TASK_NAME RATE_LIMIT (got 1 argument)"]),
    (["control", "rate-limit", "proj.add", "5/d"], ["Invalid value for RATE", "'10/s', '100/m' or '2/h'"]),
    (["control", "time-limit", "proj.add"], ["time_limit takes TASK_NAME SOFT [HARD] (got 1 argument)"]),
    (["control", "time-limit", "proj.add", "1", "x"], ["Invalid value for HARD: must be a number (got 'x')"]),
    (["inspect", "query_task"], ["query_task takes IDS... (got 0 arguments)"]),
    (["control", "add-consumer"], ["add_consumer takes QUEUE [EXCHANGE] [EXCHANGE_TYPE] [ROUTING_KEY]",
                                   "for example: add_consumer emails"]),
])
def test_bad_inspect_and_control_arguments_are_refused(queue_url: str, args: list[str],
                                                       expected: list[str]) -> None:
    run = workerctl(*args, env={"WORKER_BROKER_URL": queue_url})
    assert_refused(run, *expected, queue_url=queue_url)


def test_a_bad_variable_is_named_without_the_passwords_it_holds(queue_url: str) -> None:
    url = "redis://:first-secret@127.0.0.1:6379/5;amqp://guest:second-secret@127.0.0.1:5672//"
    run = workerctl("call", "apps.basic.add", "-A", "apps.basic", env={"WORKER_BROKER_URL": url})
    assert run.code == 2, run.err
    assert run.errors == [
        "Error: WORKER_BROKER_URL='redis://:**@127.0.0.1:6379/5;amqp://guest:**@127.0.0.1:5672//': setting "
        "'broker_url' mixes transports (amqp, redis) in 'redis://:**@127.0.0.1:6379/5;amqp://guest:**@"
        "127.0.0.1:5672//': the ';'-separated URLs are failover servers of one kind, for example "
        "redis://a:6379/0;redis://b:6379/0"
    ], run.err
    assert "secret" not in run.out + run.err
    assert _waiting(queue_url) == 1


# -- plugin options ---------------------------------------------------------------------------------

AUDIT_PLUGIN = """
    from worker_core import OptionSpec, hookimpl
    from worker_core.exceptions import ConfigurationError

    def level(text):
        if text not in ("low", "high"):
            raise ValueError(f"must be low or high (got {text!r})")
        return text

    @hookimpl
    def worker_options():
        return [OptionSpec("audit_level", ("--audit-level",), convert=level, help="How much to audit."),
                OptionSpec("audit_sample", ("--audit-sample",), convert=float, help="Share audited.")]

    @hookimpl
    def worker_validate_options(options):
        sample = options.extra.get("audit_sample")
        if sample is not None and not 0 < sample <= 1:
            raise ConfigurationError(f"--audit-sample must be more than 0 and at most 1 (got {sample!r})")
"""


@pytest.mark.parametrize(("args", "expected"), [
    (["--audit-level", "loud"], ["Invalid value for '--audit-level': must be low or high (got 'loud')"]),
    (["--audit-sample", "x"], ["Invalid value for '--audit-sample'", "could not convert string to float"]),
    (["--audit-sample", "2"], ["--audit-sample must be more than 0 and at most 1 (got 2.0)",
                               "reported by plugin audit (audit-plugin 1.0)"]),
])
def test_a_plugins_own_options_are_checked_before_anything_starts(
        queue_url: str, site: FakeSite, args: list[str], expected: list[str]) -> None:
    site.add("audit-plugin", {"worker.plugins": {"audit": "audit_plugin"}}, {"audit_plugin": AUDIT_PLUGIN})
    run = workerctl("worker", "-A", "apps.basic", "-P", "solo", *args, env={"WORKER_BROKER_URL": queue_url},
                    path=[site.root])
    assert_refused(run, *expected, queue_url=queue_url)


@pytest.mark.parametrize(("env", "expected"), [
    ({"WORKER_AUDIT_LEVEL": "loud"},
     ["WORKER_AUDIT_LEVEL='loud' (--audit-level of plugin audit (audit-plugin 1.0)): must be low or high "
      "(got 'loud')"]),
    ({"WORKER_AUDIT_SAMPLE": "2"}, ["--audit-sample must be more than 0 and at most 1 (got 2.0)",
                                    "reported by plugin audit (audit-plugin 1.0)"]),
    ({"WORKER_WORKER_PLUGIN_OPTIONS": '{"audit_level": "loud"}'},
     ["WORKER_WORKER_PLUGIN_OPTIONS gives audit_level='loud' (--audit-level of plugin audit "
      "(audit-plugin 1.0)): must be low or high (got 'loud')"]),
    ({"WORKER_WORKER_PLUGIN_OPTIONS": '{"audit_levels": "low"}'},
     ["WORKER_WORKER_PLUGIN_OPTIONS names 'audit_levels', which no installed plugin declares as an option.",
      "Did you mean 'audit_level'?", "Declared options: ", " audit_level, audit_sample, ",
      " child_scheduler"]),
    ({"WORKER_WORKER_PLUGIN_OPTIONS": "[1]"},
     ["WORKER_WORKER_PLUGIN_OPTIONS must be a JSON object (got a JSON list)"]),
    ({"WORKER_HEARTBEAT_INTERVAL": "0"},
     ["WORKER_HEARTBEAT_INTERVAL='0' (--heartbeat-interval of plugin events (worker-core ",
      "must be a number of seconds above 0 (got '0')"]),
    ({"WORKER_CHILD_SCHEDULER": "fifo"},
     ["WORKER_CHILD_SCHEDULER='fifo' (--child-scheduler of plugin prefork (worker-pool-prefork ",
      "must be batch or normal (got 'fifo')"]),
    ({"WORKER_TASK_EVENTS": "sometimes"},
     ["WORKER_TASK_EVENTS='sometimes' (-E of plugin events",
      "must be true or false, 1 or 0, yes or no, on or off"]),
])
def test_a_plugins_own_options_from_the_environment_are_checked_before_anything_starts(
        queue_url: str, site: FakeSite, env: dict[str, str], expected: list[str]) -> None:
    site.add("audit-plugin", {"worker.plugins": {"audit": "audit_plugin"}}, {"audit_plugin": AUDIT_PLUGIN})
    run = workerctl("worker", "-A", "apps.basic", "-P", "solo", env={"WORKER_BROKER_URL": queue_url, **env},
                    path=[site.root])
    assert_refused(run, *expected, queue_url=queue_url)
