"""A Redis Cluster of a test's own: ``redis-server`` processes in cluster mode on free ports
(each with its cluster bus on port + 10000), made one cluster by ``redis-cli --cluster create``
(three primaries and a replica each by default), never the shared Redis. The tests kill a primary
(its replica takes over), start it again (it comes back as a replica), and move a slot from one
primary to another as a resharding does; every process is stopped by its PID in ``stop``."""

from __future__ import annotations

import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import attrs
from workers import wait_for

__all__ = ["ClusterNode", "RedisCluster", "cluster_ports"]

#: how long a node may stay silent before the others call it failed (cluster-node-timeout): short
#: for quick failovers, long enough that a loaded machine does not fail nodes by itself
NODE_TIMEOUT_MS = 3000


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def cluster_ports(count: int) -> list[int]:
    """``count`` ports nobody listens on, each with its bus port (+ 10000) free too."""
    chosen: list[int] = []
    while len(chosen) < count:
        port = random.randint(20000, 54000)
        if port in chosen or port + 10000 in chosen:
            continue
        if _bindable(port) and _bindable(port + 10000):
            chosen.append(port)
    return chosen


@attrs.define
class ClusterNode:
    """One ``redis-server`` of the cluster."""

    port: int
    directory: Path
    tls: dict[str, str] | None = None
    process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        base = [
            "redis-server",
            "--bind",
            "127.0.0.1",
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            str(NODE_TIMEOUT_MS),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.directory),
            "--logfile",
            str(self.directory / "redis.log"),
        ]
        if self.tls is None:
            return [*base, "--port", str(self.port)]
        return [
            *base,
            "--port",
            "0",
            "--tls-port",
            str(self.port),
            "--tls-cluster",
            "yes",
            "--tls-replication",
            "yes",
            "--tls-cert-file",
            self.tls["cert"],
            "--tls-key-file",
            self.tls["key"],
            "--tls-ca-cert-file",
            self.tls["ca"],
            "--tls-auth-clients",
            "no",
        ]

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: the node dies as a crashed machine would, writing nothing more."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


class RedisCluster:
    """``primaries`` primaries with ``replicas`` replicas each, on 127.0.0.1."""

    def __init__(
        self, directory: Path, primaries: int = 3, replicas: int = 1, tls: dict[str, str] | None = None
    ) -> None:
        if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
            raise RuntimeError("redis-server and redis-cli are needed (Debian: apt-get install redis-server)")
        self.directory = directory
        self.primaries, self.replicas = primaries, replicas
        self.tls = tls
        ports = cluster_ports(primaries * (1 + replicas))
        self.nodes = [ClusterNode(port, directory / str(port), tls) for port in ports]

    # -- addresses ------------------------------------------------------------------------------

    @property
    def scheme(self) -> str:
        return "redis-cluster" if self.tls is None else "rediss-cluster"

    @property
    def url(self) -> str:
        """The broker URL naming every primary the cluster started with (any one would do)."""
        seeds = ",".join(f"127.0.0.1:{node.port}" for node in self.nodes[: self.primaries])
        return f"{self.scheme}://{seeds}/"

    def seed_url(self, port: int | None = None) -> str:
        """A URL naming one node only (the cluster client finds the others)."""
        return f"{self.scheme}://127.0.0.1:{port or self.nodes[0].port}/"

    def node(self, port: int) -> ClusterNode:
        return next(node for node in self.nodes if node.port == port)

    # -- running --------------------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> RedisCluster:
        try:
            for node in self.nodes:
                node.start()
            for node in self.nodes:
                wait_for(lambda node=node: self._answers(node.port), timeout, interval=0.05,
                         message=f"node {node.port} to answer")
            create = [
                "redis-cli",
                *self._cli_tls(),
                "--cluster",
                "create",
                *(f"127.0.0.1:{node.port}" for node in self.nodes),
                "--cluster-replicas",
                str(self.replicas),
                "--cluster-yes",
            ]
            done = subprocess.run(create, capture_output=True, text=True, timeout=timeout)
            if done.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed:\n{done.stdout}\n{done.stderr}")
            self.wait_healthy(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def kill(self, port: int) -> None:
        self.node(port).kill()

    def restart(self, port: int, timeout: float = 60.0) -> None:
        """Start a killed node again, from its nodes.conf: it rejoins (a former primary as a
        replica of the node that took over), and the cluster is healthy again."""
        node = self.node(port)
        node.start()
        wait_for(lambda: self._answers(port), timeout, interval=0.05, message=f"node {port} to answer again")
        self.wait_healthy(timeout)

    def add_node(self, replica_of: int | None = None, timeout: float = 60.0) -> int:
        """Start one more node and add it (``redis-cli --cluster add-node``) as a primary serving no
        slot yet, as a cluster grows, or as a replica of the primary ``replica_of``; its port."""
        (port,) = cluster_ports(1)
        node = ClusterNode(port, self.directory / str(port), self.tls)
        self.nodes.append(node)
        node.start()
        wait_for(lambda: self._answers(port), timeout, interval=0.05, message=f"node {port} to answer")
        existing = next(each for each in self.nodes if each.alive and each.port != port)
        add = ["redis-cli", *self._cli_tls(), "--cluster", "add-node", f"127.0.0.1:{port}",
               f"127.0.0.1:{existing.port}"]
        if replica_of is not None:
            add += ["--cluster-slave", "--cluster-master-id", self._node_id(replica_of)]
        done = subprocess.run(add, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster add-node failed:\n{done.stdout}\n{done.stderr}")

        def joined() -> bool:
            try:
                known = all(f"127.0.0.1:{port}" in str(self.call(each.port, "CLUSTER", "NODES"))
                            for each in self._live())
                return known and "cluster_state:ok" in str(self.call(port, "CLUSTER", "INFO"))
            except Exception:
                return False

        wait_for(joined, timeout, interval=0.05, message=f"every node to know node {port}")
        if replica_of is not None:
            wait_for(lambda: self.call(port, "INFO", "replication").get("master_link_status") == "up",
                     timeout, interval=0.05, message=f"node {port} to replicate {replica_of}")
        return port

    # -- what the cluster says ------------------------------------------------------------------

    def client(self, port: int) -> Any:
        import redis

        options: dict[str, Any] = {"socket_timeout": 5, "socket_connect_timeout": 2}
        if self.tls is not None:
            options.update(ssl=True, ssl_ca_certs=self.tls["ca"], ssl_check_hostname=False)
        return redis.Redis(host="127.0.0.1", port=port, **options)

    def call(self, port: int, *command: Any) -> Any:
        client = self.client(port)
        try:
            return client.execute_command(*command)
        finally:
            client.close()

    def _answers(self, port: int) -> bool:
        try:
            return bool(self.call(port, "PING"))
        except Exception:
            return False

    def _live(self) -> list[ClusterNode]:
        return [node for node in self.nodes if node.alive]

    def topology(self, port: int | None = None) -> list[tuple[int, int, int, list[int]]]:
        """``(first slot, last slot, primary port, replica ports)`` as a live node sees them."""
        port = port or self._live()[0].port
        ranges = []
        for entry in self.call(port, "CLUSTER", "SLOTS"):
            first, last, primary, *replicas = entry
            ranges.append((int(first), int(last), int(primary[1]), [int(replica[1]) for replica in replicas]))
        return sorted(ranges)

    def primary_ports(self) -> list[int]:
        return sorted({primary for _, _, primary, _ in self.topology()})

    def slot_of(self, key: str) -> int:
        return int(self.call(self._live()[0].port, "CLUSTER", "KEYSLOT", key))

    def primary_of_slot(self, slot: int) -> int:
        for first, last, primary, _ in self.topology():
            if first <= slot <= last:
                return primary
        raise LookupError(f"slot {slot} is served by no node")

    def replicas_of(self, primary: int) -> list[int]:
        for _, _, port, replicas in self.topology():
            if port == primary:
                return replicas
        return []

    def healthy(self) -> bool:
        """Every live node says the cluster is ok, knows every live node, and all agree on who
        serves each slot, each primary with its replicas connected."""
        live = self._live()
        try:
            views = []
            for node in live:
                info = self.call(node.port, "CLUSTER", "INFO")
                text = info.decode() if isinstance(info, bytes) else str(info)
                if "cluster_state:ok" not in text:
                    return False
                views.append(self.topology(node.port))
            if any(view != views[0] for view in views[1:]):
                return False
            ports = {port for _, _, primary, replicas in views[0] for port in (primary, *replicas)}
            if ports != {node.port for node in live}:
                return False
            for _, _, _, replicas in views[0]:
                for replica in replicas:
                    info = self.call(replica, "INFO", "replication")
                    if info.get("master_link_status") != "up":
                        return False
        except Exception:
            return False
        return True

    def wait_healthy(self, timeout: float = 60.0) -> None:
        wait_for(self.healthy, timeout, interval=0.05, message="the cluster to be healthy")

    def wait_primary_changed(self, slot: int, old: int, timeout: float = 60.0) -> int:
        """Wait until a node other than ``old`` serves ``slot`` (a replica took over); its port."""
        found: list[int] = []

        def changed() -> bool:
            try:
                port = self.primary_of_slot(slot)
            except Exception:
                return False
            if port == old:
                return False
            found.append(port)
            return True

        wait_for(changed, timeout, interval=0.05,
                 message=f"slot {slot} to be served by a node other than {old}")
        return found[-1]

    # -- resharding -----------------------------------------------------------------------------

    def migrate_slot(self, slot: int, target: int, batch: int = 100, pause: float = 0.0) -> int:
        """Move ``slot`` to the primary ``target`` as ``redis-cli --cluster reshard`` does:
        IMPORTING on the target, MIGRATING on the source, its keys moved ``batch`` at a time with
        MIGRATE (``pause`` seconds between batches, so clients meet the slot half moved), then
        the slot given to the target on every primary. How many keys moved."""
        source = self.primary_of_slot(slot)
        if source == target:
            return 0
        source_id = self._node_id(source)
        target_id = self._node_id(target)
        self.call(target, "CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        self.call(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        moved = 0
        while True:
            keys = self.call(source, "CLUSTER", "GETKEYSINSLOT", slot, batch)
            if not keys:
                break
            self.call(source, "MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys)
            moved += len(keys)
            if pause:
                time.sleep(pause)  # the behaviour under test: clients meet the slot half moved
        # the target first (it ends its importing state and claims the slot), then the source, then
        # the other primaries, as redis-cli --cluster reshard does
        for port in dict.fromkeys([target, source, *self.primary_ports()]):
            self.call(port, "CLUSTER", "SETSLOT", slot, "NODE", target_id)
        self.wait_healthy()
        return moved

    def _node_id(self, port: int) -> str:
        found = self.call(port, "CLUSTER", "MYID")
        return found.decode() if isinstance(found, bytes) else str(found)

    # -- helpers --------------------------------------------------------------------------------

    def _cli_tls(self) -> list[str]:
        if self.tls is None:
            return []
        return ["--tls", "--cacert", self.tls["ca"], "--cert", self.tls["cert"], "--key", self.tls["key"]]


def queues_on_primaries(cluster: RedisCluster, stem: str, count: int | None = None) -> list[str]:
    """Queue names ``<stem>-<n>``, one served by each primary (``count`` of them, by default one
    per primary): every key of a queue carries its name as hash tag, so this is its primary."""
    from redis.crc import key_slot

    ranges = cluster.topology()
    primaries = sorted({primary for _, _, primary, _ in ranges})[: count or None]
    found: dict[int, str] = {}
    n = 0
    while len(found) < len(primaries):
        name = f"{stem}-{n}"
        slot = key_slot(name.encode())
        owner = next(primary for first, last, primary, _ in ranges if first <= slot <= last)
        if owner in primaries and owner not in found:
            found[owner] = name
        n += 1
    return [found[primary] for primary in primaries]
