"""TLS servers of a test module's own, on free ports, with certificates the tests make
(``certs.py``): a ``redis-server`` and a RabbitMQ node (its own node name, ports, data and log
directories, no plugins). Each is stopped by the fixture that started it, by its own PID or node
name only; the shared Redis and RabbitMQ are never touched."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from workers import wait_for

__all__ = ["RabbitTlsNode", "RedisTlsServer", "free_ports", "require_program"]


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports nobody listens on right now (held open together while chosen)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def require_program(name: str, *also: str) -> str:
    """The path of ``name`` (looked for on PATH, then in ``also``); skips without it, except in CI
    where that is a failure."""
    found = shutil.which(name) or next((path for path in also if os.access(path, os.X_OK)), None)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not installed and CI is set")
        pytest.skip(f"{name} is not installed")
    return found


def stop_process(process: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    """End a server this test started: SIGTERM, then SIGKILL if it outlives ``timeout``."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout)


class RedisTlsServer:
    """``redis-server`` with TLS only (``--port 0``), serving ``cert`` signed by ``ca``."""

    def __init__(self, directory: Path, cert: Path, key: Path, ca: Path) -> None:
        self.directory = directory
        self.cert, self.key, self.ca = cert, key, ca
        (self.port,) = free_ports(1)
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 15.0) -> RedisTlsServer:
        program = require_program("redis-server")
        self.directory.mkdir(parents=True, exist_ok=True)
        self.log_path = self.directory / "redis.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [program, "--port", "0", "--tls-port", str(self.port), "--bind", "127.0.0.1",
                 "--tls-cert-file", str(self.cert), "--tls-key-file", str(self.key),
                 "--tls-ca-cert-file", str(self.ca), "--tls-auth-clients", "no",
                 "--save", "", "--appendonly", "no", "--dir", str(self.directory)],
                stdout=log, stderr=subprocess.STDOUT,
            )
        wait_for(self._answers, timeout, interval=0.05, message=f"redis-server on TLS port {self.port}")
        return self

    def _answers(self) -> bool:
        import redis

        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"redis-server exited with {self.process.returncode}:\n"
                                 f"{self.log_path.read_text(errors='replace')}")
        client = redis.Redis(host="localhost", port=self.port, ssl=True, ssl_ca_certs=str(self.ca),
                             socket_connect_timeout=1)
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False
        finally:
            client.close()

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)


_RABBITMQ_BIN = "/usr/lib/rabbitmq/bin"


def _rabbitmq_program(name: str) -> str:
    found = os.path.realpath(require_program(name, f"{_RABBITMQ_BIN}/{name}", f"/usr/sbin/{name}"))
    # Debian's /usr/sbin/rabbitmq-* switch to the rabbitmq user and drop the environment that
    # names this node: run the scripts they wrap.
    if os.path.basename(found) == "rabbitmq-script-wrapper":
        found = os.path.join(os.path.dirname(found), name)
    return found


class RabbitTlsNode:
    """A RabbitMQ node of its own (``tls-<uuid>@localhost``) with a plain AMQP listener and a TLS
    one serving ``cert`` signed by ``ca``; ``guest`` may log in from 127.0.0.1."""

    def __init__(self, directory: Path, cert: Path, key: Path, ca: Path) -> None:
        self.directory = directory
        self.cert, self.key, self.ca = cert, key, ca
        self.node = f"tls-{uuid.uuid4().hex[:12]}@localhost"
        self.amqp_port, self.tls_port, self.dist_port = free_ports(3)
        self.process: subprocess.Popen[bytes] | None = None
        self.vm_pid: int | None = None

    def _environment(self) -> dict[str, str]:
        d = self.directory
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            # the Erlang cookie is made here, not in the user's home
            "HOME": str(d / "home"),
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_PORT": str(self.amqp_port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(d / "advanced.config"),
            # the machine's rabbitmq-env.conf names the shared node: read an empty one instead
            "RABBITMQ_CONF_ENV_FILE": str(d / "rabbitmq-env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
            "RABBITMQ_LOG_BASE": str(d / "log"),
            "RABBITMQ_PID_FILE": str(d / "rabbitmq.pid"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }

    def start(self, timeout: float = 90.0) -> RabbitTlsNode:
        program = _rabbitmq_program("rabbitmq-server")
        d = self.directory
        for sub in ("home", "mnesia", "log"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        (d / "rabbitmq-env.conf").write_text("")
        (d / "enabled_plugins").write_text("[].\n")
        (d / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.amqp_port}\n"
            f"listeners.ssl.default = 127.0.0.1:{self.tls_port}\n"
            f"ssl_options.cacertfile = {self.ca}\n"
            f"ssl_options.certfile = {self.cert}\n"
            f"ssl_options.keyfile = {self.key}\n"
            "ssl_options.verify = verify_none\n"
            "ssl_options.fail_if_no_peer_cert = false\n"
        )
        self.log_path = d / "rabbitmq-server.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen([program], env=self._environment(), stdout=log,
                                            stderr=subprocess.STDOUT, cwd=d)
        wait_for(self._answers, timeout, interval=0.2, message=f"RabbitMQ node {self.node} on TLS port "
                 f"{self.tls_port}")
        pid_file = d / "rabbitmq.pid"
        if pid_file.exists():
            self.vm_pid = int(pid_file.read_text().strip() or 0) or None
        return self

    def _answers(self) -> bool:
        import amqp

        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"rabbitmq-server exited with {self.process.returncode}:\n"
                                 f"{self.log_path.read_text(errors='replace')[-5000:]}")
        connection = amqp.Connection(
            f"127.0.0.1:{self.tls_port}", userid="guest", password="guest", connect_timeout=2,
            ssl={"ca_certs": str(self.ca), "cert_reqs": ssl.CERT_REQUIRED, "server_hostname": "localhost"},
        )
        try:
            connection.connect()
            return True
        except (OSError, amqp.exceptions.AMQPError):
            return False
        finally:
            try:
                connection.collect()
            except Exception:
                pass

    def stop(self) -> None:
        if self.process is None:
            return
        try:
            subprocess.run([_rabbitmq_program("rabbitmqctl"), "-n", self.node, "stop"],
                           env=self._environment(), capture_output=True, timeout=60)
        except subprocess.TimeoutExpired:
            pass
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        if self.vm_pid is not None and self._is_this_node(self.vm_pid):
            os.kill(self.vm_pid, signal.SIGKILL)
        stop_process(self.process)

    def _is_this_node(self, pid: int) -> bool:
        # the PID of a VM that is gone may belong to another process by now
        try:
            return self.node.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False
