"""What worker-beat sends is run by Celery's own worker, from a Celery app's beat_schedule read
unchanged (Celery's schedule objects, options, time zone); and a worker started with -B answers
``inspect beat`` and shows the scheduler in its metrics."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from click.testing import CliRunner
from conftest import empty_redis, redis_db
from workers import TESTS, wait_for

from worker_core.cli.group import main

REDIS_BEAT_URL = redis_db(10)


def test_celerys_worker_runs_the_ticks_of_a_celery_apps_schedule(workers, tmp_path: Path) -> None:
    url = empty_redis(REDIS_BEAT_URL)
    runs = tmp_path / "runs.txt"
    env = dict(
        os.environ, PYTHONPATH=str(TESTS), PYTHONUNBUFFERED="1", CELERY_BROKER_URL=url, BEAT_RUNS=str(runs)
    )
    listing = subprocess.run(
        [sys.executable, "-m", "worker_core", "beat", "-A", "apps.celery_beat", "--list", "--json"],
        env=env,
        cwd=TESTS,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listing.returncode == 0, listing.stderr
    shown = {entry["name"]: entry for entry in json.loads(listing.stdout)["entries"]}
    assert shown["second"]["schedule"] == "every 1s" and shown["hourly"]["schedule"] == "every 1h"
    assert shown["weekday-mornings"]["schedule"] == "crontab 0 7 * * 1-5"
    assert shown["weekday-mornings"]["next_run"].endswith(
        ("T05:00:00+00:00", "T06:00:00+00:00")
    )  # 07:00 Berlin
    workers.start_celery(app="apps.celery_beat", broker=url, env={"BEAT_RUNS": str(runs)})
    log = open(tmp_path / "beat.log", "wb")  # noqa: SIM115 - closed below
    scheduler = subprocess.Popen(
        [sys.executable, "-m", "worker_core", "beat", "-A", "apps.celery_beat", "-l", "INFO"],
        env=env,
        cwd=TESTS,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(
            lambda: runs.exists() and len(runs.read_text().splitlines()) >= 3,
            60,
            message="Celery's worker to run three ticks",
        )
    finally:
        scheduler.send_signal(signal.SIGTERM)
        scheduler.wait(30)
        log.close()
    lines = [line.split() for line in runs.read_text().splitlines()]
    assert {what for what, _, _ in lines} == {"second"}
    assert len({task_id for _, task_id, _ in lines}) == len(lines)
    assert "beat: Shutting down" in (tmp_path / "beat.log").read_text()


def test_a_worker_with_minus_b_answers_inspect_beat_and_shows_it_in_its_metrics(
    workers, tmp_path: Path
) -> None:
    url = empty_redis(REDIS_BEAT_URL)
    worker = workers.start(
        "-B",
        "--metrics-listen",
        "127.0.0.1:0",
        "-n",
        "beat1@localhost",
        app="apps.beat_fleet",
        env={"BEAT_BROKER": url, "WORKER_BROKER_URL": url},
    )
    worker.wait_log("sends the periodic tasks now", 30)
    result = CliRunner().invoke(
        main, ["inspect", "beat", "-b", url, "-d", "beat1@localhost", "--json", "-t", "5"]
    )
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)["beat1@localhost"]
    assert (
        answer["leading"] is True and answer["token"] >= 1 and answer["holder"].startswith("beat1@localhost#")
    )
    [entry] = answer["entries"]
    assert entry["name"] == "tick" and entry["schedule"] == "every 1s" and entry["next_run"]
    address = re.search(r"Prometheus metrics on (http://\S+/metrics)", worker.log())
    assert address is not None
    page = urllib.request.urlopen(address.group(1), timeout=10).read().decode()
    assert 'worker_beat_leader{hostname="beat1@localhost"} 1.0' in page
    assert 'worker_beat_entries{hostname="beat1@localhost"} 1.0' in page
