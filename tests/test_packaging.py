"""The distributions install alone, and a third-party plugin installed with pip shows up.

These tests build a fresh virtual environment and pip-install into it, as a user would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import REPO
from workers import wait_for

pytestmark = pytest.mark.venv

THIRD_PARTY_SETUP = """
[metadata]
name = acme-worker-extras
version = 2.5.0

[options]
py_modules = acme_extras
install_requires = worker-core

[options.entry_points]
worker.plugins =
    acme = acme_extras
worker.pools =
    acme = acme_extras:AcmePool
"""

THIRD_PARTY_MODULE = '''
"""A throwaway third-party plugin: one step and one pool."""
from worker_core import Step, hookimpl
from worker_core.pools.solo import SoloPool


class AcmeMetrics(Step):
    name = "AcmeMetrics"
    requires = ("Pool",)
    label = "exports acme metrics"


class AcmePool(SoloPool):
    """Everything a pool needs, from the solo pool."""


@hookimpl
def worker_bootsteps(blueprint):
    return [AcmeMetrics()] if blueprint == "worker" else []
'''


def _run(venv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(venv / "bin" / args[0]), *args[1:]], capture_output=True, text=True,
                          env=env, timeout=600)


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with only worker-core, worker-pool-prefork, a throwaway third-party plugin
    and the README's example plugin."""
    root = tmp_path_factory.mktemp("venv")
    plugin = root / "acme"
    plugin.mkdir()
    (plugin / "setup.cfg").write_text(textwrap.dedent(THIRD_PARTY_SETUP))
    (plugin / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n'
    )
    (plugin / "acme_extras.py").write_text(THIRD_PARTY_MODULE)
    # pip builds a local project in place (build/, *.egg-info): copies keep the checkout as it was
    sources = [shutil.copytree(REPO / path, root / "sources" / path,
                               ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".venv"))
               for path in ("core", "plugins/pool_prefork", "examples/plugin")]
    env_dir = root / "env"
    subprocess.run([sys.executable, "-m", "venv", str(env_dir)], check=True)
    install = _run(env_dir, "pip", "install", "--disable-pip-version-check", "-q",
                   str(sources[0]), str(sources[1]), str(plugin), str(sources[2]))
    assert install.returncode == 0, install.stderr
    return env_dir


def test_two_distributions_install_alone_and_workerctl_sees_exactly_their_plugins(venv):
    listing = _run(venv, "workerctl", "plugins", "--json")
    assert listing.returncode == 0, listing.stderr
    rows = json.loads(listing.stdout)
    assert {r["distribution"] for r in rows} == {
        "worker-core", "worker-pool-prefork", "acme-worker-extras", "worker-liveness"
    }
    pools = {r["name"]: r["distribution"] for r in rows if r["kind"] == "pool"}
    assert pools == {"solo": "worker-core", "prefork": "worker-pool-prefork", "acme": "acme-worker-extras",
                     "timed": "worker-liveness"}
    assert not any(r["kind"] == "transport" and r["name"] == "redis" for r in rows)


def test_the_third_party_pool_and_hooks_are_listed(venv):
    rows = json.loads(_run(venv, "workerctl", "plugins", "--json").stdout)
    acme = {(r["kind"], r["name"]): r for r in rows if r["distribution"] == "acme-worker-extras"}
    assert acme[("pool", "acme")]["status"] == "loaded"
    assert acme[("pool", "acme")]["version"] == "2.5.0"
    assert acme[("hooks", "acme")]["hooks"] == ["worker_bootsteps"]


def test_the_third_party_step_is_in_the_graph(venv):
    graph = _run(venv, "workerctl", "steps", "--graph", "-P", "acme")
    assert graph.returncode == 0, graph.stderr
    assert '"worker:AcmeMetrics" -> "worker:Pool";' in graph.stdout
    assert "from acme (acme-worker-extras 2.5.0)" in graph.stdout
    assert "pool: acme (acme-worker-extras 2.5.0)" in graph.stdout


def test_a_missing_distribution_is_named_in_the_error(venv):
    result = _run(venv, "workerctl", "steps", "-P", "threads")
    assert result.returncode == 2
    assert "pip install ./plugins/pool_threads (worker-pool-threads" in result.stderr
    result = _run(venv, "workerctl", "steps", "-b", "redis://127.0.0.1:6379/0")
    assert result.returncode == 2
    assert "pip install ./plugins/transport_redis (worker-transport-redis" in result.stderr
    beat = _run(venv, "workerctl", "worker", "-A", "nothing", "-B")  # refused before the app is looked for
    assert beat.returncode == 2 and beat.stderr.splitlines() == [
        "Error: -B/--beat runs the periodic-task scheduler in the worker, which the beat plugin adds: "
        "pip install ./plugins/beat"]


def test_the_readme_example_plugin_runs_a_worker_with_its_pool_and_step(venv, tmp_path):
    import signal

    graph = _run(venv, "workerctl", "steps", "--graph", "--liveness-file", str(tmp_path / "alive"))
    assert graph.returncode == 0, graph.stderr
    assert "worker:Liveness" in graph.stdout and "from liveness (worker-liveness 1.0.0)" in graph.stdout

    broker = f"embedded://{tmp_path}/queue.db"
    alive = tmp_path / "alive"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["WORKER_BROKER_URL"] = broker
    log = (tmp_path / "worker.log").open("wb")
    worker = subprocess.Popen(
        [str(venv / "bin" / "workerctl"), "worker", "-A", "tasks", "-P", "timed", "-l", "INFO",
         "--liveness-file", str(alive), "--liveness-interval", "0.2"],
        cwd=REPO / "examples", env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        called = subprocess.run([str(venv / "bin" / "workerctl"), "call", "tasks.add", "--args", "[2, 3]",
                                 "--wait", "--timeout", "30", "-b", broker],
                                capture_output=True, text=True, env=env, cwd=REPO / "examples", timeout=60)
        assert called.returncode == 0, called.stderr + (tmp_path / "worker.log").read_text()
        assert called.stdout.splitlines()[-1] == "5"
        assert alive.exists()
        first = alive.stat().st_mtime
        wait_for(lambda: alive.stat().st_mtime > first, 5,  # touched again from the event loop
                 message="the liveness file to be touched again")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
        assert not alive.exists()  # removed on a clean stop
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        log.close()


def test_a_celery_app_without_worker_celery_is_refused_naming_the_distribution(venv, tmp_path):
    """worker-core recognises a Celery app without importing Celery (a stand-in of its class here:
    this venv has no celery) and says what to install."""
    (tmp_path / "celery" / "app").mkdir(parents=True)
    (tmp_path / "celery" / "__init__.py").write_text("")
    (tmp_path / "celery" / "app" / "__init__.py").write_text("")
    (tmp_path / "celery" / "app" / "base.py").write_text("class Celery:\n    pass\n")
    (tmp_path / "proj.py").write_text("from celery.app.base import Celery\n\napp = Celery()\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    for spec in ("proj", "proj:app"):
        result = subprocess.run([str(venv / "bin" / "workerctl"), "worker", "-A", spec], cwd=tmp_path,
                                env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 2, result.stderr
        assert f"-A {spec} names a Celery app (celery.app.base.Celery)" in result.stderr
        assert "install its app loader: pip install ./plugins/celery_app (worker-celery" in result.stderr
    imported = _run(venv, "python", "-c", "import celery")
    assert imported.returncode != 0  # the stand-in was only the project's
