"""A RabbitMQ cluster of this machine's own: three nodes (own names, AMQP and distribution ports,
data and log directories, one Erlang cookie), joined to the first; a node is stopped by its own
name, never the shared server."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import time
import uuid
from pathlib import Path

import attrs
from tls_servers import _rabbitmq_program, free_ports
from workers import wait_for

__all__ = ["FailoverOutcome", "RabbitCluster", "failover_run"]


class _Node:
    def __init__(self, directory: Path, name: str, cookie: str) -> None:
        self.directory = directory
        self.node = f"{name}@localhost"
        self.amqp_port, self.dist_port = free_ports(2)
        self.cookie = cookie
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}//"

    def environment(self) -> dict[str, str]:
        d = self.directory
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "HOME": str(d / "home"),
            "RABBITMQ_NODENAME": self.node, "RABBITMQ_NODE_PORT": str(self.amqp_port),
            "RABBITMQ_DIST_PORT": str(self.dist_port), "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq.conf"),
            "RABBITMQ_CONF_ENV_FILE": str(d / "rabbitmq-env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(d / "mnesia"), "RABBITMQ_LOG_BASE": str(d / "log"),
            "RABBITMQ_PID_FILE": str(d / "rabbitmq.pid"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
            "RABBITMQ_CTL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }

    def start(self) -> None:
        d = self.directory
        for sub in ("home", "mnesia", "log"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        cookie = d / "home" / ".erlang.cookie"
        cookie.write_text(self.cookie)
        cookie.chmod(0o400)
        (d / "rabbitmq-env.conf").write_text("")
        (d / "enabled_plugins").write_text("[].\n")
        (d / "rabbitmq.conf").write_text(f"listeners.tcp.default = 127.0.0.1:{self.amqp_port}\n"
                                         "cluster_partition_handling = pause_minority\n")
        log = open(d / "server.log", "wb")  # noqa: SIM115 - the node's output for its life
        self.process = subprocess.Popen([_rabbitmq_program("rabbitmq-server")], env=self.environment(),
                                        stdout=log, stderr=subprocess.STDOUT, cwd=d)

    def ctl(self, *args: str, timeout: float = 120) -> str:
        done = subprocess.run([_rabbitmq_program("rabbitmqctl"), "-n", self.node, *args],
                              env=self.environment(), capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"rabbitmqctl -n {self.node} {' '.join(args)}: {done.stdout}{done.stderr}")
        return done.stdout

    def wait(self, timeout: float = 120) -> None:
        """Until the node takes AMQP connections (``await_startup`` fails before it registers)."""
        import socket

        def answers() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"RabbitMQ node {self.node} exited: see {self.directory / 'log'}")
            socket.create_connection(("127.0.0.1", self.amqp_port), 1).close()
            return True

        wait_for(answers, timeout, interval=0.2, message=f"RabbitMQ node {self.node} to take connections",
                 ignoring=(OSError,))

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        try:
            self.ctl("stop", timeout=60)
        except (RuntimeError, subprocess.TimeoutExpired):
            pass
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=30)

    def vm_pid(self) -> int:
        """The PID of the node's Erlang VM, as the node itself tells it."""
        return int(self.ctl("eval", "list_to_integer(os:getpid()).").strip())

    def kill(self) -> float:
        """Stop the node at once, as a crashed machine would: SIGKILL to its Erlang VM. Returns
        when (``time.time()``) the signal went."""
        pid = self.vm_pid()
        if b"beam" not in Path(f"/proc/{pid}/cmdline").read_bytes():
            raise RuntimeError(f"node {self.node} named PID {pid}, which is not an Erlang VM")
        killed = time.time()
        os.kill(pid, 9)
        if self.process is not None:
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        return killed


class RabbitCluster:
    """Three nodes of one cluster; ``urls`` lists their AMQP URLs."""

    def __init__(self, directory: Path, size: int = 3) -> None:
        tag = uuid.uuid4().hex[:8]
        cookie = secrets.token_hex(16).upper()
        self.nodes = [_Node(directory / f"node{i}", f"cluster{i}-{tag}", cookie) for i in range(size)]

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    def start(self) -> RabbitCluster:
        for node in self.nodes:
            node.start()
        for node in self.nodes:
            node.wait()
        first = self.nodes[0]
        for node in self.nodes[1:]:
            node.ctl("stop_app")
            node.ctl("join_cluster", first.node)
            node.ctl("start_app")
        return self

    def leader_of(self, queue: str) -> _Node:
        """The node that leads the quorum queue ``queue`` now."""
        def leader() -> _Node | None:
            for node in self.nodes:
                if node.process is None or node.process.poll() is not None:
                    continue
                try:
                    out = node.ctl("list_queues", "name", "leader", "--quiet", "--no-table-headers")
                except RuntimeError:
                    continue
                for line in out.splitlines():
                    parts = line.split()
                    if len(parts) == 2 and parts[0] == queue:
                        return next(n for n in self.nodes if n.node == parts[1])
            return None

        return wait_for(leader, 30, interval=0.5, message=f"a node to lead {queue!r}")

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.stop()


@attrs.frozen
class FailoverOutcome:
    """What a failover run saw: every task counted by the ledger."""

    tasks: int
    done: int
    duplicates: int
    killed: str
    recovery_seconds: float
    total_seconds: float
    workers_alive: int
    workers: int
    #: for each worker that lost its node: seconds until it had done a task through another
    reconnect_seconds: tuple[float, ...] = ()

    @property
    def lost(self) -> int:
        return self.tasks - self.done


def failover_run(cluster: RabbitCluster, directory: Path, ledger_url: str, *, tasks: int = 600,
                 worker_count: int = 2, concurrency: int = 4, task_seconds: float = 0.01,
                 timeout: float = 180.0) -> FailoverOutcome:
    """Send ``tasks`` to a quorum queue of ``cluster``, run ``worker_count`` workers on it (each
    connected first to another node, failing over to the others), kill the node leading the queue
    once a third is done, and count in the ledger what ran, until all ran or ``timeout``."""
    import sys

    import redis

    from worker_core import App

    tag = uuid.uuid4().hex[:8]
    queue, key = f"cluster-{tag}", f"cluster-ledger-{tag}"
    ledger = redis.Redis.from_url(ledger_url)
    bench_apps = Path(__file__).resolve().parent.parent / "bench" / "apps"
    urls = cluster.urls
    settings = {"task_default_queue": queue, "task_default_queue_type": "quorum",
                "broker_transport_options": {"confirm_publish": True}}
    producer = App("cluster-producer", broker_url=";".join(urls), **settings)
    for number in range(tasks):
        producer.send_task("cluster.work", (number,), ignore_result=True)
    leader = cluster.leader_of(queue)
    # the first worker starts on the leading node, the others on the next ones
    start = cluster.nodes.index(leader)
    processes = []
    for index in range(worker_count):
        first = (start + index) % len(urls)
        rotated = urls[first:] + urls[:first]
        path = os.pathsep.join([str(bench_apps), os.environ.get("PYTHONPATH", "")])
        env = dict(os.environ, PYTHONPATH=path,
                   WORKER_BROKER_URL=";".join(rotated), WORKER_TASK_DEFAULT_QUEUE=queue,
                   WORKER_TASK_DEFAULT_QUEUE_TYPE="quorum", WORKER_RESULT_BACKEND="disabled",
                   CLUSTER_LEDGER=ledger_url, CLUSTER_LEDGER_KEY=key, WORKER_TASK_IGNORE_RESULT="true",
                   CLUSTER_TASK_SECONDS=str(task_seconds))
        log = open(directory / f"worker-{index}.log", "wb")  # noqa: SIM115 - the worker's for its life
        processes.append(subprocess.Popen(
            [sys.executable, "-m", "worker_core", "worker", "-A", "cluster_app", "-P", "threads",
             "-c", str(concurrency), "-n", f"cluster{index}-{tag}@localhost", "-l", "INFO"],
            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=bench_apps))
    started = time.monotonic()
    try:
        wait_for(lambda: ledger.hlen(key) >= tasks // 3, timeout, interval=0.05,
                 message=f"the workers to start working (see {directory})")
        before = ledger.hlen(key)
        killed_wall = leader.kill()
        killed_at = time.monotonic() - (time.time() - killed_wall)
        recovered_at = None

        def all_done() -> bool:
            nonlocal recovered_at
            done = ledger.hlen(key)
            if recovered_at is None and done > before:
                # the first task done after the kill that a worker took after it (those already
                # running finish without the broker)
                recovered_at = time.monotonic()
            return done >= tasks

        try:
            wait_for(all_done, max(0.0, timeout - (time.monotonic() - started)), interval=0.05,
                     message="every task in the ledger")
        except AssertionError:
            pass  # the outcome counts what is missing
        finished = time.monotonic()
        time.sleep(1.0)  # a negative: room for the redelivery of a task that ran to land too
        counts = [int(v) for v in ledger.hvals(key)]
        alive = sum(1 for p in processes if p.poll() is None)
    finally:
        for process in processes:
            if process.poll() is None:
                process.terminate()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        ledger.delete(key)
    moved = [_moved_on(directory / f"worker-{index}.log", killed_wall) for index in range(worker_count)]
    return FailoverOutcome(
        tasks=tasks, done=len(counts), duplicates=sum(c - 1 for c in counts), killed=leader.node,
        recovery_seconds=(recovered_at or finished) - killed_at, total_seconds=finished - started,
        workers_alive=alive, workers=worker_count,
        reconnect_seconds=tuple(seconds for seconds in moved if seconds is not None))


_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): ")


def _moved_on(log: Path, killed: float) -> float | None:
    """Seconds from the kill until a worker that lost its node had done a task through another
    one (None: it did not lose its connection)."""
    from datetime import datetime

    lost = connected = False
    for line in log.read_text(errors="replace").splitlines():
        found = _STAMP.match(line)
        if found is None:
            continue
        stamp = datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if stamp < killed:
            continue
        if "Connection to broker lost" in line:
            lost = True
        elif lost and "Connected to" in line:
            connected = True
        elif connected and "succeeded" in line:
            return stamp - killed
    return float("inf") if lost else None
