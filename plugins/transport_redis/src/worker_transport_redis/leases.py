"""Leases on the messages this process holds from one Redis: their entries in kombu's
``unacked_index`` renewed well before the visibility timeout, at the server's time, and the ones
it lost found out before they do harm.

kombu (and every Celery worker on the same Redis) restores an unacknowledged message once its
``unacked_index`` score, the time it was delivered, is older than ``visibility_timeout``: a task
waiting for its countdown, or running longer than that, would be delivered again. While a message
is held here (delivered and not yet acknowledged, rejected or restored), a daemon thread moves its
score to Redis's ``TIME`` every quarter of the visibility timeout, all held messages in one round
trip (:data:`~.scripts.RENEW`): an entry acknowledged or restored meanwhile is never created
again. The thread runs beside the event loop, so a loop busy with a task (the solo pool) does not
stop it; a process that dies stops renewing, and its messages come back after the timeout as
before.

**Fenced.** This process remembers the score it last gave each held message (the server's time
of its record or its last renewal). A renewal moves only entries that still have that score, and
says which do not: restored by someone who took their lease for stale, because this process stood
still (SIGSTOP, a paused VM) or could not renew (Redis unreachable or refusing writes) for longer
than the timeout, and perhaps delivered again (a copy's record has the same delivery tag, and
the score of its own delivery). Such a message is *lost* (:meth:`Leases.lost_leases`): the
worker starts nothing it lost and acknowledges it here only (its record, if any, is another
consumer's). When the last conclusive renewal is older than half the timeout, the leases are *in
doubt* and :meth:`Leases.lost_leases` asks Redis before it answers; a renewal that ran while a
restore held kombu's mutex is not conclusive (a restore may still take what it read as stale).

**Refused.** Redis refusing writes (:mod:`.refusals`) puts the location in a refused state: the
channels take no messages (their QoS cannot consume), the thread tries again after a growing,
jittered delay, and the first renewal Redis takes ends it; the worker's broker status (a
:class:`~worker_core.slots.BrokerStatus`) is told both. Between renewals the thread asks every
:data:`PROBE_INTERVAL` seconds with a write that changes nothing, so a refusal is seen even while
the worker writes nothing else.

The held messages are kept per Redis location, not per channel: tasks kept across a lost
connection keep their leases, renewed through the next channel to the same Redis.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Hashable, Iterable, Mapping, Sequence
from time import monotonic
from typing import TYPE_CHECKING, Protocol

from .refusals import Backoff, refusal

if TYPE_CHECKING:
    from worker_core.slots import BrokerStatus

__all__ = ["LeaseRenewer", "Leases", "chunks", "leases_at"]

logger = logging.getLogger(__name__)

#: the most members one ZADD carries (a pipeline carries as many ZADDs as needed)
_CHUNK = 1000
#: leases not confirmed for this share of the visibility timeout are in doubt
_DOUBT = 0.5
#: at least this often (seconds) the thread asks whether Redis takes writes (an idle worker, or one
#: whose prefetch window is full, writes nothing else that would tell)
PROBE_INTERVAL = 2.0


class LeaseRenewer(Protocol):
    """A channel through which the leases of its Redis can be renewed."""

    #: seconds an unacknowledged message stays leased (kombu's ``visibility_timeout``)
    visibility_timeout: float

    #: the worker's broker status, told when Redis refuses writes and when it takes them again
    broker_status: BrokerStatus | None

    def renew_leases(self, groups: Mapping[str, Sequence[str]]) -> tuple[bool, str, list[str], list[str]]:
        """Move to Redis's time the ``unacked_index`` score of each tag of ``groups`` (the score
        this process last gave them -> the tags; '' for records on their way) that still has that
        score (:data:`~.scripts.RENEW`); returns whether the answer is final (no restore ran
        meanwhile), the new score, the tags whose score was not the one given, and the tags of
        the '' group that were there (and renewed)."""

    def remove_records(self, tags: Sequence[str]) -> None:
        """Acknowledge ``tags``: drop their ``unacked`` records."""


class Leases:
    """The messages held from one Redis location, and the thread renewing them."""

    def __init__(self, location: Hashable) -> None:
        self.location = location
        self._lock = threading.RLock()  # (release_all forgets lost leases under it)
        #: one renewal at a time (the thread's, or the loop's when the leases are in doubt)
        self._checking = threading.Lock()
        #: delivery tag -> the QoS that counts it in its prefetch window
        self._held: dict[str, object] = {}
        #: delivery tag -> the score this process last gave its entry in ``unacked_index`` (none
        #: while its record is on its way to Redis: BRPOP took it, the next fetch records it)
        self._score: dict[str, str] = {}
        #: held, and Redis no longer leases them to this process
        self._lost: set[str] = set()
        self._lost_frozen: frozenset[str] = frozenset()
        #: when (monotonic) the last conclusive renewal was sent: every lease held then was confirmed
        self._confirmed = monotonic()
        self._renewers: list[LeaseRenewer] = []
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self._failing = False
        #: what Redis's refusal means while it refuses writes, else None
        self.refused_because: str | None = None
        self._backoff = Backoff()
        #: when (monotonic) Redis last answered a renewal or a probe
        self._answered = monotonic()
        #: seconds without a confirmed renewal after which the leases are in doubt
        self._doubt_after = self.interval() * 4 * _DOUBT

    def __len__(self) -> int:
        return len(self._held)

    # -- what is held ---------------------------------------------------------------------------

    def hold(self, tag: str, owner: object, score: str | None) -> None:
        """Hold ``tag`` (counted by ``owner``), recorded in Redis with ``score`` (None: not yet)."""
        self._held[tag] = owner
        if score is not None:
            self._score[tag] = score
        if self._thread is None:
            self._start()

    def recorded(self, tags: Iterable[str], score: str) -> None:
        """The records of ``tags`` (held, on their way) are in Redis now, with ``score`` (or a
        later one: a renewal that found them there may have moved it already)."""
        for tag in tags:
            if tag in self._held:
                self._set_score(tag, score)

    def _set_score(self, tag: str, score: str) -> None:
        """The later of ``score`` and the one known (Redis's clock orders them)."""
        known = self._score.get(tag)
        if known is None or float(score) > float(known):
            self._score[tag] = score

    def owner(self, tag: str) -> object | None:
        """The QoS holding ``tag`` in this process, or None."""
        return self._held.get(tag)

    def release(self, tag: str) -> None:
        self._held.pop(tag, None)
        self._score.pop(tag, None)
        if tag in self._lost:
            self._forget_lost(tag)

    def release_all(self, owner: object) -> int:
        """Stop renewing every message ``owner`` holds (they were restored); how many there were."""
        with self._lock:
            tags = [tag for tag, held_by in self._held.copy().items() if held_by is owner]
            for tag in tags:
                self._held.pop(tag, None)
                self._score.pop(tag, None)
                if tag in self._lost:
                    self._forget_lost(tag)
        return len(tags)

    def held_by(self, owner: object) -> int:
        return sum(1 for held_by in self._held.copy().values() if held_by is owner)

    # -- lost leases ------------------------------------------------------------------------------

    def in_doubt(self) -> bool:
        """Whether the leases may have lapsed: messages are held and no renewal was confirmed for
        half the visibility timeout (by the monotonic clock, which a stopped process does not
        fool: it reads the time that passed)."""
        return bool(self._held) and monotonic() - self._confirmed > self._doubt_after

    def lost_leases(self) -> frozenset[str] | None:
        """The held messages whose lease this process lost; while the leases are in doubt, asked
        of Redis first. None when that cannot be told now (Redis unreachable, or refusing)."""
        if self.in_doubt() and not self.check():
            return None
        return self._lost_frozen

    def is_lost(self, tag: str) -> bool:
        return tag in self._lost

    def regain(self, tag: str, score: str | None) -> None:
        """A copy of held ``tag`` came back to this process: the record Redis holds now is ours,
        with ``score``."""
        if score is not None:
            self._set_score(tag, score)
        if tag in self._lost:
            self._forget_lost(tag)

    def forget_lost(self, tag: str) -> bool:
        """If ``tag`` is lost: stop holding it (nothing is written to Redis) and return True."""
        if tag not in self._lost:
            return False
        self._held.pop(tag, None)
        self._score.pop(tag, None)
        self._forget_lost(tag)
        return True

    def lost_held_by(self, owner: object) -> list[str]:
        return [tag for tag in list(self._lost) if self._held.get(tag) is owner]

    def _forget_lost(self, tag: str) -> None:
        with self._lock:
            self._lost.discard(tag)
            self._lost_frozen = frozenset(self._lost)

    def check(self, renewer: LeaseRenewer | None = None) -> bool:
        """Renew every held lease now and learn which were lost; whether the answer is conclusive."""
        renewer = renewer or self.channel()
        if renewer is None or (self.refused_because is not None and not self._backoff.is_due()):
            return False
        with self._checking:
            # Judged: messages whose record is in Redis with a score known here. One on its way
            # (BRPOP took it, the next fetch records it) is renewed if it is there, not judged: a
            # solo pool's task may hold the loop that would read the fetch's reply for long.
            scores = self._score.copy()
            groups: dict[str, list[str]] = {}
            for tag in self._held.copy():
                if tag not in self._lost:
                    groups.setdefault(scores.get(tag, ""), []).append(tag)
            count = sum(map(len, groups.values()))
            sent = monotonic()
            try:
                final, stamp, missing, found = renewer.renew_leases(groups)
            except Exception as exc:
                reason = refusal(exc)
                if reason is not None:
                    self.refused(reason)
                else:
                    self._renew_failed(renewer, exc, count)
                return False
            self._renewed(count)
            self._answered = monotonic()
            gap = sent - self._confirmed
            gone = set(missing)
            current = self._score
            for score, tags in groups.items():
                if not score:
                    continue
                for tag in tags:  # (unless a copy moved it meanwhile)
                    if tag not in gone and current.get(tag) == score:
                        current[tag] = stamp
            for tag in found:
                if tag in self._held:
                    self._set_score(tag, stamp)
            if missing:
                lost = [tag for tag in missing if tag in self._held and tag not in self._lost
                        and current.get(tag) == scores.get(tag)]
                if lost:
                    with self._lock:
                        self._lost.update(lost)
                        self._lost_frozen = frozenset(self._lost)
                    logger.warning(
                        "Redis gave back %d message(s) this worker holds: their leases were last "
                        "renewed %.1fs ago, past the visibility timeout of %gs (the worker stood still, "
                        "or could not reach Redis or write to it), and a restore took them", len(lost),
                        gap, float(renewer.visibility_timeout))
            if final:
                self._confirmed = sent
            return final

    # -- refusals ---------------------------------------------------------------------------------

    def refusing(self) -> bool:
        """Whether Redis refuses writes now (no message is taken meanwhile)."""
        return self.refused_because is not None

    def may_retry(self) -> bool:
        """Whether the delay after Redis's last refusal has passed (a write may be tried again)."""
        return self._backoff.is_due()

    def refused(self, reason: str) -> None:
        """Redis refused a write: ``reason`` says why (see :mod:`.refusals`)."""
        with self._lock:
            first = self.refused_because is None
            self.refused_because = reason
            self._backoff.failed()
        status = self.status()
        if status is not None:
            status.refused(f"Redis refuses work: {reason}")
        elif first:
            logger.warning("Redis refuses work: %s; trying again with a growing delay", reason)
        self._start()
        self._wake.set()

    def accepted(self) -> None:
        """Redis took a write again."""
        with self._lock:
            was, self.refused_because = self.refused_because, None
            self._backoff.reset()
        if was is None:
            return
        status = self.status()
        if status is not None:
            status.accepted()
        else:
            logger.warning("Redis takes work again")

    def status(self) -> BrokerStatus | None:
        renewer = self.channel()
        return renewer.broker_status if renewer is not None else None

    # -- renewing ---------------------------------------------------------------------------------

    def attach(self, renewer: LeaseRenewer) -> None:
        """Renew through ``renewer`` (the newest attached channel is used) until it detaches."""
        with self._lock:
            self._renewers.append(renewer)
            self._doubt_after = self.interval() * 4 * _DOUBT
        if self._held or self.refused_because is not None:
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
            self._doubt_after = self.interval() * 4 * _DOUBT
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
            if self.refused_because is not None:
                if self._backoff.is_due():
                    self.check(renewer)  # (with nothing held: a probe of whether writes pass)
                if self.refused_because is not None:
                    interval = min(interval, max(self._backoff.due - monotonic(), 0.01))
            elif self._held:
                self.check(renewer)
            else:
                self._confirmed = monotonic()
            if self.refused_because is None:
                next_probe = self._answered + PROBE_INTERVAL - monotonic()
                if next_probe <= 0:
                    self._probe(renewer)
                    next_probe = PROBE_INTERVAL
                interval = min(interval, next_probe)
            self._wake.wait(max(interval, 0.01))

    def _probe(self, renewer: LeaseRenewer) -> None:
        """A write that changes nothing: whether Redis takes writes."""
        try:
            renewer.renew_leases({})
        except Exception as exc:
            reason = refusal(exc)
            if reason is not None:
                self.refused(reason)
            else:
                logger.debug("the probe of Redis's writes failed: %r", exc)
            return
        self._answered = monotonic()

    def _renew_failed(self, renewer: LeaseRenewer, exc: Exception, count: int) -> None:
        if not self._failing:
            self._failing = True
            logger.warning(
                "Could not renew the leases of %d held message(s) in Redis (%s: %s): if this lasts "
                "longer than the visibility timeout (%gs), Redis gives them to other workers too; "
                "trying again every %gs", count, type(exc).__name__, exc,
                float(renewer.visibility_timeout), self.interval())

    def _renewed(self, count: int) -> None:
        if self.refused_because is not None:
            self.accepted()
        if self._failing:
            self._failing = False
            logger.warning("Renewed the leases of %d held message(s) in Redis again", count)


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
