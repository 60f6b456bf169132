"""Subscriptions to pub/sub channels across the cluster: with sharded pub/sub (``SSUBSCRIBE``,
Redis 7), each channel on the primary serving its slot, one connection per such primary; without
it, every channel on one node (``SUBSCRIBE``: the cluster carries every ``PUBLISH`` to every node).

The cluster moves channels about: a failover closes the old primary's connection, and a
migrated slot's shard channels are unsubscribed by the server (``sunsubscribe``) or answered with
``MOVED``. Each of those marks the subscriptions stale; :meth:`Subscriber.reconcile` (called by
the transport at every loop turn while stale, and every ``polling_interval`` anyway) reads the
slot map again and subscribes where each channel now lives. A channel is reported ``subscribed``
once its server confirmed it: what was published before then reached nobody, so the transport
looks at that queue once more.
"""

from __future__ import annotations

import logging
import select
from collections.abc import Callable, Iterable
from typing import Any

from redis import exceptions as errors

from .cluster import Router, socket_of
from .keys import key_slot

__all__ = ["Subscriber"]

logger = logging.getLogger(__name__)

#: ``on_event(kind, channel, data)``: kind is ``message`` or ``subscribed``
OnEvent = Callable[[str, str, bytes], None]


class _Link:
    """One subscriber connection to one node, and the channels subscribed (or asked) there."""

    def __init__(self, name: str, pool: Any) -> None:
        self.name = name
        self.pool = pool
        self.connection = pool.get_connection()
        self.channels: set[str] = set()

    def fileno(self) -> int | None:
        sock = socket_of(self.connection)
        return None if sock is None else sock.fileno()

    def close(self) -> None:
        try:
            self.connection.disconnect()
        finally:
            try:
                self.pool.release(self.connection)
            except Exception as exc:
                logger.debug("could not give a subscriber connection back to its pool: %r", exc)


class Subscriber:
    """The channels this connection listens to, wherever the cluster serves them."""

    def __init__(self, router: Router, sharded: bool, on_event: OnEvent) -> None:
        self.router = router
        self.sharded = sharded
        self.on_event = on_event
        self._wanted: set[str] = set()
        self._links: dict[str, _Link] = {}
        #: channel -> the link it was asked on
        self._where: dict[str, _Link] = {}
        #: the subscriptions may not be where the cluster serves them: check them all
        self.stale = False
        #: channels were asked for or dropped since the last round
        self.changed = False
        self.failure: BaseException | None = None

    @property
    def subscribe_command(self) -> str:
        return "SSUBSCRIBE" if self.sharded else "SUBSCRIBE"

    def set_channels(self, channels: Iterable[str]) -> None:
        wanted = set(channels)
        if wanted != self._wanted:
            self._wanted = wanted
            self.changed = True

    @property
    def due(self) -> bool:
        """Whether :meth:`reconcile` has something to do."""
        return self.stale or self.changed

    # -- where each channel goes ----------------------------------------------------------------

    def _home(self, channel: str) -> str | None:
        try:
            if self.sharded:
                return str(self.router.primary(key_slot(channel)).name)
            return str(self.router.client.get_default_node().name)
        except Exception:
            return None

    def reconcile(self) -> None:
        """Subscribe the wanted channels not subscribed yet, and leave those no longer wanted;
        after a failure, a refusal or an unsubscription by the server (stale), check where every
        channel lives and move it there. A node that cannot be reached is left for a later round."""
        full, self.stale, self.changed = self.stale, False, False
        leaving = [channel for channel in self._where if channel not in self._wanted]
        for left, gone in _by_link(self._where, leaving).items():
            self._unsubscribe(left, gone)
        placing = self._wanted if full else self._wanted - self._where.keys()
        homes: dict[str, set[str]] = {}
        for channel in placing:
            home = self._home(channel)
            if home is None:
                self.stale = True
                continue
            current = self._where.get(channel)
            if current is None or current.name != home:
                homes.setdefault(home, set()).add(channel)
        for name, channels in homes.items():
            moving = [channel for channel in channels if channel in self._where]
            for old, moved in _by_link(self._where, moving).items():
                self._unsubscribe(old, moved)
            link = self._links.get(name)
            try:
                if link is None:
                    link = self._links[name] = _Link(name, self.router.node_client(name).connection_pool)
                self._send(link, self.subscribe_command, channels)
            except (errors.ConnectionError, errors.TimeoutError, OSError) as exc:
                self.failure = exc
                if link is not None:
                    self._drop(link)
                self.stale = True
                logger.debug("could not subscribe on node %s: %r", name, exc)
                continue
            link.channels |= channels
            for channel in channels:
                self._where[channel] = link
        if full:
            for empty in [each for each in self._links.values() if not each.channels]:
                self._drop(empty)
        if not self.stale:
            self.failure = None

    def _unsubscribe(self, link: _Link, channels: set[str]) -> None:
        for channel in channels:
            link.channels.discard(channel)
            self._where.pop(channel, None)
        try:
            self._send(link, "SUNSUBSCRIBE" if self.sharded else "UNSUBSCRIBE", channels)
        except (errors.ConnectionError, errors.TimeoutError, OSError) as exc:
            logger.debug("could not unsubscribe on node %s: %r", link.name, exc)
            self._drop(link)

    def _send(self, link: _Link, command: str, channels: set[str]) -> None:
        connection = link.connection
        if self.sharded:
            # one slot per command: shard channels of different slots cannot share one
            for channel in sorted(channels):
                connection.send_command(command, channel)
        else:
            connection.send_command(command, *sorted(channels))

    def _drop(self, link: _Link) -> None:
        self._links.pop(link.name, None)
        for channel in link.channels:
            if self._where.get(channel) is link:
                del self._where[channel]
        link.channels.clear()
        link.close()
        self.stale = True

    # -- reading --------------------------------------------------------------------------------

    def fds(self) -> dict[int, str]:
        """The sockets to wait on: file descriptor -> node."""
        found = {}
        for name, link in self._links.items():
            fd = link.fileno()
            if fd is not None:
                found[fd] = name
        return found

    def read(self, name: str | None = None) -> int:
        """Handle everything that arrived (on the link to node ``name``, or on every link); how
        many messages were handed on."""
        handled = 0
        for link in (
            list(self._links.values()) if name is None else [self._links[name]] if name in self._links else []
        ):
            handled += self._read_link(link)
        return handled

    def _read_link(self, link: _Link) -> int:
        handled = 0
        connection = link.connection
        try:
            while connection.can_read(timeout=0):
                try:
                    reply = connection.read_response(push_request=True)
                except errors.ResponseError as exc:
                    # a subscription refused: MOVED (the slot moved), CLUSTERDOWN, ...
                    self._refused(link, exc)
                    continue
                handled += self._handle(link, reply)
        except (errors.ConnectionError, errors.TimeoutError, OSError) as exc:
            logger.debug("lost the subscriber connection to node %s: %r", link.name, exc)
            self.failure = exc
            self._drop(link)
        return handled

    def _refused(self, link: _Link, exc: errors.ResponseError) -> None:
        self.stale = True
        slot = getattr(exc, "slot_id", None)
        if isinstance(exc, errors.MovedError):
            try:
                self.router.client.nodes_manager.move_slot(exc)
            except Exception as failed:
                logger.debug("could not follow %r: %r", exc, failed)
        gone = [channel for channel in link.channels if slot is None or key_slot(channel) == slot]
        for channel in gone:
            link.channels.discard(channel)
            self._where.pop(channel, None)
        logger.debug("node %s refused a subscription: %r", link.name, exc)

    def _handle(self, link: _Link, reply: Any) -> int:
        if not isinstance(reply, list) or len(reply) < 3:
            return 0
        kind = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
        channel = reply[1].decode() if isinstance(reply[1], bytes) else str(reply[1])
        if kind in ("smessage", "message"):
            if channel in link.channels:
                self.on_event("message", channel, reply[2])
                return 1
            return 0
        if kind in ("ssubscribe", "subscribe"):
            if channel in link.channels:
                self.on_event("subscribed", channel, b"")
            return 0
        if kind in ("sunsubscribe", "unsubscribe") and channel in self._wanted and channel in link.channels:
            # the server dropped it (its slot left this node): subscribe where it lives now
            link.channels.discard(channel)
            self._where.pop(channel, None)
            self.stale = True
        return 0

    def wait(self, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for something to arrive, and handle it."""
        fds = self.fds()
        if not fds:
            return 0
        pending = [name for name, link in self._links.items() if _buffered(link)]
        if not pending:
            ready, _, _ = select.select(list(fds), [], [], timeout)
            pending = [fds[fd] for fd in ready]
        return sum(self.read(name) for name in pending)

    def close(self) -> None:
        for link in list(self._links.values()):
            self._drop(link)
        self._where.clear()


def _by_link(where: dict[str, _Link], channels: Iterable[str]) -> dict[_Link, set[str]]:
    grouped: dict[_Link, set[str]] = {}
    for channel in channels:
        link = where.get(channel)
        if link is not None:
            grouped.setdefault(link, set()).add(channel)
    return grouped


def _buffered(link: _Link) -> bool:
    """Whether data is waiting in the connection already (read ahead, or decrypted TLS)."""
    sock = socket_of(link.connection)
    pending = getattr(sock, "pending", None)
    return bool(pending and pending())
