"""``workerctl multi``: the nodes ``celery multi`` would make of a command line (checked against
Celery's own parser), and Celery's systemd example (``ExecStart``, ``ExecReload``, ``ExecStop``)
run as written with only the program's name changed."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REDIS_PORT, empty_redis, redis_db, require_server
from workers import TESTS, wait_for

from worker_core.cli.multi import PROGRAM, _worker_options
from worker_core.cli.multi.nodes import nodes_from, parse_args

pytestmark = pytest.mark.timeout(180)

HOST = socket.gethostname()


def celery_nodes(line: str) -> dict[str, dict[str, str | None]]:
    """The nodes ``celery multi`` makes of ``line``: each node's worker options as it passes them."""
    from celery.apps.multi import MultiParser, NamespacedOptionParser

    parser = NamespacedOptionParser(shlex.split(line))
    parser.parse()
    nodes = {}
    for node in MultiParser().parse(parser):
        words = shlex.split(" ".join(node.argv[1:]))
        nodes[node.name] = _options(words)
    return nodes


def our_nodes(line: str) -> dict[str, dict[str, str | None]]:
    flags, valued = _worker_options()
    nodes = {}
    for node in nodes_from(parse_args(shlex.split(line), flags, valued), PROGRAM):
        argv = node.argv
        nodes[node.name] = _options(argv[argv.index("--detach") + 1:])
    return nodes


def _options(words: list[str]) -> dict[str, str | None]:
    options: dict[str, str | None] = {}
    position = 0
    while position < len(words):
        word = words[position]
        position += 1
        if word.startswith("--"):
            name, has_value, value = word.partition("=")
            options[name] = value if has_value else None
        elif position < len(words) and not words[position].startswith("-"):
            options[word] = words[position]
            position += 1
        else:
            options[word] = None
    return options


@pytest.mark.parametrize("line", [
    "3 -c 3",
    "3 --range-prefix=worker -c 3",
    "image video data -c 3",
    "2 --hostname=worker.example.com -c 3",
    "foo@worker.example.com bar@worker.example.com -c 3",
    "foo@%h bar@%h",
    "10 -l INFO -Q:1-3 images,video -Q:4,5 data -Q default",
    "3 -c 3 -c:1 10",
    "image video data -c 3 -c:image 10",
    "5 -c 3 -c:1-3 10",
    "foo bar baz xuzzy -c 3 -c:foo,bar,baz 10",
    "w1 w2 -c:w1 4 -Q:w2 emails --pidfile=/var/run/celery/%n.pid --logfile=/var/log/celery/%n%I.log",
    "w1 --prefix=app- --suffix=box -E --time-limit=300 --concurrency=8 --loglevel=INFO",
    "w1 w2 -A proj --pidfile=/run/%h.pid --logfile=/log/%N-%d%I.log",
])
def test_nodes_and_their_options_are_those_celery_multi_makes(line: str) -> None:
    assert our_nodes(line) == celery_nodes(line)


def test_long_options_of_the_worker_take_their_value_after_a_space_too() -> None:
    (node,) = our_nodes("w1 --pidfile /tmp/%n.pid --without-mingle -E --logfile /tmp/%n.log").values()
    assert node["--pidfile"] == "/tmp/w1.pid" and node["--logfile"] == "/tmp/w1.log"
    assert "--without-mingle" in node and "-E" in node


def workerctl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "worker_core", *args], cwd=TESTS, capture_output=True,
                          text=True, timeout=120, env=env)


def test_names_show_expand_and_get_print_what_celery_multi_prints() -> None:
    assert workerctl("multi", "names", "3", "--range-prefix=worker").stdout.split() == [
        f"worker{n}@{HOST}" for n in (1, 2, 3)]
    shown = workerctl("multi", "show", "w1", "w2", "-c:w1", "4", "-A", "proj").stdout.splitlines()
    assert shown[0].startswith(f"{sys.executable} -m worker_core -A proj worker --detach -c 4")
    assert f"-n w2@{HOST}" in shown[1] and "-c" not in shown[1].split()
    expanded = workerctl("multi", "expand", "/run/%n-%h.pid", "w1", "w2").stdout.split()
    assert expanded == [f"/run/w1-w1@{HOST}.pid", f"/run/w2-w2@{HOST}.pid"]
    got = workerctl("multi", "get", f"w2@{HOST}", "w1", "w2", "-c", "3")
    assert got.returncode == 0 and got.stdout.startswith("-m worker_core worker --detach -c 3")
    assert workerctl("multi", "get", "nobody@nowhere", "w1").returncode == 1


def test_an_unknown_multi_command_gets_one_line_and_the_usage() -> None:
    done = workerctl("multi", "begin", "w1")
    assert done.returncode == 2 and "usage: workerctl multi start" in workerctl("multi", "help").stdout
    assert done.stderr.strip() == ("Error: multi: no command 'begin'; the commands are start, stop, "
                                   "stopwait, restart, kill, names, show, get, expand, help")


# -- Celery's systemd example ----------------------------------------------------------------------

#: Celery's documented unit (docs/userguide/daemonizing.rst), lines as written
EXEC_START = ("${CELERY_BIN} -A $CELERY_APP multi start $CELERYD_NODES "
              "--pidfile=${CELERYD_PID_FILE} --logfile=${CELERYD_LOG_FILE} "
              '--loglevel="${CELERYD_LOG_LEVEL}" $CELERYD_OPTS')
EXEC_STOP = ("${CELERY_BIN} multi stopwait $CELERYD_NODES "
             "--pidfile=${CELERYD_PID_FILE} --logfile=${CELERYD_LOG_FILE} "
             '--loglevel="${CELERYD_LOG_LEVEL}"')
EXEC_RELOAD = ("${CELERY_BIN} -A $CELERY_APP multi restart $CELERYD_NODES "
               "--pidfile=${CELERYD_PID_FILE} --logfile=${CELERYD_LOG_FILE} "
               '--loglevel="${CELERYD_LOG_LEVEL}" $CELERYD_OPTS')


@pytest.fixture
def unit(tmp_path: Path) -> Iterator[dict[str, str]]:
    """The environment file of Celery's example (/etc/conf.d/celery), with CELERY_BIN naming
    workerctl; the nodes' processes are killed at the end whatever happened."""
    require_server(REDIS_PORT, "Redis")
    broker, results = empty_redis(redis_db(7)), empty_redis(redis_db(8))
    env = {key: value for key, value in os.environ.items() if not key.startswith(("WORKER_", "CELERY"))}
    env.update(
        CELERYD_NODES="w1 w2",
        CELERY_BIN=str(Path(sys.executable).parent / "workerctl"),
        CELERY_APP="apps.celery_basic",
        CELERYD_MULTI="multi",
        CELERYD_OPTS="--time-limit=300 --concurrency=2",
        CELERYD_PID_FILE=str(tmp_path / "run" / "%n.pid"),
        CELERYD_LOG_FILE=str(tmp_path / "log" / "%n%I.log"),
        CELERYD_LOG_LEVEL="INFO",
        CELERY_BROKER_URL=broker,
        CELERY_RESULT_BACKEND=results,
        CELERY_DEFAULT_QUEUE=f"unit-{uuid.uuid4().hex[:8]}",
    )
    yield env
    for pidfile in (tmp_path / "run").glob("*.pid"):
        try:
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
        except (ValueError, ProcessLookupError):
            pass


def sh(line: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run a unit's Exec line as systemd's example does: /bin/sh -c '...', in WorkingDirectory."""
    return subprocess.run(["/bin/sh", "-c", line], cwd=TESTS, env=env, capture_output=True, text=True,
                          timeout=120)


def pids(tmp_path: Path) -> dict[str, int]:
    return {path.stem: int(path.read_text()) for path in (tmp_path / "run").glob("*.pid")}


def ready_lines(tmp_path: Path, node: str) -> int:
    log = tmp_path / "log" / f"{node}.log"
    return log.read_text().count(f"{node}@{HOST} ready.") if log.exists() else 0


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_celery_s_systemd_unit_starts_reloads_and_stops_the_nodes(unit: dict[str, str],
                                                                   tmp_path: Path) -> None:
    from apps.celery_basic import client_app

    started = sh(EXEC_START, unit)
    assert started.returncode == 0, started.stdout + started.stderr
    assert f"> w1@{HOST}: OK" in started.stdout and f"> w2@{HOST}: OK" in started.stdout
    wait_for(lambda: ready_lines(tmp_path, "w1") == 1 and ready_lines(tmp_path, "w2") == 1, 60,
             message="both nodes ready in their log files")
    first = pids(tmp_path)
    assert set(first) == {"w1", "w2"} and all(alive(pid) for pid in first.values())
    client = client_app(broker_url=unit["CELERY_BROKER_URL"], result_backend=unit["CELERY_RESULT_BACKEND"],
                        task_default_queue=unit["CELERY_DEFAULT_QUEUE"])
    assert client.send_task("apps.basic.hop", ([],)).get(timeout=30)[0] in {f"w1@{HOST}", f"w2@{HOST}"}

    reloaded = sh(EXEC_RELOAD, unit)
    assert reloaded.returncode == 0, reloaded.stdout + reloaded.stderr
    assert f"> Restarting node w1@{HOST}: OK" in reloaded.stdout
    wait_for(lambda: ready_lines(tmp_path, "w1") == 2 and ready_lines(tmp_path, "w2") == 2, 60,
             message="both nodes ready again")
    second = pids(tmp_path)
    assert not any(alive(pid) for pid in first.values()) and set(second.values()).isdisjoint(first.values())

    stopped = sh(EXEC_STOP, unit)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "> Waiting for 2 nodes -> " in stopped.stdout
    assert not any(alive(pid) for pid in second.values())  # stopwait returns once they are gone
    assert pids(tmp_path) == {}  # each removed its pid file as it stopped
    assert "Warm shutdown" in (tmp_path / "log" / "w1.log").read_text()
    assert f"> w1@{HOST}: DOWN" in sh(EXEC_STOP, unit).stdout  # nothing left to stop


def test_multi_kill_and_a_node_that_cannot_start(unit: dict[str, str], tmp_path: Path) -> None:
    unit.update(CELERYD_NODES="w1", CELERYD_OPTS="--concurrency=1 -P solo")
    assert sh(EXEC_START, unit).returncode == 0
    wait_for(lambda: ready_lines(tmp_path, "w1") == 1, 60, message="the node ready")
    (pid,) = pids(tmp_path).values()
    killed = sh("${CELERY_BIN} multi kill $CELERYD_NODES --pidfile=${CELERYD_PID_FILE}", unit)
    assert f"Sending KILL to node w1@{HOST} ({pid})" in killed.stdout
    wait_for(lambda: not alive(pid), 20, message="the node killed")
    # its pid file is stale now: the next start replaces it
    assert sh(EXEC_START, unit).returncode == 0
    wait_for(lambda: ready_lines(tmp_path, "w1") == 2, 60, message="the node started again")
    assert sh(EXEC_STOP, unit).returncode == 0
    unit.update(CELERYD_OPTS="-P eventlet")
    failed = sh(EXEC_START, unit)
    assert failed.returncode == 1 and f"> w1@{HOST}: * Child terminated with exit code 2" in failed.stdout
    assert "FAILED" in failed.stdout and "-P eventlet:" in failed.stderr
