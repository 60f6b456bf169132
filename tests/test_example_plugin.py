"""The example plugin in examples/plugin: its pool passes the pool contract suite shipped in the core, and
its remote-control command answers workerctl and Celery's client."""

from __future__ import annotations

import sys

import pytest
from conftest import REPO

from worker_core.testing import pool_contract

sys.path.insert(0, str(REPO / "examples" / "plugin" / "src"))
from worker_liveness.pool import TimedPool


@pytest.mark.parametrize("check", pool_contract.CHECKS, ids=pool_contract.check_name)
@pytest.mark.parametrize("hub", [False, True], ids=["direct", "hub"])
def test_the_example_pool_honours_the_pool_contract(check, hub):
    check(TimedPool, hub=hub)


def test_the_example_pool_refuses_time_limits():
    from worker_core.exceptions import ConfigurationError
    from worker_core.slots import PoolOptions

    with pytest.raises(ConfigurationError, match="cannot enforce time limits"):
        TimedPool.check_options(PoolOptions(concurrency=1, time_limit=5))


# -- its remote-control command, end to end --------------------------------------------------------


@pytest.fixture
def liveness_worker(site, workers, tmp_path, redis_url):
    """A worker with the example plugin installed and a liveness file, on Redis."""
    import shutil

    from apps import basic
    from conftest import REPO as repo
    from workers import TESTS, wait_for

    from worker_core.control.client import broadcast

    source = repo / "examples" / "plugin" / "src" / "worker_liveness"
    shutil.copytree(source, site.root / "worker_liveness")
    site.add("worker-liveness", {"worker.plugins": {"liveness": "worker_liveness.plugin"}})
    site.modules.add("worker_liveness")
    path = tmp_path / "alive"
    worker = workers.start("--liveness-file", str(path), "--liveness-interval", "0.5", broker=redis_url,
                           env={"PYTHONPATH": f"{site.root}:{TESTS}"})
    basic.app.conf.update(broker_url=redis_url, result_backend=None)
    wait_for(lambda: broadcast(basic.app, "ping", destination=[worker.name], timeout=0.5), timeout=20,
             message="the worker to answer a ping")
    yield worker, path
    basic.app.close()


def test_the_example_plugins_command_answers_workerctl_and_celerys_client(liveness_worker, redis_url):
    import json

    from celery import Celery
    from click.testing import CliRunner

    from worker_core.cli.group import main

    worker, path = liveness_worker
    result = CliRunner().invoke(main, ["inspect", "liveness", "30", "-b", redis_url, "-d", worker.name,
                                       "--json", "-t", "5"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    reply = json.loads(result.stdout)[worker.name]
    assert reply["file"] == str(path) and 0 <= reply["age"] < 30 and reply["stale"] is False
    refused = CliRunner().invoke(main, ["inspect", "liveness", "soon", "-b", redis_url])
    assert refused.exit_code == 2
    assert "Invalid value for MAX_AGE: must be a number (got 'soon')" in refused.output
    wrong_kind = CliRunner().invoke(main, ["control", "liveness", "-b", redis_url])
    assert "liveness reads the worker's state: send it with workerctl inspect liveness" in wrong_kind.output
    celery = Celery("client", broker=redis_url)
    try:
        inspect = celery.control.inspect(destination=[worker.name], timeout=5)
        answers = inspect._request("liveness", max_age=-1)
    finally:
        celery.close()
    assert answers[worker.name]["stale"] is True and answers[worker.name]["file"] == str(path)


def test_celerys_command_line_reaches_the_plugins_command_once_its_app_declares_it(
        liveness_worker, redis_url, tmp_path):
    import json
    import os
    import subprocess
    import textwrap

    worker, path = liveness_worker
    # Celery's command line checks a name against Celery's own registry: the client's app module
    # declares the command there, as Celery's documentation has custom commands declared
    (tmp_path / "liveness_client.py").write_text(textwrap.dedent(f"""
        from celery import Celery
        from celery.worker.control import inspect_command

        app = Celery("liveness-client", broker={redis_url!r})

        @inspect_command(args=[("max_age", float)], signature="[max_age]")
        def liveness(state, max_age=None):
            \"\"\"Seconds since the worker's liveness file was touched.\"\"\"
    """))
    command = [sys.executable, "-m", "celery", "-A", "liveness_client", "inspect", "liveness", "30",
               "-d", worker.name, "-j", "-t", "5"]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=60,
                            env=dict(os.environ, PYTHONPATH=str(tmp_path)))
    assert result.returncode == 0, result.stderr
    reply = json.loads(result.stdout.strip().splitlines()[-1])[worker.name]
    assert reply["file"] == str(path) and reply["stale"] is False
