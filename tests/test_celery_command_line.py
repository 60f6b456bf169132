"""Celery's worker command line under ``workerctl``: every option of the installed Celery's
``celery worker`` (and its global options, before the command or after it) is an option of
``workerctl worker`` with Celery's meaning, or is refused in one line that says what to use
instead; none is ever "No such option"."""

from __future__ import annotations

import getpass
import grp
import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import click
import pytest
from conftest import REDIS_PORT, empty_redis, redis_db, require_server
from workers import TESTS, WorkerProcess, wait_for

from worker_core.cli.worker_cmd import worker as workerctl_worker

pytestmark = pytest.mark.timeout(120)


def celery_worker_flags() -> dict[str, click.Option]:
    """Every spelling of every option of the installed Celery's ``celery worker`` and of its
    global options (``--version`` aside: ``workerctl --version``), read from Celery's own
    command objects, with the option it belongs to."""
    from celery.bin.celery import celery
    from celery.bin.worker import worker

    flags = {}
    for param in [*worker.params, *celery.params]:
        if isinstance(param, click.Option) and param.name not in ("version", "help"):
            for flag in param.opts:
                flags[flag] = param
    return flags


def sample_value(name: str, tmp: Path) -> str:
    """A value ``celery worker`` accepts for the option named ``name`` (its destination)."""
    return {
        "hostname": "w1@%h", "statedb": str(tmp / "%n.state"), "loglevel": "INFO", "optimization": "fair",
        "prefetch_multiplier": "2", "concurrency": "2", "pool": "threads", "time_limit": "30",
        "soft_time_limit": "20", "max_tasks_per_child": "10", "pool_start_method": "fork",
        "max_memory_per_child": "200000", "queues": "a,b", "exclude_queues": "b", "include": "apps.basic",
        "heartbeat_interval": "3", "autoscale": "4,1", "schedule_filename": str(tmp / "schedule"),
        "scheduler": "celery.beat:PersistentScheduler", "logfile": str(tmp / "%n%I.log"),
        "pidfile": str(tmp / "%n.pid"), "uid": getpass.getuser(), "gid": grp.getgrgid(os.getgid()).gr_name,
        "umask": "0022", "executable": sys.executable, "app": "apps.basic", "broker": "embedded://",
        "result_backend": "embedded://", "loader": "celery.loaders.app:AppLoader",
        "config": "apps.extra_config",
        "workdir": str(TESTS),
    }[name]


#: options a plugin brings, refused in one line naming it when the plugin is not installed
FROM_BEAT = {"-B", "--beat", "-s", "--schedule-filename", "--schedule", "--scheduler"}


def test_the_installed_celery_has_the_options_this_test_goes_through():
    flags = celery_worker_flags()
    expected = {"-D", "--detach", "--pidfile", "--logfile", "-S", "--without-mingle", "-B", "-A", "--workdir"}
    assert expected <= set(flags)


@pytest.mark.parametrize("flag", sorted(celery_worker_flags()))
def test_every_celery_worker_option_is_an_option_of_workerctl_worker(flag: str, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(TESTS)
    option = celery_worker_flags()[flag]
    args = [flag] if option.is_flag else [flag, sample_value(str(option.name), tmp_path)]
    try:
        workerctl_worker.make_context("worker", args)
    except click.ClickException as refused:
        message = refused.format_message()
        assert "No such option" not in message
        assert flag in FROM_BEAT, message  # only the beat plugin's options may be missing
        assert "which the beat plugin adds: pip install ./plugins/beat" in message, message
        assert "\n" not in message


# -- refused with what to use instead ----------------------------------------------------------------


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {key: value for key, value in os.environ.items() if not key.startswith("WORKER_")}
    environment.update(env or {})
    return subprocess.run([sys.executable, "-m", "worker_core", *args], cwd=TESTS, env=environment,
                          capture_output=True, text=True, timeout=60)


def error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.mark.parametrize(("args", "expected"), [
    (["-P", "eventlet"], ["-P eventlet:", "monkey-patching", "use -P threads", "or -P prefork"]),
    (["-P", "gevent"], ["-P gevent:", "use -P threads"]),
    (["-P", "custom"], ["-P custom:", "pools are plugins, chosen by name"]),
    (["--pool-start-method", "spawn"], ["--pool-start-method spawn:", "forks its children", "-P threads"]),
    (["--disable-prefetch"], ["--disable-prefetch:", "--prefetch-multiplier 1", "task_acks_late=True"]),
    (["-E", "-p", "no:events"], ["-E/--task-events/--events sends task events", "blocked by -p no:events"]),
    (["--loader", "celery.loaders.app:AppLoader"], ["--loader", "only a Celery app has"]),
])
def test_an_option_with_no_meaning_here_is_refused_with_what_to_use_instead(args: list[str],
                                                                           expected: list[str]) -> None:
    line = error_line(run("worker", "-A", "apps.basic", "-b", "embedded://", *args))
    for text in expected:
        assert text in line, line


def test_the_beat_option_without_the_beat_plugin_names_the_path_to_install(tmp_path: Path) -> None:
    done = run("plugins", "--json")
    if "beat" in {plugin["name"] for plugin in json.loads(done.stdout)}:
        pytest.skip("the beat plugin is installed: -B is its option")
    assert error_line(run("worker", "-A", "apps.basic", "-B")) == (
        "Error: -B/--beat runs the periodic-task scheduler in the worker, which the beat plugin adds: "
        "pip install ./plugins/beat")


def test_celery_s_values_are_read_as_celery_reads_them() -> None:
    from worker_core.cli.celery_options import parse_worker_autoscale

    out = run("-A", "apps.basic", "steps", "-P", "prefork", "-c", "auto", "-O", "default", "-P", "processes",
              "--autoscale", "2,6", "-l", "fatal").stdout
    assert "autoscale 2..6" in out and "prefork pool" in out and "fair scheduling" in out, out
    assert parse_worker_autoscale("2,6").max == 6 and parse_worker_autoscale("6").min == 0


def test_global_options_before_the_command_are_the_command_s(tmp_path: Path) -> None:
    before = run("-A", "apps.basic", "-b", f"embedded://{tmp_path}/q.db", "--config", "apps.extra_config",
                 "steps")
    assert before.returncode == 0, before.stderr
    assert "[queues from-config;" in before.stdout  # the config module's task_default_queue
    assert f"broker embedded://{tmp_path}/q.db" in before.stdout
    queue = f"after-{uuid.uuid4().hex[:8]}"
    after = run("steps", "-A", "apps.basic", "--workdir", str(TESTS), "-Q", queue)
    assert after.returncode == 0 and f"[queues {queue};" in after.stdout, after.stderr
    missing = run("-A", "apps.nothere", "steps")
    assert "cannot import the app module 'apps.nothere'" in error_line(missing)


def test_celery_s_variables_stay_set_only_for_a_celery_app(monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from worker_core.cli.group import main

    monkeypatch.chdir(TESTS)
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    done = CliRunner().invoke(main, ["-b", "embedded://", "steps", "-A", "apps.basic"],
                              catch_exceptions=False)
    assert done.exit_code == 0, done.output
    assert "CELERY_BROKER_URL" not in os.environ  # an app of this project reads none: nothing left behind
    url = redis_db(5)  # not connected to: steps only builds the plan
    try:
        done = CliRunner().invoke(main, ["-b", url, "steps", "-A", "apps.celery_basic"],
                                  catch_exceptions=False)
        assert done.exit_code == 0, done.output
        assert os.environ["CELERY_BROKER_URL"] == url  # a Celery app reads it, as under celery
    finally:
        os.environ.pop("CELERY_BROKER_URL", None)  # this process runs other tests next


def test_config_gives_an_app_of_this_project_its_settings() -> None:
    from worker_core import App
    from worker_core.cli.preparation import _apply_app_options

    app = App("configured")
    _apply_app_options(app, {"config": "apps.extra_config", "result_backend": "rpc://"})
    assert app.settings.task_default_queue == "from-config" and app.settings.result_backend == "rpc://"


# -- a Celery app under every option at once ---------------------------------------------------------


class Program(WorkerProcess):
    """``workerctl`` with the whole command line given (global options before the command)."""

    program = ("-m", "worker_core")


def test_a_celery_app_runs_under_every_celery_worker_option_at_once(tmp_path: Path) -> None:
    require_server(REDIS_PORT, "Redis")
    broker, results = empty_redis(redis_db(5)), empty_redis(redis_db(6))
    queue = f"every-{uuid.uuid4().hex[:8]}"
    host = socket.gethostname()
    args = [
        "-A", "apps.celery_basic", "-b", broker, "--result-backend", results,
        "--loader", "celery.loaders.app:AppLoader", "--config", "apps.extra_config", "--workdir", str(TESTS),
        "-C", "-q", "--skip-checks",
        "worker", "-n", "every@%h", "-S", str(tmp_path / "%n.state"), "-l", "INFO", "-O", "fair",
        "--prefetch-multiplier", "2", "-c", "2", "-P", "prefork", "-E", "--time-limit", "60",
        "--soft-time-limit", "50", "--max-tasks-per-child", "100", "--pool-start-method", "fork",
        "--max-memory-per-child", "2000000", "--purge", "-Q", f"{queue},other", "-X", "other",
        "-I", "apps.celery_included", "--without-gossip", "--without-mingle", "--without-heartbeat",
        "--heartbeat-interval", "2", "--autoscale", "1,2", "-f", str(tmp_path / "%n%I.log"),
        "--pidfile", str(tmp_path / "%n.pid"), "--uid", getpass.getuser(),
        "--gid", grp.getgrgid(os.getgid()).gr_name, "--umask", "0022", "--executable", sys.executable,
    ]
    env = {key: value for key, value in os.environ.items() if not key.startswith(("WORKER_", "CELERY_"))}
    output = tmp_path / "output"
    process = Program(args, env, output)
    try:
        log = tmp_path / "every.log"
        wait_for(lambda: log.exists() and " ready." in log.read_text(), 60, message="the worker's log")
        assert f"every@{host} ready." in log.read_text()
        assert (tmp_path / "every.pid").read_text() == f"{process.pid}\n"
        assert "transport" not in output.read_text()  # -q: no banner
        from apps.celery_basic import client_app

        client = client_app(broker_url=broker, result_backend=results)
        assert client.send_task("apps.celery_included.included", queue=queue).get(timeout=30) == "included"
        assert client.send_task("apps.basic.add", (2, 3), queue=queue).get(timeout=30) == 5
    finally:
        code = process.stop()
        process.kill()
    assert code == 0, output.read_text()
    assert not (tmp_path / "every.pid").exists()  # removed at exit
    assert json.loads((tmp_path / "every.state").read_text())["revoked"] == {}
    assert "purge: Erased 0 messages from the queue" in (tmp_path / "every.log").read_text()
