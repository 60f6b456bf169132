"""Running a worker as Celery's deployments run it: detached (``-D``) with its pid file, log file
and state file, killed and started again; in the foreground as a container runs it; and the pid
file's rules (one running worker per file, a stale one replaced)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REDIS_PORT, empty_redis, redis_db, require_server
from workers import TESTS, WorkerProcess, wait_for

from worker_core.cli.daemon import Pidfile, drop_privileges, parse_umask, without_detach
from worker_core.exceptions import ConfigurationError

pytestmark = pytest.mark.timeout(180)

HOST = socket.gethostname()
WORKERCTL = str(Path(sys.executable).parent / "workerctl")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def celery_env() -> dict[str, str]:
    require_server(REDIS_PORT, "Redis")
    env = {key: value for key, value in os.environ.items() if not key.startswith(("WORKER_", "CELERY"))}
    env.update(CELERY_BROKER_URL=empty_redis(redis_db(9)), CELERY_RESULT_BACKEND=empty_redis(redis_db(10)),
               CELERY_DEFAULT_QUEUE=f"daemon-{uuid.uuid4().hex[:8]}")
    return env


def client(env: dict[str, str]):
    from apps.celery_basic import client_app

    return client_app(broker_url=env["CELERY_BROKER_URL"], result_backend=env["CELERY_RESULT_BACKEND"],
                      task_default_queue=env["CELERY_DEFAULT_QUEUE"])


def answers(app, node: str) -> bool:
    """The node answers a ping (on Redis a broadcast reaches a worker only once it listens)."""
    return bool(app.control.ping(destination=[node], timeout=0.5))


@pytest.fixture
def detached(tmp_path: Path, celery_env: dict[str, str]) -> Iterator[list[str]]:
    """The command line of a detached worker, as a Celery deployment writes it with ``celery``
    replaced; whatever it left running is killed at the end."""
    command = [WORKERCTL, "-A", "apps.celery_basic", "worker", "--detach", "-n", "w1@%h", "-l", "INFO",
               "-P", "solo", f"--pidfile={tmp_path}/%n.pid", f"--logfile={tmp_path}/%n%I.log",
               f"--statedb={tmp_path}/%n.state"]
    yield command
    pidfile = tmp_path / "w1.pid"
    if pidfile.exists():
        try:
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
        except (ValueError, ProcessLookupError):
            pass


def test_a_detached_worker_killed_and_started_again_keeps_its_revoked_ids(
        detached: list[str], tmp_path: Path, celery_env: dict[str, str]) -> None:
    log, pidfile, state = tmp_path / "w1.log", tmp_path / "w1.pid", tmp_path / "w1.state"
    started = subprocess.run(detached, cwd=TESTS, env=celery_env, capture_output=True, text=True, timeout=60)
    assert started.returncode == 0 and started.stdout == "", started.stderr  # the daemon prints nothing here
    wait_for(lambda: log.exists() and f"w1@{HOST} ready." in log.read_text(), 60, message="the daemon ready")
    pid = int(pidfile.read_text())
    assert alive(pid) and os.getsid(pid) != os.getsid(0)  # detached: a session of its own

    app = client(celery_env)
    wait_for(lambda: answers(app, f"w1@{HOST}"), 30, message="the daemon answering")
    revoked = str(uuid.uuid4())
    app.control.revoke(revoked)
    wait_for(lambda: state.exists() and revoked in state.read_text(), 20, message="the revoke kept")

    os.kill(pid, signal.SIGKILL)  # no shutdown at all: only what was written already is kept
    wait_for(lambda: not alive(pid), 20, message="the daemon gone")
    assert pidfile.exists()  # stale now

    again = subprocess.run(detached, cwd=TESTS, env=celery_env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    wait_for(lambda: log.read_text().count(f"w1@{HOST} ready.") == 2, 60, message="the daemon ready again")
    assert "Loaded 1 revoked task id(s) and the logical clock" in log.read_text()
    second = int(pidfile.read_text())
    assert second != pid and alive(second)

    app.send_task("apps.basic.add", (1, 1), task_id=revoked)
    assert app.send_task("apps.basic.add", (2, 2)).get(timeout=30) == 4
    wait_for(lambda: f"Discarding revoked task: apps.basic.add[{revoked}] (revoked)" in log.read_text(), 20,
             message="the revoked task discarded")

    os.kill(second, signal.SIGTERM)
    wait_for(lambda: not alive(second), 30, message="the daemon stopped")
    assert not pidfile.exists()  # removed as it stopped
    assert "Warm shutdown" in log.read_text()


def test_a_second_worker_on_the_same_pid_file_is_refused(detached: list[str], tmp_path: Path,
                                                         celery_env: dict[str, str]) -> None:
    assert subprocess.run(detached, cwd=TESTS, env=celery_env, timeout=60).returncode == 0
    wait_for(lambda: (tmp_path / "w1.pid").exists(), 60, message="the pid file")
    pid = int((tmp_path / "w1.pid").read_text())
    twice = subprocess.run(detached, cwd=TESTS, env=celery_env, capture_output=True, text=True, timeout=60)
    assert twice.returncode == 2
    assert twice.stderr.strip() == (f"Error: --pidfile {tmp_path}/w1.pid: process {pid} holds it (is this "
                                    "worker running already?); stop it first, or give another --pidfile")
    assert int((tmp_path / "w1.pid").read_text()) == pid and alive(pid)


class ContainerProcess(WorkerProcess):
    """``workerctl`` run as a container runs ``celery``: the program itself, in the foreground."""

    program = (WORKERCTL,)


def test_a_kubernetes_style_foreground_command_line_from_celery_s_documentation(
        tmp_path: Path, celery_env: dict[str, str]) -> None:
    # Celery's worker guide: celery -A proj worker --loglevel=INFO --concurrency=10 -n worker1@%h
    command = ["-A", "apps.celery_basic", "worker", "--loglevel=INFO", "--concurrency=10", "-n", "worker1@%h"]
    worker = ContainerProcess(command, {**celery_env, "PYTHONUNBUFFERED": "1"}, tmp_path / "pod.log",
                              cwd=TESTS)
    try:
        wait_for(lambda: f"worker1@{HOST} ready." in worker.log(), 60, message="the pod's worker ready")
        assert "concurrency 10" in worker.log() and "prefork" in worker.log()
        assert client(celery_env).send_task("apps.basic.mul", (6, 7)).get(timeout=30) == 42
        assert worker.stop(signal.SIGTERM) == 0  # what the kubelet sends first
    finally:
        worker.kill()


# -- the pieces ----------------------------------------------------------------------------------------


def test_a_stale_or_broken_pid_file_is_replaced_and_removed_at_the_end(tmp_path: Path) -> None:
    path = tmp_path / "w.pid"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    for content in (f"{gone.pid}\n", "not a pid\n", f"{os.getpid()}"):
        path.write_text(content)
        pidfile = Pidfile(str(path))
        pidfile.acquire()
        assert path.read_text() == f"{os.getpid()}\n"
        pidfile.release()
        assert not path.exists()


def test_a_pid_file_in_a_missing_directory_names_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"cannot create it \(No such file or directory\); create"):
        Pidfile(str(tmp_path / "nowhere" / "w.pid")).acquire()


def test_the_detached_command_line_is_the_same_without_detach(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    argv = ["-A", "proj", "worker", "-D", "--detach", "--workdir", "sub", "--workdir=sub", "-c", "2", "--",
            "-D"]
    assert without_detach(argv) == ["-A", "proj", "worker", "--workdir", str(tmp_path),
                                    f"--workdir={tmp_path}", "-c", "2", "--", "-D"]


@pytest.mark.parametrize(("text", "umask"), [("0022", 0o22), ("022", 0o22), ("18", 18), ("0o77", 0o77)])
def test_umask_is_read_as_celery_reads_it(text: str, umask: int) -> None:
    assert parse_umask(text) == umask


def test_a_bad_umask_uid_or_gid_is_one_line() -> None:
    with pytest.raises(ConfigurationError, match="--umask must be a number, octal with a leading 0"):
        parse_umask("rw-r--r--")
    with pytest.raises(ConfigurationError, match="--uid no-such-user-here: no such user"):
        drop_privileges("no-such-user-here", None)
    with pytest.raises(ConfigurationError, match="--gid no-such-group-here: no such group"):
        drop_privileges(None, "no-such-group-here")


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can drop its privileges to another user")
def test_uid_and_gid_drop_the_privileges_of_a_process_started_as_root() -> None:
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child becomes nobody and says who it is
        os.close(read)
        try:
            drop_privileges("nobody", "nogroup")
            os.write(write, f"{os.getuid()} {os.getgid()} {os.getgroups()}".encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as reader:
        said = reader.read()
    os.waitpid(child, 0)
    assert said == "65534 65534 [65534]"
