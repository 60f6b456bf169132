"""Leases on the messages this process holds from one Redis: their entries in kombu's
``unacked_index`` renewed well before the visibility timeout.

kombu (and every Celery worker on the same Redis) restores an unacknowledged message once its
``unacked_index`` score, the time it was delivered, is older than ``visibility_timeout``: a task
waiting for its countdown, or running longer than that, would be delivered again. While a message
is held here (delivered and not yet acknowledged, rejected or restored), a daemon thread moves its
score to the current time every quarter of the visibility timeout, all held messages in one round
trip, with ``ZADD XX``: an entry acknowledged or restored meanwhile is never created again. The
thread runs beside the event loop, so a loop busy with a task (the solo pool) does not stop it; a
process that dies stops renewing, and its messages come back after the timeout as before.

The held messages are kept per Redis location, not per channel: tasks kept across a lost
connection keep their leases, renewed through the next channel to the same Redis.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Hashable, Iterable, Sequence
from time import time
from typing import Any, Protocol

__all__ = ["LeaseRenewer", "Leases", "chunks", "leases_at", "renew"]

logger = logging.getLogger(__name__)

#: the most members one ZADD carries (a pipeline carries as many ZADDs as needed)
_CHUNK = 1000


class LeaseRenewer(Protocol):
    """A channel through which the leases of its Redis can be renewed."""

    #: seconds an unacknowledged message stays leased (kombu's ``visibility_timeout``)
    visibility_timeout: float

    def renew_leases(self, tags: Sequence[str], score: float) -> None:
        """Set the ``unacked_index`` score of each of ``tags`` still there to ``score``."""

    def remove_records(self, tags: Sequence[str]) -> None:
        """Acknowledge ``tags``: drop their ``unacked`` records."""


class Leases:
    """The messages held from one Redis location, and the thread renewing them."""

    def __init__(self, location: Hashable) -> None:
        self.location = location
        self._lock = threading.Lock()
        #: delivery tag -> the QoS that counts it in its prefetch window
        self._held: dict[str, object] = {}
        self._renewers: list[LeaseRenewer] = []
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self._failing = False

    def __len__(self) -> int:
        return len(self._held)

    # -- what is held ---------------------------------------------------------------------------

    def hold(self, tag: str, owner: object) -> None:
        self._held[tag] = owner
        if self._thread is None:
            self._start()

    def owner(self, tag: str) -> object | None:
        """The QoS holding ``tag`` in this process, or None."""
        return self._held.get(tag)

    def release(self, tag: str) -> None:
        self._held.pop(tag, None)

    def release_all(self, owner: object) -> int:
        """Stop renewing every message ``owner`` holds (they were restored); how many there were."""
        with self._lock:
            tags = [tag for tag, held_by in self._held.copy().items() if held_by is owner]
            for tag in tags:
                self._held.pop(tag, None)
        return len(tags)

    def held_by(self, owner: object) -> int:
        return sum(1 for held_by in self._held.copy().values() if held_by is owner)

    # -- renewing ---------------------------------------------------------------------------------

    def attach(self, renewer: LeaseRenewer) -> None:
        """Renew through ``renewer`` (the newest attached channel is used) until it detaches."""
        with self._lock:
            self._renewers.append(renewer)
        if self._held:
            self._start()

    def _start(self) -> None:
        """Start the renewing thread, unless it runs or there is no channel to renew through (a
        process that only publishes holds nothing and runs no thread)."""
        with self._lock:
            if self._thread is not None or not self._renewers:
                return
            self._wake.clear()
            self._thread = threading.Thread(target=self._run, name=f"redis-leases-{id(self):x}", daemon=True)
            self._thread.start()

    def attached(self) -> bool:
        """Whether a channel to this location is open in this process."""
        return bool(self._renewers)

    def channel(self) -> LeaseRenewer | None:
        """The newest channel open to this location, or None."""
        renewers = self._renewers
        return renewers[-1] if renewers else None

    def detach(self, renewer: LeaseRenewer) -> None:
        with self._lock:
            if renewer in self._renewers:
                self._renewers.remove(renewer)
            if not self._renewers:
                self._wake.set()

    def interval(self) -> float:
        """Seconds between renewals: a quarter of the shortest visibility timeout attached."""
        renewers = list(self._renewers)
        timeout = min((float(each.visibility_timeout) for each in renewers), default=3600.0)
        return max(timeout / 4, 0.05)

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._renewers:
                    self._thread = None
                    return
                self._wake.clear()  # (a detach followed by an attach left it set)
                renewer = self._renewers[-1]
                interval = self.interval()
            tags = list(self._held.copy())
            if tags:
                self._renew(renewer, tags)
            self._wake.wait(interval)

    def _renew(self, renewer: LeaseRenewer, tags: list[str]) -> None:
        try:
            renewer.renew_leases(tags, time())
        except Exception as exc:
            if not self._failing:
                self._failing = True
                logger.warning(
                    "Could not renew the leases of %d held message(s) in Redis (%s: %s): if this lasts "
                    "longer than the visibility timeout (%gs), Redis gives them to other workers too; "
                    "trying again every %gs", len(tags), type(exc).__name__, exc,
                    float(renewer.visibility_timeout), self.interval())
            return
        if self._failing:
            self._failing = False
            logger.warning("Renewed the leases of %d held message(s) in Redis again", len(tags))


def chunks(tags: Sequence[str]) -> Iterable[Sequence[str]]:
    """``tags`` in slices small enough for one ZADD each."""
    return (tags[start:start + _CHUNK] for start in range(0, len(tags), _CHUNK))


_registry: dict[Hashable, Leases] = {}
_registry_lock = threading.Lock()


def _forget_after_fork() -> None:
    """A forked child (a pool process) holds none of its parent's messages, and has no thread."""
    global _registry_lock
    _registry.clear()
    _registry_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


def leases_at(location: Hashable) -> Leases:
    """The leases of this process at one Redis location (host, port, database, key names)."""
    with _registry_lock:
        found = _registry.get(location)
        if found is None:
            found = _registry[location] = Leases(location)
        return found


def renew(client: Any, index_key: str, tags: Sequence[str], score: float) -> None:
    """One round trip: ``ZADD index_key XX`` each of ``tags`` at ``score``."""
    with client.pipeline(transaction=False) as pipe:
        for chunk in chunks(tags):
            pipe.zadd(index_key, dict.fromkeys(chunk, score), xx=True)
        pipe.execute()
