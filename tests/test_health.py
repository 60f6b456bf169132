"""Health probes answered by the worker itself: liveness from its main loop's progress (a broker
outage never fails it), readiness with the reason it is not ready, over HTTP and through the
``workerctl health`` exec probe, the stall watchdog, and systemd's notifications; with a
redis-server of the test's own killed and started again, and a proxy that silently stops
forwarding the worker's connections."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import types
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from apps import basic
from faults import RedisServer, TcpProxy
from workers import TESTS, wait_for

from worker_core.health import (
    BOOTING,
    BROKER_BLOCKED,
    BROKER_DISCONNECTED,
    CONSUMER_STALLED,
    DRAINING,
    SERVING,
    STARTING,
    Health,
)
from worker_core.health.probe import evaluate

FAST_RETRY = '{"interval_start": 0.2, "interval_step": 0.2, "interval_max": 0.5}'
ENV = {"PYTHONPATH": str(TESTS), "WORKER_BROKER_TRANSPORT_OPTIONS": FAST_RETRY}


# -- the state, on its own -----------------------------------------------------------------------


def stand_in_worker() -> types.SimpleNamespace:
    return types.SimpleNamespace(stopping=False, ready=False, started_at=time.monotonic(), pid=os.getpid(),
                                 hostname="w@test")


def test_readiness_names_the_first_reason_that_applies_and_serving_once_none_does():
    worker = stand_in_worker()
    health = Health(worker)
    assert health.ready().reason == STARTING
    health.hold(BROKER_DISCONNECTED)
    assert (health.ready().ok, health.ready().reason) == (False, BROKER_DISCONNECTED)  # before starting
    health.release(BROKER_DISCONNECTED)
    worker.ready = True
    assert (health.ready().ok, health.ready().reason) == (True, SERVING)
    health.hold(CONSUMER_STALLED)
    health.hold(BROKER_BLOCKED)
    assert health.ready().reason == BROKER_BLOCKED  # the broker's state explains the stall
    health.hold("maintenance")  # a plugin's own reason comes after the known ones
    health.release(BROKER_BLOCKED)
    health.release(CONSUMER_STALLED)
    assert health.ready().reason == "maintenance"
    health.release("maintenance")
    worker.stopping = True
    assert (health.ready().ok, health.ready().reason) == (False, DRAINING)


def test_liveness_comes_from_the_loops_progress_and_booting_is_live():
    health = Health(stand_in_worker(), liveness_timeout=5)
    assert (health.live().ok, health.live().reason) == (True, BOOTING)
    assert not health.started().ok
    health.consumer_started()
    assert health.started().ok and health.live().ok
    later = health.progress + 6
    assert not health.live(later).ok and health.live(later).line() == "stuck for 6s"
    health.hold(BROKER_DISCONNECTED)  # not ready is not dead
    assert health.live(health.progress + 4).ok


def test_the_exec_probe_judges_a_state_file_by_its_age_and_its_process():
    state = {"version": 1, "pid": os.getpid(), "written": 100.0, "progress": 99.0, "liveness_timeout": 10.0,
             "started": True, "ready": False, "reason": BROKER_DISCONNECTED, "reason_since": 95.0}
    assert evaluate("live", state, 101.0) == (True, "live")
    assert evaluate("ready", state, 101.0) == (False, "broker-disconnected for 6s")
    assert evaluate("started", state, 101.0) == (True, "started")
    assert evaluate("live", state, 120.0)[0] is False  # the worker stopped writing it
    assert evaluate("ready", {**state, "ready": True, "reason": SERVING}, 111.5)[1].startswith("unknown")
    assert evaluate("live", {**state, "written": 119.0}, 120.0) == (
        False, "stuck: the main loop made no progress for 21s")
    assert evaluate("live", state, 101.0, pid_alive=False)[0] is False
    assert evaluate("live", {**state, "started": False}, 101.0) == (True, "booting")
    assert evaluate("started", {**state, "started": False}, 101.0) == (False, "booting")


# -- a real worker -------------------------------------------------------------------------------


def probe_url(worker) -> str:
    worker.wait_log("Health probes on ")
    found = re.search(r"Health probes on (https?://\S+) ", worker.log())
    assert found, worker.log()
    return found.group(1)


def get(url: str, **kwargs) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5, **kwargs) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def exec_probe(check: str, path: Path) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "worker_core", "health", check, "--file", str(path)],
                          capture_output=True, text=True, timeout=30)
    return done.returncode, done.stdout.strip()


def kill(server: RedisServer) -> None:
    """SIGKILL the test's own redis-server (never the shared one)."""
    assert server.process is not None
    server.process.kill()
    server.process.wait(timeout=10)
    server.process = None


@pytest.fixture
def redis_server(tmp_path: Path):
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()


@pytest.mark.timeout(120)
def test_a_killed_broker_makes_the_worker_not_ready_within_seconds_and_never_not_live(
        workers, redis_server, tmp_path):
    state = tmp_path / "health.json"
    worker = workers.start("-c", "2", "--health-listen", "127.0.0.1:0", "--health-file", str(state),
                           "--liveness-timeout", "8", pool="threads", broker=redis_server.url, env=ENV)
    url = probe_url(worker)
    wait_for(lambda: get(f"{url}/readyz") == (200, "serving\n"), message="the worker to be ready")
    assert get(f"{url}/livez") == (200, "live\n")
    assert get(f"{url}/startupz")[0] == 200
    assert exec_probe("ready", state) == (0, "ready: serving")
    kill(redis_server)
    killed = time.monotonic()
    wait_for(lambda: get(f"{url}/readyz")[1].startswith("broker-disconnected"), timeout=5,
             message="/readyz to say broker-disconnected")
    assert get(f"{url}/readyz")[0] == 503
    code, line = exec_probe("ready", state)
    assert code == 1 and line.startswith("not ready: broker-disconnected"), line
    # The outage lasts past the liveness timeout (8 s): this wait is the behaviour under test.
    while time.monotonic() - killed < 10:
        assert get(f"{url}/livez") == (200, "live\n")
        assert exec_probe("live", state) == (0, "live: live")
        time.sleep(0.5)  # probed twice a second through the outage under test
    assert "disconnected for" in get(f"{url}/readyz")[1]
    redis_server.start()  # on the same port
    wait_for(lambda: get(f"{url}/readyz") == (200, "serving\n"), timeout=30,
             message="the worker to be ready again")
    assert exec_probe("ready", state) == (0, "ready: serving")
    assert worker.process.poll() is None  # no restart: the same process throughout
    basic.app.conf.update(broker_url=redis_server.url, result_backend=None)
    try:
        basic.record.delay(str(tmp_path / "ran"), "after")
        wait_for(lambda: basic.lines(tmp_path / "ran") == ["after"], timeout=20, message="a task after it")
    finally:
        basic.app.close()
    assert worker.stop() == 0
    assert not state.exists()  # removed once it stopped: the probe says so
    assert exec_probe("live", state)[0] == 1


def brpop_port(server: RedisServer) -> int:
    """The port (as the server sees it) of the connection on which the worker waits in BRPOP,
    once it waits there."""
    import redis

    client = redis.Redis(port=server.port)

    def waiting() -> int | None:
        for entry in client.client_list():
            if entry["cmd"] == "brpop" and "b" in entry["flags"]:
                return int(entry["addr"].rpartition(":")[2])
        return None

    try:
        return int(wait_for(waiting, timeout=20, message="the worker to wait in BRPOP"))
    finally:
        client.close()


@pytest.mark.timeout(120)
def test_a_consumer_whose_connection_went_silent_is_detected_as_stalled_and_exits_when_asked(
        workers, redis_server, tmp_path):
    proxy = TcpProxy("127.0.0.1", redis_server.port)
    through = f"redis://127.0.0.1:{proxy.port}/0"
    state = tmp_path / "health.json"
    try:
        worker = workers.start("-c", "2", "--without-heartbeat", "--health-file", str(state),
                               "--stall-timeout", "2", "--stall-exit", pool="threads", broker=through,
                               env=ENV)
        basic.app.conf.update(broker_url=redis_server.url, result_backend=None)
        basic.record.delay(str(tmp_path / "ran"), "before")
        wait_for(lambda: basic.lines(tmp_path / "ran") == ["before"], timeout=20, message="a first task")
        wait_for(lambda: exec_probe("ready", state) == (0, "ready: serving"), message="ready")
        # an idle worker with nothing waiting is not stalled, however long it waits (twice the timeout)
        time.sleep(4.5)  # the behaviour under test: a long idle wait
        assert exec_probe("ready", state) == (0, "ready: serving")
        # the consumer's connection stays open and carries nothing more (the worker's others work)
        proxy.freeze(brpop_port(redis_server))
        for n in range(3):
            basic.record.delay(str(tmp_path / "ran"), f"after-{n}")
        worker.wait_log("consumer: stalled: ", timeout=30)
        # The BRPOP the worker had sent takes the first message into its silent connection (see
        # "Brokers": that message waits in the socket); the other two wait in the queue.
        waiting = re.search(r"consumer: stalled: (\d+) message\(s\) wait on celery", worker.log())
        assert waiting and waiting.group(1) == "2", worker.log()
        # --stall-exit: it stops on its own, with status 1, so that it is replaced (closing the silent
        # connection would wait on it: the stop ends STOP_GRACE seconds after the drain at most)
        assert worker.process.wait(timeout=30) == 1
        assert "not ready until it takes one (--stall-exit: stopping, so that it is replaced)" in worker.log()
        assert basic.lines(tmp_path / "ran") == ["before"]
    finally:
        basic.app.close()
        proxy.close()
    # the two are still in the broker for the worker that replaces this one
    import redis

    client = redis.Redis(port=redis_server.port)
    try:
        assert client.llen("celery") == 2
    finally:
        client.close()


def test_a_stalled_consumer_is_not_ready_and_ready_again_once_it_takes_messages(workers, redis_server,
                                                                                 tmp_path):
    proxy = TcpProxy("127.0.0.1", redis_server.port)
    through = f"redis://127.0.0.1:{proxy.port}/0"
    try:
        worker = workers.start("-c", "1", "--without-heartbeat", "--health-listen", "127.0.0.1:0",
                               "--stall-timeout", "1", pool="threads", broker=through, env=ENV)
        url = probe_url(worker)
        basic.app.conf.update(broker_url=redis_server.url, result_backend=None)
        proxy.freeze(brpop_port(redis_server))
        # the first goes into the worker's silent connection (its BRPOP in flight), the second waits
        basic.record.delay(str(tmp_path / "ran"), "held")
        basic.record.delay(str(tmp_path / "ran"), "waiting")
        wait_for(lambda: get(f"{url}/readyz")[1].startswith("consumer-stalled"), timeout=30,
                 message="/readyz to say consumer-stalled")
        assert get(f"{url}/readyz")[0] == 503
        assert get(f"{url}/livez") == (200, "live\n")  # stalled is not dead: its loop turns
        proxy.restore()  # the frozen connection carries what it held back
        wait_for(lambda: sorted(basic.lines(tmp_path / "ran")) == ["held", "waiting"], timeout=30,
                 message="both tasks to run")
        wait_for(lambda: get(f"{url}/readyz") == (200, "serving\n"), timeout=15, message="ready again")
        worker.wait_log("consumer: takes messages again after its stall")
        assert worker.process.poll() is None
    finally:
        basic.app.close()
        proxy.close()


def test_readiness_says_starting_then_draining_while_warm_shutdown_waits_for_a_task(workers, tmp_path,
                                                                                   embedded_broker):
    state = tmp_path / "health.json"
    gate = tmp_path / "gate"
    worker = workers.start("--health-file", str(state), "-c", "1", pool="threads", broker=embedded_broker,
                           env=ENV, ready=False)
    wait_for(state.exists, timeout=30, message="the state file")
    worker.wait_ready()
    wait_for(lambda: exec_probe("ready", state)[0] == 0, message="ready")
    basic.wait_for_path.delay(str(gate))
    worker.wait_log("Task apps.basic.wait_for_path")
    worker.signal(signal.SIGTERM)
    wait_for(lambda: exec_probe("ready", state)[1].startswith("not ready: draining"), timeout=10,
             message="draining")
    assert exec_probe("live", state) == (0, "live: live")  # draining is alive
    gate.touch()
    assert worker.process.wait(timeout=30) == 0
    assert not state.exists()


def test_the_exec_probe_imports_neither_the_app_nor_its_tasks_nor_the_command_line_library(tmp_path):
    """``workerctl health`` runs before the command group is imported: the interpreter, the
    package's root and the state file's reader, nothing else of the worker (its time, with the
    interpreter's start, is in bench/health_probe.py: tens of milliseconds)."""
    state = tmp_path / "health.json"
    from worker_core.health import statefile

    now = time.monotonic()
    statefile.write(str(state), {"pid": os.getpid(), "written": now, "progress": now,
                                 "liveness_timeout": 60.0, "started": True, "ready": True,
                                 "reason": "serving", "reason_since": now})
    script = ("import sys; sys.argv = ['workerctl', 'health', 'ready', '--file', sys.argv[1]]\n"
              "from worker_core.cli import run\n"
              "try:\n    run()\nexcept SystemExit as exc:\n    code = exc.code\n"
              "print(code, sorted(sys.modules))")
    done = subprocess.run([sys.executable, "-c", script, str(state)], capture_output=True, text=True,
                          cwd=TESTS, timeout=30)
    assert done.returncode == 0, done.stderr
    first, _, modules_text = done.stdout.strip().rpartition("\n")[2].partition(" ")
    modules = set(eval(modules_text))
    assert first == "0" and "ready: serving" in done.stdout
    ours = {name for name in modules if name.startswith("worker_core")}
    assert ours == {"worker_core", "worker_core.cli", "worker_core.cli.collector", "worker_core.health",
                    "worker_core.health.probe", "worker_core.health.statefile"}
    for heavy in ("click", "kombu", "attrs", "pluggy", "apps", "apps.basic", "celery", "ssl"):
        assert heavy not in modules


def test_the_probes_answer_on_the_metrics_listener_behind_tls_and_basic_authentication(workers, tmp_path,
                                                                                         embedded_broker):
    import ssl

    from certs import make_authority

    authority = make_authority(tmp_path / "ca", "probe-ca")
    issued = authority.issue("worker", hosts=("127.0.0.1",))
    worker = workers.start("--metrics-listen", "127.0.0.1:0", "--http-certfile", str(issued.cert),
                           "--http-keyfile", str(issued.key), "--http-user", "scraper", pool="threads",
                           broker=embedded_broker, env={**ENV, "WORKER_HTTP_PASSWORD": "s3cret-pass"})
    worker.wait_log("Prometheus metrics on https://127.0.0.1:")
    url = re.search(r"Prometheus metrics on (https://\S+)/metrics", worker.log()).group(1)
    context = ssl.create_default_context(cafile=str(authority.cert))
    assert get(f"{url}/readyz", context=context) == (200, "serving\n")  # probes need no password
    assert get(f"{url}/livez", context=context) == (200, "live\n")
    assert get(f"{url}/metrics", context=context)[0] == 401
    wrong = urllib.request.Request(f"{url}/metrics", headers={"Authorization": "Basic c2NyYXBlcjpub3Bl"})
    assert get(wrong, context=context)[0] == 401
    import base64

    token = base64.b64encode(b"scraper:s3cret-pass").decode()
    right = urllib.request.Request(f"{url}/metrics", headers={"Authorization": f"Basic {token}"})
    status, body = get(right, context=context)
    assert status == 200 and "celery_worker_up" in body
    with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain HTTP is not answered
        urllib.request.urlopen(url.replace("https://", "http://") + "/livez", timeout=5)
    assert "s3cret-pass" not in worker.log()  # the password is hidden where options are shown
    assert get(f"{url}/readyz", context=context) == (200, "serving\n")  # a failed handshake hurt nothing


def test_a_client_certificate_is_required_when_a_client_ca_is_given(workers, tmp_path, embedded_broker):
    import ssl

    from certs import make_authority

    authority = make_authority(tmp_path / "ca", "probe-ca")
    issued = authority.issue("worker", hosts=("127.0.0.1",))
    client = authority.issue("prometheus", server=False)
    worker = workers.start("--health-listen", "127.0.0.1:0", "--http-certfile", str(issued.cert),
                           "--http-keyfile", str(issued.key), "--http-client-cafile", str(authority.cert),
                           pool="solo", broker=embedded_broker, env=ENV)
    url = probe_url(worker)
    anonymous = ssl.create_default_context(cafile=str(authority.cert))
    with pytest.raises((urllib.error.URLError, ConnectionError, ssl.SSLError)):
        urllib.request.urlopen(f"{url}/livez", timeout=5, context=anonymous).read()
    known = ssl.create_default_context(cafile=str(authority.cert))
    known.load_cert_chain(str(client.cert), str(client.key))
    assert get(f"{url}/livez", context=known) == (200, "live\n")


@pytest.mark.parametrize(("args", "env", "message"), [
    (("--stall-exit",), {}, "--stall-exit needs --stall-timeout SECONDS"),
    (("--http-keyfile", "/tmp/key.pem"), {}, "--http-keyfile needs --http-certfile"),
    (("--http-user", "me"), {}, "--http-user needs --http-password too"),
    (("--health-file", "/no/such/dir/health.json"), {}, "the directory /no/such/dir does not exist"),
    (("--stall-timeout", "0"), {}, "must be a number of seconds above 0"),
    ((), {"WORKER_LIVENESS_TIMEOUT": "soon"}, "must be a number of seconds (got 'soon')"),
])
def test_bad_health_options_stop_the_worker_before_it_starts(workers, embedded_broker, args, env, message):
    worker = workers.start(*args, pool="solo", broker=embedded_broker, env={**ENV, **env}, ready=False)
    assert worker.process.wait(timeout=30) != 0
    assert message in worker.log()
    assert " ready." not in worker.log()


def test_systemd_hears_ready_its_status_watchdog_pings_and_stopping(workers, tmp_path, embedded_broker):
    path = str(tmp_path / "notify.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(path)
    listener.settimeout(0.5)
    heard: list[str] = []

    def listen(until: Callable[[], bool], what: str, timeout: float = 20) -> None:
        def heard_enough() -> bool:
            if not until():
                try:
                    heard.extend(listener.recv(4096).decode().splitlines())
                except TimeoutError:
                    pass
            return until()

        wait_for(heard_enough, timeout, interval=0,
                 message=lambda: f"systemd to hear {what} (heard: {heard})")

    def hear(line: str) -> None:
        listen(lambda: line in heard, repr(line))

    try:
        worker = workers.start(pool="threads", broker=embedded_broker,
                               env={**ENV, "NOTIFY_SOCKET": path, "WATCHDOG_USEC": "1000000"})
        hear("READY=1")
        hear("STATUS=serving")
        pings = heard.count("WATCHDOG=1")
        # a ping every half WatchdogSec
        listen(lambda: heard.count("WATCHDOG=1") >= pings + 2, "two more watchdog pings", 10)
        worker.signal(signal.SIGTERM)
        hear("STOPPING=1")
        assert worker.process.wait(timeout=30) == 0
    finally:
        listener.close()


def test_workerctl_lists_the_health_command_and_explains_it():
    listed = subprocess.run([sys.executable, "-m", "worker_core", "--help"], capture_output=True, text=True,
                            timeout=30)
    assert "health" in listed.stdout
    usage = subprocess.run([sys.executable, "-m", "worker_core", "health", "--help"], capture_output=True,
                           text=True, timeout=30)
    assert usage.returncode == 0 and "live|ready|started" in usage.stdout
    bad = subprocess.run([sys.executable, "-m", "worker_core", "health", "alive", "--file", "x"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "must be one of live, ready, started (got 'alive')" in bad.stderr
    nofile = subprocess.run([sys.executable, "-m", "worker_core", "health", "ready"], capture_output=True,
                            text=True, timeout=30, env={k: v for k, v in os.environ.items()
                                                        if k != "WORKER_HEALTH_FILE"})
    assert nofile.returncode == 2 and "--file PATH or WORKER_HEALTH_FILE" in nofile.stderr
