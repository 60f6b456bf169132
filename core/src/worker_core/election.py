"""Electing one leader among many processes: an :class:`Election` keeps trying to hold one
:class:`~worker_core.slots.Lease` on a thread of its own, renews it while held, and runs the
leader's duty in between; every other process waits, ready to take over.

Public: a plugin that needs one of many workers to do a job (send periodic tasks, export the
queues' lengths) builds the lease from the transport (:class:`~worker_core.slots.ElectsLeaders`)
and hands it here::

    transport = worker.plugins.slot("transport", scheme)(url, worker.app.settings)
    if isinstance(transport, ElectsLeaders):
        election = Election(transport.lease("queue-lengths", worker.hostname, ttl=3.0),
                            duty=export_once)
        election.start()          # ... election.stop() releases the lease, if held

The duty runs in the election's thread, so it may use the lease (its connection is not shared
with any other thread), and must return within the deadline it is given, so the lease is
renewed in time.

A plugin that runs an election in a worker makes it known to the others with :func:`track`
(the metrics export every tracked election's figures: whether this worker leads, how often it
became the leader, whether the broker refuses it), and :func:`untrack` once it stopped it.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .exceptions import ConfigurationError
from .slots import Lease
from .stash import StashKey

if TYPE_CHECKING:
    from .stash import Stash

__all__ = ["ELECTIONS", "Duty", "Election", "check_lease", "track", "untrack"]

logger = logging.getLogger("worker.election")

#: ``duty(lease, token, deadline) -> seconds``: the leader's work, called while this process
#: holds the lease under ``token``; it returns by ``deadline`` (a ``time.monotonic()`` value) and
#: says how many seconds may pass before it is called again (it is called again sooner when the
#: lease is renewed).
Duty = Callable[[Lease, int, float], float]


_NAME = re.compile(r"[A-Za-z0-9._-]+")


def check_lease(name: str, ttl: float | None = None) -> None:
    """Refuse a lease's (or a record table's) name and ttl that :meth:`ElectsLeaders.lease
    <worker_core.slots.ElectsLeaders.lease>` does not take, as every transport refuses them."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigurationError(f"a lease or table name is letters, digits, '.', '-' and '_' (got {name!r})")
    if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, (int, float))
                            or not math.isfinite(ttl) or ttl <= 0):
        raise ConfigurationError(f"a lease's ttl is a number of seconds greater than 0 (got {ttl!r})")


class Election:
    """Holds ``lease`` when it can, from a daemon thread, until :meth:`stop`.

    Renews every ``ttl / 4`` seconds while leading and tries to acquire every ``retry`` seconds
    (``min(0.5, ttl / 4)`` by default) while not, so a standby takes over at most
    ``lease.bound + retry`` seconds after the leader is lost (the lease's bound plus one try).
    A leader that cannot reach the broker stops counting itself the leader ``ttl`` seconds after
    the start of its last successful renewal, as the lease's contract asks.

    :param duty: the leader's work (see :data:`Duty`); none to only hold the lease.
    :param on_change: called with True when this process becomes the leader and with False when
        it stops being one (also at :meth:`stop`), in the election's thread.
    """

    def __init__(self, lease: Lease, *, duty: Duty | None = None,
                 on_change: Callable[[bool], None] | None = None, retry: float | None = None,
                 name: str | None = None) -> None:
        self.lease = lease
        self.duty = duty
        self.on_change = on_change
        self.retry = min(0.5, lease.ttl / 4) if retry is None else retry
        self.renew_every = lease.ttl / 4
        self._name = name or f"election-{lease.name}"
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._confirmed = 0.0  # monotonic time before the last successful acquire or renew
        self._leading = False
        #: times this process became the leader
        self.terms = 0
        #: the last error the broker gave, for ``inspect`` (None after a successful call)
        self.last_error: str | None = None

    # -- state -----------------------------------------------------------------------------------

    @property
    def leading(self) -> bool:
        """Whether this process leads now: it holds the lease, confirmed within ``ttl``."""
        return self._leading and time.monotonic() < self._confirmed + self.lease.ttl

    @property
    def token(self) -> int | None:
        """The fencing token while leading, else None."""
        return self.lease.token if self.leading else None

    def wait_leading(self, timeout: float) -> bool:
        """Block until this process leads or ``timeout`` seconds pass; whether it leads."""
        deadline = time.monotonic() + timeout
        while not self.leading:
            if time.monotonic() >= deadline or self._stopping.is_set():
                return False
            self._stopping.wait(0.02)
        return True

    # -- running ---------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop trying, give the lease up if held (another process leads at once), and close its
        connection."""
        self._stopping.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                pause = self._turn()
                if pause > 0:
                    self._stopping.wait(pause)
        finally:
            self._set_leading(False)
            try:
                self.lease.close()
            except Exception as exc:
                logger.warning("Could not release the lease %r: %s: %s", self.lease.name,
                               type(exc).__name__, exc)

    def _turn(self) -> float:
        """One step: acquire, renew or do the duty; the seconds to pause after it."""
        now = time.monotonic()
        if not self._leading:
            try:
                token = self.lease.acquire(wait=self.retry)
            except Exception as exc:
                self._broker_error("acquire", exc)
                return self.retry
            self.last_error = None
            if token is None:
                return 0.0  # acquire waited already
            self._confirmed = now
            self._set_leading(True)
            return 0.0
        if now >= self._confirmed + self.renew_every:
            try:
                held = self.lease.renew()
            except Exception as exc:
                self._broker_error("renew", exc)
                if not self.leading:
                    self._set_leading(False)
                return min(self.retry, self._confirmed + self.lease.ttl - now) if self.leading else 0.0
            self.last_error = None
            if not held:
                logger.warning("Lost the lease %r (another holder has it, or it lapsed)", self.lease.name)
                self._set_leading(False)
                return 0.0
            self._confirmed = now
        token = self.lease.token
        if self.duty is None or token is None:
            return self._confirmed + self.renew_every - time.monotonic()
        deadline = self._confirmed + self.renew_every
        try:
            wanted = self.duty(self.lease, token, deadline)
        except Exception as exc:
            self._duty_failed(exc)
            wanted = self.retry
        return max(0.0, min(wanted, deadline - time.monotonic()))

    def _duty_failed(self, exc: Exception) -> None:
        """A duty that failed because the broker cannot be reached (a renewal right after it
        fails too) is one warning line, as a failed renewal is; any other failure is a bug of the
        duty, logged with its traceback."""
        now = time.monotonic()
        try:
            held = self.lease.renew()
        except Exception as broker:
            self._broker_error("do the duty of", exc)
            self._broker_error("renew", broker)
            return
        self.last_error = None
        logger.error("The duty of the lease %r failed", self.lease.name, exc_info=exc)
        if held:
            self._confirmed = now
        else:
            logger.warning("Lost the lease %r (another holder has it, or it lapsed)", self.lease.name)
            self._set_leading(False)

    def _set_leading(self, leading: bool) -> None:
        if leading == self._leading:
            return
        self._leading = leading
        if leading:
            self.terms += 1
            logger.info("Holding the lease %r as %s (token %s)", self.lease.name, self.lease.holder,
                        self.lease.token)
        if self.on_change is not None:
            try:
                self.on_change(leading)
            except Exception:
                logger.exception("on_change of the lease %r failed", self.lease.name)

    def _broker_error(self, what: str, exc: Exception) -> None:
        text = f"{type(exc).__name__}: {exc}"
        if text != self.last_error:
            logger.warning("Could not %s the lease %r: %s", what, self.lease.name, text)
        self.last_error = text


#: the elections the worker's plugins run, by lease name (see :func:`track`)
ELECTIONS = StashKey[dict[str, Election]]()


def track(stash: Stash, election: Election) -> None:
    """Make ``election`` known in ``stash`` (``worker.stash``) under its lease's name, so other
    plugins read its figures (the metrics export them) until :func:`untrack`."""
    stash.setdefault(ELECTIONS, {})[election.lease.name] = election


def untrack(stash: Stash, election: Election) -> None:
    tracked = stash.get(ELECTIONS, {})
    if tracked.get(election.lease.name) is election:
        del tracked[election.lease.name]
