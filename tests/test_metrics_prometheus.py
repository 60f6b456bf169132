"""Prometheus metrics served by the worker itself (worker-metrics-prometheus): every task event
counted under the Celery exporter's names and labels in every pool, the gauges of what the
worker holds, bounded labels for what messages name, a bad --metrics-listen refused before
anything starts, and a real Prometheus server scraping a worker."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from apps import basic
from conftest import REDIS_PORT, empty_redis, redis_db, require_server
from prometheus_client.parser import text_string_to_metric_families
from tls_servers import free_ports, require_program, stop_process
from workers import TESTS, children_of, wait_for

from worker_metrics_prometheus import parse_listen

ENV = {"PYTHONPATH": str(TESTS)}


def metrics_url(worker) -> str:
    worker.wait_log("Prometheus metrics on ")
    found = re.search(r"Prometheus metrics on (http://\S+/metrics)", worker.log())
    assert found, worker.log()
    return found.group(1)


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(url, timeout=5) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def value(samples: dict, metric: str, /, **labels: str) -> float:
    """The sample's value, 0 when the series does not exist (yet)."""
    return samples.get((metric, frozenset(labels.items())), 0.0)


def shown(samples: dict) -> str:
    """The task and worker series, one a line, for a failure's message."""
    lines = []
    for (metric, labels), count in samples.items():
        if metric.startswith(("celery_", "worker_")) and not metric.endswith(("_bucket", "_created")):
            lines.append(f"{metric}{dict(sorted(labels))} {count:g}")
    return "\n" + "\n".join(sorted(lines))


def start(workers, broker: str, pool: str, *args: str):
    concurrency = () if pool == "solo" else ("-c", "2")
    return workers.start(*concurrency, "--metrics-listen", "127.0.0.1:0", *args, pool=pool, broker=broker,
                         env=ENV)


@pytest.mark.parametrize("pool", ["prefork", "threads", "solo"])
def test_every_task_event_is_counted_under_the_celery_exporters_names_and_labels(workers, embedded_broker,
                                                                                 pool):
    worker = start(workers, embedded_broker, pool)
    name = worker.name
    url = metrics_url(worker)
    for n in range(3):
        basic.add.delay(n, n)
    basic.boom.delay()
    basic.always_retry.delay()  # retried twice, then fails with its Boom
    basic.app.send_task("apps.basic.no_such_task", (1,))
    basic.echo.apply_async(("late",), countdown=1, expires=0.5)  # expires while held for its ETA

    def task(metric: str, task_name: str, /, **labels: str) -> float:
        return value(samples, metric, name=task_name, hostname=name, queue_name="celery", **labels)

    def settled() -> bool:
        nonlocal samples
        samples = scrape(url)
        return (task("celery_task_succeeded_total", "apps.basic.add") == 3
                and task("celery_task_failed_total", "apps.basic.always_retry", exception="Boom") == 1
                and task("celery_task_failed_total", "apps.basic.boom", exception="Boom") == 1
                and value(samples, "celery_task_rejected_total", name="unknown", hostname=name,
                          queue_name="unknown") == 1
                and task("celery_task_revoked_total", "apps.basic.echo") == 1)

    samples: dict = {}
    try:
        wait_for(settled, timeout=20, message="every task's outcome in the metrics")
    except AssertionError:
        raise AssertionError(f"not every outcome was counted: {shown(samples)}") from None
    assert task("celery_task_received_total", "apps.basic.add") == 3
    assert task("celery_task_started_total", "apps.basic.add") == 3
    assert task("celery_task_runtime_count", "apps.basic.add") == 3
    assert 0 < task("celery_task_runtime_sum", "apps.basic.add") < 1
    assert task("celery_task_queue_wait_time_count", "apps.basic.add") == 3
    assert task("celery_task_runtime_bucket", "apps.basic.add", le="+Inf") == 3
    # a retry is a new message: three arrivals and starts, two retries, one failure
    assert task("celery_task_received_total", "apps.basic.always_retry") == 3
    assert task("celery_task_started_total", "apps.basic.always_retry") == 3
    assert task("celery_task_retried_total", "apps.basic.always_retry") == 2
    assert task("celery_task_succeeded_total", "apps.basic.boom") == 0
    assert task("celery_task_started_total", "apps.basic.echo") == 0  # it never ran
    # a name no task of this worker has is not a label: messages could make as many as they like
    assert not [key for key in samples if ("name", "apps.basic.no_such_task") in key[1]]
    assert value(samples, "celery_worker_up", hostname=name) == 1
    assert value(samples, "worker_pool_processes", hostname=name) == (1 if pool == "solo" else 2)
    # the last outcome is counted just before its task leaves the running set: read again
    wait_for(lambda: value(scrape(url), "celery_worker_tasks_active", hostname=name) == 0,
             message="no task running")
    assert value(samples, "worker_broker_reconnects_total", hostname=name) == 0
    assert value(samples, "process_resident_memory_bytes") > 0  # the main process's own
    assert worker.stop() == 0


def test_a_celery_projects_tasks_are_counted_under_their_celery_names(workers):
    """worker-celery: a Celery app's tasks, sent by a Celery client, run through Celery's tracer
    in the children; the main process counts them as for any task."""
    from celery import Celery

    require_server(REDIS_PORT, "Redis")
    broker, results = empty_redis(redis_db(3)), empty_redis(redis_db(4))
    env = {**ENV, "CELERY_BROKER_URL": broker, "CELERY_RESULT_BACKEND": results}
    worker = workers.start("-c", "2", "--metrics-listen", "127.0.0.1:0", app="apps.celery_proj",
                           pool="prefork", env=env)
    name = worker.name
    url = metrics_url(worker)
    client = Celery("client", broker=broker, backend=results)
    try:
        sums = [client.send_task("apps.celery_proj.tasks.add", (n, n)).get(timeout=10) for n in range(3)]
        assert sums == [0, 2, 4]
        with pytest.raises(Exception, match="boom"):
            client.send_task("apps.celery_proj.tasks.boom").get(timeout=10)
        assert client.send_task("apps.celery_proj.tasks.flaky", (2,)).get(timeout=10) == 2
    finally:
        client.close()
    labels = {"hostname": name, "queue_name": "celery"}
    expected = {("celery_task_succeeded_total", "add"): 3, ("celery_task_failed_total", "boom"): 1,
                ("celery_task_retried_total", "flaky"): 2, ("celery_task_succeeded_total", "flaky"): 1}

    def counted() -> dict[tuple[str, str], float]:
        samples = scrape(url)
        found = {}
        for metric, task in expected:
            extra = {"exception": "Boom"} if metric == "celery_task_failed_total" else {}
            task_name = f"apps.celery_proj.tasks.{task}"
            found[metric, task] = value(samples, metric, name=task_name, **labels, **extra)
        return found

    wait_for(lambda: counted() == expected, timeout=15, message=f"the counts {expected}")


@pytest.mark.parametrize("pool", ["prefork", "threads"])  # the worker queues the waiting ones; the pool does
def test_the_gauges_show_what_the_worker_holds_running_waiting_and_for_its_eta(workers, embedded_broker,
                                                                              tmp_path, pool):
    worker = workers.start("-c", "1", "--metrics-listen", "127.0.0.1:0", pool=pool, broker=embedded_broker,
                           env=ENV)
    name = worker.name
    url = metrics_url(worker)
    gate = tmp_path / "gate"
    basic.wait_for_path.delay(str(gate))
    basic.add.delay(1, 1)
    basic.add.delay(2, 2)
    basic.add.apply_async((3, 3), countdown=600)
    held = {"celery_worker_tasks_active": 1, "worker_tasks_waiting": 2, "worker_tasks_reserved": 3,
            "worker_tasks_eta_held": 1}

    def gauges() -> dict[str, float]:
        samples = scrape(url)
        return {metric: value(samples, metric, hostname=name) for metric in held}

    read: dict[str, float] = {}

    def reads(expected: dict[str, float]) -> bool:
        read.update(gauges())
        return read == expected

    def settle(expected: dict[str, float]) -> None:
        try:
            wait_for(lambda: reads(expected), timeout=15)
        except AssertionError:
            raise AssertionError(f"the gauges read {read}, not {expected}") from None

    settle(held)
    gate.touch()
    settle(dict(held, celery_worker_tasks_active=0, worker_tasks_waiting=0, worker_tasks_reserved=0))


def test_queue_labels_are_bounded_and_a_worker_without_the_option_loads_and_serves_nothing(
        workers, embedded_broker):
    from worker_metrics_prometheus.metrics import OTHER, QUEUE_LABELS

    queues = [f"q{n}" for n in range(QUEUE_LABELS + 5)]
    worker = workers.start("-Q", ",".join(queues), "--metrics-listen", "127.0.0.1:0", pool="threads",
                           broker=embedded_broker, env=ENV)
    url = metrics_url(worker)
    for queue in queues:
        basic.add.apply_async((1, 1), queue=queue)

    def received() -> dict[str, float]:
        return {dict(labels)["queue_name"]: count for (metric, labels), count in scrape(url).items()
                if metric == "celery_task_received_total"}

    wait_for(lambda: sum(received().values()) == len(queues), timeout=30, message="every task received")
    labels = received()
    assert len(labels) == QUEUE_LABELS + 1 and labels[OTHER] == 5

    loaded = subprocess.run([sys.executable, "-c", (
        "import sys\n"
        "from worker_core.plugins.manager import PluginManager\n"
        "assert PluginManager().has_plugin('prometheus')\n"
        "print(sorted(name for name in sys.modules if name.startswith('prometheus_client')))")],
        capture_output=True, text=True, timeout=60)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == "[]", "the plugin loads prometheus_client before its step starts"
    steps = subprocess.run([sys.executable, "-m", "worker_core", "steps", "-A", "apps.basic"],
                           capture_output=True, text=True, env=dict(os.environ, **ENV), cwd=TESTS, timeout=60)
    assert steps.returncode == 0, steps.stderr
    assert "Pool" in steps.stdout and "Metrics" not in steps.stdout
    with_option = subprocess.run([sys.executable, "-m", "worker_core", "steps", "-A", "apps.basic",
                                  "--metrics-listen", "9808"], capture_output=True, text=True,
                                 env=dict(os.environ, **ENV), cwd=TESTS, timeout=60)
    assert "serve Prometheus metrics on http://0.0.0.0:9808/metrics" in with_option.stdout


def test_the_hostname_label_can_be_left_out_of_every_series(workers, embedded_broker):
    worker = start(workers, embedded_broker, "threads", "--metrics-without-hostname")
    url = metrics_url(worker)
    basic.add.delay(1, 2)
    wait_for(lambda: value(scrape(url), "celery_task_succeeded_total", name="apps.basic.add",
                           queue_name="celery") == 1, message="the success counted without a hostname")
    samples = scrape(url)
    assert value(samples, "celery_worker_up") == 1
    assert value(samples, "worker_pool_processes") == 2
    assert not [key for key in samples if "hostname" in dict(key[1])], shown(samples)


def listening_inode(port: int) -> str:
    """The inode of the IPv4 socket listening on ``port`` (Linux /proc/net/tcp)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1].endswith(f":{port:04X}") and fields[3] == "0A":  # 0A: LISTEN
            return fields[9]
    raise AssertionError(f"nothing listens on port {port}")


def holds(pid: int, inode: str) -> bool:
    links = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            links.append(os.readlink(fd))
        except OSError:  # closed meanwhile
            continue
    return f"socket:[{inode}]" in links


def test_prefork_children_forked_after_the_server_opened_do_not_hold_its_port(workers, embedded_broker):
    worker = start(workers, embedded_broker, "prefork", "--max-tasks-per-child", "1")
    url = metrics_url(worker)
    inode = listening_inode(int(urllib.parse.urlsplit(url).port or 0))
    assert holds(worker.pid, inode)
    first = set(children_of(worker.pid))
    pids = {basic.pid.delay().get(timeout=20) for _ in range(4)}  # each child runs one task, then is replaced
    assert pids & first and pids - first, "no child was replaced"

    def replaced() -> bool:  # the new children, once their executor started (it closes the copy)
        children = children_of(worker.pid)
        new = len(children) == 2 and not set(children) & pids
        return new and not any(holds(child, inode) for child in children)

    wait_for(replaced, timeout=20, message="two new children, neither holding the metrics server's socket")
    name = worker.name
    # the results are stored by the children, before the main process counts the outcomes
    wait_for(lambda: value(scrape(url), "celery_task_succeeded_total", name="apps.basic.pid", hostname=name,
                           queue_name="celery") == 4, message="four successes counted")


@pytest.mark.parametrize(("text", "expected"), [
    ("9808", ("0.0.0.0", 9808)), (":9808", ("0.0.0.0", 9808)), ("127.0.0.1:0", ("127.0.0.1", 0)),
    ("[::1]:9808", ("::1", 9808)), (" localhost:80 ", ("localhost", 80)),
])
def test_listen_addresses_are_read_as_prometheus_users_write_them(text, expected):
    assert parse_listen(text) == expected


@pytest.mark.parametrize(("text", "why"), [
    ("nonsense", "must be PORT or HOST:PORT"), ("70000", "from 0 to 65535"), ("::1:9808", "in brackets"),
    ("[nope]:9808", "not an IPv6 address"), ("host:", "must be PORT or HOST:PORT"),
])
def test_a_bad_listen_address_names_what_is_wrong(text, why):
    with pytest.raises(ValueError, match=re.escape(why)):
        parse_listen(text)


def test_a_bad_or_busy_address_stops_the_worker_before_it_takes_a_task(workers, embedded_broker):
    bad = workers.start(pool="solo", broker=embedded_broker, ready=False,
                        env={**ENV, "WORKER_METRICS_LISTEN": "nonsense"})
    assert bad.process.wait(timeout=30) != 0
    assert ("WORKER_METRICS_LISTEN='nonsense' (--metrics-listen of plugin prometheus "
            "(worker-metrics-prometheus") in bad.log()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = workers.start("--metrics-listen", f"127.0.0.1:{port}", pool="solo", broker=embedded_broker,
                             ready=False, env=ENV)
        assert busy.process.wait(timeout=30) != 0
    assert (f"--metrics-listen 127.0.0.1:{port}: cannot listen there (Address already in use); choose a "
            "free port, or an address of this machine") in busy.log()
    assert " ready." not in busy.log()


# -- a real Prometheus server ------------------------------------------------------------------


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator:
    """Start a Prometheus server of the test's own scraping ``targets`` every 0.5 s."""
    program = require_program("prometheus")  # Debian: apt-get install prometheus
    started: list[tuple[subprocess.Popen, Any]] = []

    def start(targets: list[str]) -> str:
        config = tmp_path / "prometheus.yml"
        config.write_text(json.dumps({  # YAML reads JSON
            "global": {"scrape_interval": "500ms", "scrape_timeout": "400ms"},
            "scrape_configs": [{"job_name": "worker", "static_configs": [{"targets": targets}]}],
        }))
        address = f"127.0.0.1:{free_ports(1)[0]}"
        log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - closed once the server ends
        started.append((subprocess.Popen(
            [program, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
             f"--web.listen-address={address}"], stdout=log, stderr=subprocess.STDOUT), log))
        return f"http://{address}"

    yield start
    for process, log in started:
        stop_process(process, timeout=20)
        log.close()


def query(server: str, promql: str) -> list[dict]:
    url = f"{server}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            answer = json.load(response)
    except OSError:  # not listening yet
        return []
    assert answer["status"] == "success", answer
    return list(answer["data"]["result"])


def test_a_prometheus_server_scrapes_the_worker_and_answers_the_exporters_queries(
        workers, embedded_broker, prometheus):
    worker = start(workers, embedded_broker, "prefork")
    name = worker.name
    target = urllib.parse.urlsplit(metrics_url(worker)).netloc
    server = prometheus([target])
    for n in range(5):
        basic.add.delay(n, n)
    basic.boom.delay()

    def answer(promql: str) -> list[tuple[dict, float]]:
        return [(found["metric"], float(found["value"][1])) for found in query(server, promql)]

    wait_for(lambda: answer('up{job="worker"}') and answer('up{job="worker"}')[0][1] == 1, timeout=30,
             message="Prometheus to scrape the worker")
    succeeded = 'sum by (name, hostname, queue_name) (celery_task_succeeded_total{job="worker"})'
    # every series of a task exists from its first event on, at 0 until counted (rate() needs it)
    expected = {("apps.basic.add", name, "celery"): 5.0, ("apps.basic.boom", name, "celery"): 0.0}

    def by_series() -> dict[tuple[str, str, str], float]:
        return {(labels["name"], labels["hostname"], labels["queue_name"]): count
                for labels, count in answer(succeeded)}

    try:
        wait_for(lambda: by_series() == expected, timeout=30)
    except AssertionError:
        raise AssertionError(f"Prometheus answers {by_series()}, not {expected}") from None
    # the failure-rate alert of the exporter's mixin, over what this worker exported
    rate = ('sum(celery_task_failed_total{job="worker"}) / (sum(celery_task_failed_total{job="worker"}) '
            '+ sum(celery_task_succeeded_total{job="worker"}))')
    wait_for(lambda: answer(rate) and abs(answer(rate)[0][1] - 1 / 6) < 1e-9, timeout=30,
             message="the failure ratio in Prometheus")
    assert answer(f'celery_worker_up{{hostname="{name}"}}')[0][1] == 1
    histogram = 'sum(celery_task_runtime_count{job="worker", name="apps.basic.add"})'
    assert answer(histogram)[0][1] == 5
    started = time.monotonic()
    assert worker.stop() == 0
    wait_for(lambda: answer('up{job="worker"}')[0][1] == 0, timeout=30,
             message="Prometheus to see the stopped worker down")
    assert time.monotonic() - started < 30
