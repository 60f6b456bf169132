"""redis-py's cluster client, and the one way commands reach a slot here: :class:`Router` sends
the commands for one slot to the primary that serves it, on one connection, in one round trip
(with ``WAIT`` for the replicas after them when asked), and follows the cluster as it changes.

- ``MOVED`` (the slot has a new primary: a failover, a finished migration): the slot map is
  updated and the command sent again to the new primary.
- ``ASK`` (the slot is being migrated and the key is already on the target): the command goes to
  the target, after ``ASKING``.
- ``TRYAGAIN`` (a script's keys are split between the two nodes of a migration): sent again
  after a short pause, for :data:`MIGRATION_PATIENCE` seconds at most.
- ``NOSCRIPT`` (a node that never ran the script: new, promoted, restarted): loaded there, sent
  again.
- A connection that fails, ``CLUSTERDOWN``, ``READONLY`` (the node became a replica): the slot
  map is read again from the cluster and :class:`NodeUnavailable` raised; a caller whose commands
  may run twice harmlessly asks to try again (``retry=True``), the others decide themselves.
- Out of memory, too few replicas (``min-replicas-to-write``), a busy or loading node:
  :class:`Refused`, a state the caller backs off from.

The names of redis-py this plugin relies on beyond its documented client methods
(``RedisCluster.nodes_manager`` with ``initialize``, ``move_slot``, ``get_node``,
``get_node_from_slot``, ``nodes_cache`` and ``slots_cache``; a connection's socket, ``_sock``, which
the subscriptions wait on) are used in this module only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
from redis import exceptions as errors

from worker_core.exceptions import BrokerStorageError

from .scripts import Script

__all__ = ["ClusterUnreachable", "NodeUnavailable", "Refused", "Router", "connect", "refusal", "socket_of"]

logger = logging.getLogger(__name__)

#: Seconds a command keeps being sent again while its slot is being migrated (TRYAGAIN).
MIGRATION_PATIENCE = 10.0
#: The most redirections (MOVED, ASK, NOSCRIPT) one command follows.
MAX_REDIRECTS = 8
#: The shortest time between two readings of the slot map.
REFRESH_INTERVAL = 0.25
#: Milliseconds a WAIT waits on a primary whose last writes no replica confirmed in time.
UNCONFIRMED_WAIT_MS = 10


class ClusterUnreachable(errors.ConnectionError):
    """No node of the cluster answers (none of the seeds, nor any node known before)."""


class NodeUnavailable(errors.ConnectionError):
    """The primary of a slot cannot be reached now (down, failing over, migrating, the cluster
    down); the slot map was read again, so the next try finds the new primary."""

    def __init__(self, message: str, slot: int | None = None) -> None:
        super().__init__(message)
        self.slot = slot


class Refused(BrokerStorageError):
    """A node refused a write for a while: out of memory, too few replicas, busy, loading."""

    def __init__(self, reason: str, slot: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.slot = slot


_REFUSALS = (
    ("OOM", "out of memory (maxmemory)"),
    ("NOREPLICAS", "too few replicas (min-replicas-to-write)"),
    ("BUSY", "busy running a script"),
    ("LOADING", "loading its data"),
    ("MASTERDOWN", "its primary is down"),
)


def refusal(exc: BaseException) -> str | None:
    """What ``exc`` says when it is a node refusing work for a while, else None."""
    if isinstance(exc, errors.OutOfMemoryError):
        return "Redis refuses work: out of memory (maxmemory)"
    if isinstance(exc, errors.BusyLoadingError):
        return "Redis refuses work: loading its data"
    if isinstance(exc, Refused):
        return exc.reason
    text = str(exc)
    code = getattr(exc, "status_code", None) or text.split(" ", 1)[0]
    for prefix, meaning in _REFUSALS:
        if code == prefix or text.startswith(prefix):
            return f"Redis refuses work: {meaning}"
    return None


def socket_of(connection: Any) -> Any:
    """The socket of a redis-py connection, None while it is not connected."""
    return getattr(connection, "_sock", None)


def connect(seeds: Sequence[tuple[str, int]], arguments: Mapping[str, Any]) -> Any:
    """A redis-py cluster client that found the cluster from ``seeds``; raises
    :class:`ClusterUnreachable` when no seed answers."""
    from redis.cluster import ClusterNode, RedisCluster

    try:
        return RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in seeds],
            require_full_coverage=False,
            **arguments,
        )
    except errors.RedisClusterException as exc:
        names = ", ".join(f"{host}:{port}" for host, port in seeds)
        raise ClusterUnreachable(f"no node of the Redis Cluster answers (seeds {names}): {exc}") from exc
    except (errors.ConnectionError, errors.TimeoutError) as exc:
        names = ", ".join(f"{host}:{port}" for host, port in seeds)
        raise ClusterUnreachable(f"cannot reach the Redis Cluster at {names}: {exc}") from exc


@attrs.frozen
class Sent:
    """What one :meth:`Router.run` got back: each command's reply, and how many replicas
    confirmed the writes (None: not asked)."""

    replies: list[Any]
    replicas: int | None
    node: str


class Router:
    """Sends each slot's commands to its primary (see the module docstring). Thread-safe: each call
    takes a connection of its own from the node's pool."""

    def __init__(self, client: Any, wait_for_replicas: int = 0, wait_timeout: float = 1.0) -> None:
        self.client = client
        self.wait_for_replicas = wait_for_replicas
        self.wait_ms = max(1, round(wait_timeout * 1000))
        self._scripts: dict[str, Script] = {}
        self._refreshed = 0.0
        self._lock = threading.Lock()
        #: primaries whose writes are not confirmed by enough replicas -> since when (monotonic)
        self._unconfirmed: dict[str, float] = {}

    # -- commands -------------------------------------------------------------------------------

    def script(self, script: Script, keys: Sequence[str], args: Iterable[Any]) -> tuple[Any, ...]:
        """The command that runs ``script`` (EVALSHA, loaded where it is missing)."""
        self._scripts.setdefault(script.sha, script)
        return ("EVALSHA", script.sha, len(keys), *keys, *args)

    def primary(self, slot: int) -> Any:
        """The node redis-py's slot map says serves ``slot``."""
        return self.client.nodes_manager.get_node_from_slot(slot)

    def node_name(self, slot: int) -> str:
        try:
            return str(self.primary(slot).name)
        except Exception:
            return "no node"

    def run(
        self, slot: int, commands: Sequence[tuple[Any, ...]], *, write: bool = True, retry: bool = False
    ) -> Sent:
        """Send ``commands`` (all for ``slot``) in one round trip to its primary, and their
        replies; redirections are followed (see the module docstring). ``write``: WAIT for the
        replicas afterwards when the transport asks for it. ``retry``: the commands may run
        twice, so a lost connection is tried once more (the slot map read again) before
        :class:`NodeUnavailable` is raised."""
        replies: list[Any] = [None] * len(commands)
        pending = list(range(len(commands)))
        asking: Any = None
        redirects, retried = 0, False
        patience = time.monotonic() + MIGRATION_PATIENCE
        pause = 0.02
        replicas: int | None = None
        name = "no node"
        while True:
            node = asking or self._primary_or_refresh(slot)
            name = str(node.name)
            try:
                found, confirmed = self._send(
                    node, [commands[index] for index in pending], asking is not None, write
                )
            except (errors.ConnectionError, errors.TimeoutError) as exc:
                self.refresh()
                if retry and not retried:
                    retried, asking = True, None
                    continue
                raise NodeUnavailable(f"node {name} (slot {slot}) cannot be reached: {exc}", slot) from exc
            if confirmed is not None:
                replicas = confirmed if replicas is None else min(replicas, confirmed)
            again, asking = [], None
            for index, reply in zip(pending, found, strict=True):
                if not isinstance(reply, Exception):
                    replies[index] = reply
                    continue
                again.append(index)
                if isinstance(reply, errors.MovedError):
                    self._moved(reply)
                elif isinstance(reply, errors.AskError):
                    asking = self._node(reply.host, reply.port)
                elif isinstance(reply, errors.TryAgainError):
                    if time.monotonic() > patience:
                        raise NodeUnavailable(
                            f"slot {slot} has been migrating for more than {MIGRATION_PATIENCE:g}s (TRYAGAIN "
                            f"from {name})",
                            slot,
                        ) from reply
                elif isinstance(reply, errors.NoScriptError):
                    self._load(node, commands[index])
                elif isinstance(reply, (errors.ClusterDownError, errors.ReadOnlyError)):
                    self.refresh()
                    raise NodeUnavailable(
                        f"node {name} (slot {slot}) cannot serve it now: {reply}", slot
                    ) from reply
                else:
                    reason = refusal(reply)
                    if reason is not None:
                        raise Refused(reason, slot) from reply
                    raise reply
            if not again:
                return Sent(replies, replicas if write and self.wait_for_replicas else None, name)
            if any(isinstance(found[pending.index(index)], errors.TryAgainError) for index in again):
                time.sleep(pause)  # the pause is the point: the migration moves the keys meanwhile
                pause = min(pause * 2, 0.5)
            else:
                redirects += 1
                if redirects > MAX_REDIRECTS:
                    raise NodeUnavailable(
                        f"slot {slot} was redirected {redirects} times without an answer (last node {name})",
                        slot,
                    )
            pending = again

    def _send(
        self, node: Any, commands: list[tuple[Any, ...]], asking: bool, write: bool
    ) -> tuple[list[Any], int | None]:
        client = self.client.get_redis_connection(node)
        pipe = client.pipeline(transaction=False)
        for command in commands:
            if asking:
                pipe.execute_command("ASKING")
            pipe.execute_command(*command)
        waits = write and self.wait_for_replicas > 0
        if waits:
            short = node.name in self._unconfirmed
            pipe.execute_command(
                "WAIT", self.wait_for_replicas, UNCONFIRMED_WAIT_MS if short else self.wait_ms
            )
        replies = pipe.execute(raise_on_error=False)
        confirmed = None
        if waits:
            last = replies.pop()
            confirmed = int(last) if not isinstance(last, Exception) else 0
            self._note(str(node.name), confirmed)
        if asking:
            replies = replies[1::2]
        return list(replies), confirmed

    def _note(self, name: str, confirmed: int) -> None:
        """Say when a primary's writes stop being confirmed by enough replicas, and when they are
        again; meanwhile each WAIT there is short, so a primary without replicas (one just
        promoted) does not hold every write for ``wait_timeout``."""
        if confirmed >= self.wait_for_replicas:
            since = self._unconfirmed.pop(name, None)
            if since is not None:
                logger.warning(
                    "Writes to primary %s are confirmed by %d replica(s) again, after %.1fs",
                    name,
                    confirmed,
                    time.monotonic() - since,
                )
            return
        if name not in self._unconfirmed:
            self._unconfirmed[name] = time.monotonic()
            logger.warning(
                "Writes to primary %s were confirmed by %d of the %d replica(s) asked for within "
                "wait_timeout=%gs: until replicas confirm them again (they are down, or behind), what is "
                "written there is lost if that primary fails, and each write waits %d ms at most for them",
                name,
                confirmed,
                self.wait_for_replicas,
                self.wait_ms / 1000,
                UNCONFIRMED_WAIT_MS,
            )

    # -- the slot map ---------------------------------------------------------------------------

    def _primary_or_refresh(self, slot: int) -> Any:
        try:
            return self.primary(slot)
        except errors.SlotNotCoveredError as exc:
            self.refresh()
            try:
                return self.primary(slot)
            except errors.SlotNotCoveredError:
                raise NodeUnavailable(f"slot {slot} is served by no node the cluster knows", slot) from exc

    def _moved(self, exc: errors.MovedError) -> None:
        self.client.nodes_manager.move_slot(exc)

    def _node(self, host: str, port: int) -> Any:
        from redis.cluster import ClusterNode

        found = self.client.nodes_manager.get_node(host=host, port=port)
        if found is None:
            found = ClusterNode(host, port)
            self.client.nodes_manager.nodes_cache[found.name] = found
        return found

    def _load(self, node: Any, command: tuple[Any, ...]) -> None:
        script = self._scripts.get(str(command[1])) if command and command[0] == "EVALSHA" else None
        if script is None:
            raise errors.NoScriptError(f"a node lost a script this transport did not send: {command[:2]!r}")
        self.client.get_redis_connection(node).script_load(script.source)

    def refresh(self) -> None:
        """Read the slot map again from the cluster (at most once every :data:`REFRESH_INTERVAL`
        seconds); raises :class:`ClusterUnreachable` when no node answers."""
        with self._lock:
            now = time.monotonic()
            if now - self._refreshed < REFRESH_INTERVAL:
                return
            self._refreshed = now
        try:
            self.client.nodes_manager.initialize()
        except (errors.RedisClusterException, errors.ConnectionError, errors.TimeoutError) as exc:
            raise ClusterUnreachable(f"no node of the Redis Cluster answers: {exc}") from exc

    def slot_map(self) -> dict[int, str]:
        """Slot -> the name of its primary, as redis-py knows it now (for the subscriptions)."""
        cache = self.client.nodes_manager.slots_cache
        return {slot: nodes[0].name for slot, nodes in list(cache.items()) if nodes}

    def node_client(self, name: str) -> Any:
        """A plain client of the node ``name`` (``host:port``)."""
        node = self.client.nodes_manager.get_node(node_name=name)
        if node is None:
            host, _, port = name.rpartition(":")
            node = self._node(host, int(port))
        return self.client.get_redis_connection(node)

    def close(self) -> None:
        try:
            self.client.close()
        except Exception as exc:
            logger.debug("error while closing the cluster client: %r", exc)
