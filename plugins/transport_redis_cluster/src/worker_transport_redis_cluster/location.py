"""What this process holds from one cluster: the messages delivered and not settled yet (their
leases renewed by a thread of its own), and the acknowledgements not written yet, per queue.

A delivered message is recorded in its queue's ``leases`` as ``"<tag> <owner>"``, ``owner``
naming this process (host, PID and a random part), with the primary's clock plus the visibility
timeout as its score. While the worker holds it (waiting for its countdown, a slot, or running), a
daemon thread moves that deadline every quarter of the timeout, every held message of a queue in
one script, so a loop busy with a task does not stop it; a process that dies stops renewing and
its messages come back once their deadline passes (:data:`~.scripts.RECLAIM`). Acknowledging,
renewing or giving back a message names its owner: a holder whose lease lapsed (and whose message
another worker was given) changes nothing of the new delivery's record, and says so in a log line
naming the tasks that may run twice.

**Fenced** (:class:`~worker_core.slots.FencesLeases`): a held message whose renewal found no record
of this process is *lost*; the worker starts nothing it lost and writes nothing for it. When no
renewal was confirmed for half the visibility timeout (by the monotonic clock: a stopped process
sees the time that passed), :meth:`Location.lost_leases` renews first. A node refusing the renewal
(out of memory, too few replicas) is told to the worker's broker status, and its end too.

Held messages and acknowledgements are kept per cluster, not per connection: tasks kept across a
lost connection keep their leases, and are acknowledged through the next connection.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from typing import Any

import attrs

__all__ = ["Held", "Location", "location_of", "named"]

logger = logging.getLogger(__name__)

#: the most task ids one log line names before it says how many more
NAMED = 200


def named(ids: Iterable[str | None]) -> str:
    """Task ids for a log line (every one, up to :data:`NAMED`)."""
    shown = [each or "?" for each in ids]
    if len(shown) > NAMED:
        return ", ".join(shown[:NAMED]) + f" and {len(shown) - NAMED} more"
    return ", ".join(shown)


@attrs.define
class Held:
    """One delivered message this process holds."""

    queue: str  # the physical queue whose records hold it
    owner: object  # the QoS counting it in its prefetch window
    task: str | None  # its task id, for log lines


class Location:
    """The messages held from one cluster by this process (see the module docstring)."""

    def __init__(self, key: Hashable, visibility_timeout: float) -> None:
        self.key = key
        self.visibility_timeout = visibility_timeout
        self.owner = f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(4)}"
        self._lock = threading.Lock()
        self._held: dict[str, Held] = {}
        #: physical queue -> tags acknowledged here, not yet written
        self._acks: dict[str, list[str]] = {}
        #: tag -> task id of the acknowledged messages not yet written (their leases still renewed)
        self._acking: dict[str, tuple[str, str | None]] = {}
        #: acknowledgements on their way to the cluster now
        self._writing: set[str] = set()
        #: tags whose lease this process lost (renewal found another delivery, or none)
        self.lost: set[str] = set()
        self._lost_frozen: frozenset[str] = frozenset()
        #: when the last conclusive renewal started (monotonic)
        self.confirmed = time.monotonic()
        #: the worker's broker status (:class:`~worker_core.slots.BrokerStatus`), when it watches
        self.status: Any = None
        self._refused = False
        self._renewing = threading.Lock()
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self._renewer: Callable[[str, list[str]], list[str]] | None = None
        self._failing = False

    # -- what is held -----------------------------------------------------------------------------

    def hold(self, tag: str, queue: str, owner: object, task: str | None) -> None:
        with self._lock:
            self._held[tag] = Held(queue, owner, task)
        if self._thread is None and self._renewer is not None:
            self._start()

    def held(self, tag: str) -> Held | None:
        return self._held.get(tag)

    def held_by(self, owner: object) -> list[tuple[str, Held]]:
        with self._lock:
            return [(tag, held) for tag, held in self._held.items() if held.owner is owner]

    def release(self, tags: Iterable[str]) -> None:
        with self._lock:
            for tag in tags:
                self._held.pop(tag, None)

    def __len__(self) -> int:
        return len(self._held)

    # -- acknowledgements -----------------------------------------------------------------------

    def ack(self, tag: str) -> bool:
        """Take ``tag`` as acknowledged (written later); False when this process does not hold it
        (a message never recorded, such as a fanout one: nothing to write)."""
        with self._lock:
            held = self._held.pop(tag, None)
            if held is None:
                return False
            self._acks.setdefault(held.queue, []).append(tag)
            self._acking[tag] = (held.queue, held.task)
        return True

    @property
    def unwritten(self) -> bool:
        return bool(self._acks)

    def take_acks(self, queue: str | None = None) -> dict[str, list[str]]:
        """The acknowledgements not written yet (of ``queue`` only, when given), taken to be
        written now (until :meth:`written` or :meth:`put_back`, a renewal that finds them gone
        takes it for the acknowledgement's doing, not for a lost lease)."""
        with self._lock:
            if queue is None:
                taken, self._acks = self._acks, {}
            else:
                tags = self._acks.pop(queue, None)
                taken = {queue: tags} if tags else {}
            for tags in taken.values():
                self._writing.update(tags)
            return taken

    def put_back(self, queue: str, tags: list[str]) -> None:
        """Acknowledgements that could not be written: written with a later round."""
        with self._lock:
            self._acks.setdefault(queue, [])[:0] = tags
            self._writing.difference_update(tags)

    def written(self, tags: Iterable[str]) -> None:
        with self._lock:
            for tag in tags:
                self._acking.pop(tag, None)
                self._writing.discard(tag)

    def task_of(self, tag: str) -> str | None:
        held = self._held.get(tag)
        if held is not None:
            return held.task
        acking = self._acking.get(tag)
        return acking[1] if acking is not None else None

    def acknowledged_without_record(self, queue: str, tags: list[str]) -> None:
        """Acknowledgements that found no record of this process: say which tasks may run again."""
        logger.warning(
            "%d acknowledged message(s) of queue %r had no record of this worker in Redis any more: their "
            "lease lapsed and they were given back (this worker stood still, or could not reach the cluster, "
            "for longer than visibility_timeout=%gs), or a failover lost the primary's last writes; another "
            "worker may run them again. Tasks: %s",
            len(tags),
            queue,
            self.visibility_timeout,
            named(self.task_of(tag) for tag in tags),
        )

    # -- renewing -------------------------------------------------------------------------------

    def start_renewing(self, renewer: Callable[[str, list[str]], list[str]]) -> None:
        """Renew through ``renewer(queue, tags) -> tags no longer held`` from now on."""
        self._renewer = renewer
        if self._held:
            self._start()

    def interval(self) -> float:
        return max(self.visibility_timeout / 4, 0.05)

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(
                target=self._run, name=f"redis-cluster-leases-{id(self):x}", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        while True:
            self._wake.wait(self.interval())
            self._wake.clear()
            self.renew_now()

    def renew_now(self) -> bool:
        """Renew every lease held (the held messages and the acknowledged ones not yet written),
        and learn which were lost; whether the answer is conclusive (every queue answered)."""
        renewer = self._renewer
        if renewer is None:
            return False
        with self._renewing:
            with self._lock:
                by_queue: dict[str, list[str]] = {}
                for tag, held in self._held.items():
                    by_queue.setdefault(held.queue, []).append(tag)
                for tag, (queue, _) in self._acking.items():
                    by_queue.setdefault(queue, []).append(tag)
            started = time.monotonic()
            failed: BaseException | None = None
            for queue, tags in by_queue.items():
                try:
                    lost = renewer(queue, tags)
                except Exception as exc:
                    failed = exc
                    continue
                with self._lock:  # (an acknowledgement written meanwhile removed it: no loss)
                    gone = [tag for tag in lost if tag in self._held
                            or (tag in self._acking and tag not in self._writing)]
                self._lost(queue, gone)
            if failed is not None:
                self._renew_failed(failed)
                return False
            if self._failing:
                self._failing = False
                logger.warning("Renewed the leases of the held messages in the Redis Cluster again")
            if self._refused:
                self._refused = False
                if self.status is not None:
                    self.status.accepted()
            self.confirmed = started
            return True

    def _renew_failed(self, failed: BaseException) -> None:
        from .cluster import refusal

        reason = refusal(failed)
        if reason is not None:
            self._refused = True
            if self.status is not None:
                self.status.refused(reason)
        if not self._failing:
            self._failing = True
            logger.warning(
                "Could not renew the leases of the held messages in the Redis Cluster (%s: %s): if this "
                "lasts longer than visibility_timeout=%gs, the cluster gives them to other workers too; "
                "trying again every %gs",
                type(failed).__name__,
                failed,
                self.visibility_timeout,
                self.interval(),
            )

    # -- fenced against pauses --------------------------------------------------------------------

    def in_doubt(self) -> bool:
        """Whether the leases may have lapsed: messages are held and no renewal was confirmed for
        half the visibility timeout (by the monotonic clock, which a stopped process does not fool:
        it reads the time that passed)."""
        return bool(self._held) and time.monotonic() - self.confirmed > self.visibility_timeout / 2

    def lost_leases(self) -> frozenset[str] | None:
        """The held messages whose lease this process lost; while the leases are in doubt, asked of
        the cluster first. None when that cannot be told now (a node unreachable, or refusing)."""
        if self.in_doubt() and not self.renew_now():
            return None
        return self._lost_frozen

    def regain(self, tag: str) -> None:
        """A copy of held ``tag`` came back to this process: its record is this process's again."""
        if tag in self.lost:
            self.forget_lost([tag])

    def settle_lost(self, tag: str) -> bool:
        """If ``tag``'s lease was lost: stop holding it (nothing is written: the record, if any, is
        another consumer's) and return True."""
        if tag not in self.lost:
            return False
        self.release([tag])
        self.forget_lost([tag])
        return True

    def _lost(self, queue: str, tags: list[str]) -> None:
        if not tags:
            return
        new = [tag for tag in tags if tag not in self.lost]
        self.lost.update(tags)
        self._lost_frozen = frozenset(self.lost)
        if new:
            logger.warning(
                "%d message(s) of queue %r held by this worker lost their lease (held past "
                "visibility_timeout=%gs without a renewal, or a failover lost their record): another worker "
                "may be given them and run them too. Tasks: %s",
                len(new),
                queue,
                self.visibility_timeout,
                named(self.task_of(tag) for tag in new),
            )

    def forget_lost(self, tags: Iterable[str]) -> None:
        self.lost.difference_update(tags)
        self._lost_frozen = frozenset(self.lost)


_registry: dict[Hashable, Location] = {}
_registry_lock = threading.Lock()


def _forget_after_fork() -> None:
    """A forked child (a pool process) holds none of its parent's messages, and has no thread."""
    global _registry_lock
    _registry.clear()
    _registry_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


def location_of(key: Hashable, visibility_timeout: float) -> Location:
    with _registry_lock:
        found = _registry.get(key)
        if found is None:
            found = _registry[key] = Location(key, visibility_timeout)
        return found
