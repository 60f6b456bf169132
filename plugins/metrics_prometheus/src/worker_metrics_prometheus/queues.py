"""``celery_queue_length{queue_name}`` from one worker of the fleet (``--metrics-queue-lengths``):
the workers elect one on the broker (a lease, :class:`worker_core.election.Election`), which
reads the queues' lengths every ``--metrics-queue-interval`` seconds and exports them; when it
goes, another takes over within the lease's bound. Every worker would report the same queues
otherwise, and dashboards sum what they scrape.

The leader reads on a connection of its own, from the election's thread, through the transport's
``queue_depth`` (Redis: each priority list's LLEN; RabbitMQ: a passive declare), never on the
consumer's connection, and exports only while it leads and its last reading is fresh.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client.core import GaugeMetricFamily

from worker_core.election import Election, track, untrack
from worker_core.exceptions import ConfigurationError
from worker_core.options import scheme_of
from worker_core.redaction import redact_url
from worker_core.slots import ElectsLeaders

if TYPE_CHECKING:
    from worker_core.slots import Lease, Transport

__all__ = ["QueueLengths"]

logger = logging.getLogger("worker.metrics")

#: the lease every worker of a fleet competes for, unless told another name
DEFAULT_LEASE = "metrics.queue-lengths"


class QueueLengths:
    """The election and the last reading of the queues' lengths, for one worker."""

    def __init__(self, worker: Any, queues: Sequence[str], interval: float, lease_name: str) -> None:
        url = worker.options.brokers[0]
        transport_class = worker.plugins.slot("transport", scheme_of(url))
        transport: Transport = transport_class(url, worker.app.settings)
        if not isinstance(transport, ElectsLeaders):
            raise ConfigurationError(
                f"--metrics-queue-lengths: the broker {redact_url(url)} cannot elect the one worker that "
                f"exports the queues' lengths (its transport {transport_class.__name__} offers no leases); "
                f"leave the option out and read the lengths from the broker's own exporter")
        self.url = url
        self.transport = transport
        self.queues = tuple(queues)
        self.interval = interval
        self._lengths: dict[str, int] = {}
        self._read_at = 0.0
        self._lock = threading.Lock()
        self._connection: Any = None
        lease = transport.lease(lease_name, worker.hostname, ttl=max(3.0, 3 * interval))
        # standbys try again every quarter of the lease, not twice a second: a fleet of many
        # workers costs the broker little, and the takeover stays within the lease and a quarter
        self.election = Election(lease, duty=self._duty, on_change=self._on_change, retry=lease.ttl / 4,
                                 name="metrics-queue-lengths")
        self._stash = worker.stash

    def start(self) -> None:
        track(self._stash, self.election)
        self.election.start()

    def stop(self) -> None:
        self.election.stop()
        untrack(self._stash, self.election)
        self._close()

    # -- in the election's thread --------------------------------------------------------------------

    def _duty(self, lease: Lease, token: int, deadline: float) -> float:
        now = time.monotonic()
        due = self._read_at + self.interval
        if now < due:
            return due - now
        try:
            connection = self._connect()
            lengths = {queue: int(self.transport.queue_depth(connection, queue)) for queue in self.queues}
        except Exception as exc:
            logger.warning("Could not read the queues' lengths from %s: %s: %s", redact_url(self.url),
                           type(exc).__name__, exc)
            self._close()
            return self.interval
        with self._lock:
            self._lengths, self._read_at = lengths, time.monotonic()
        return self.interval

    def _connect(self) -> Any:
        if self._connection is None:
            import kombu

            self._connection = kombu.Connection(  # type: ignore[attr-defined,no-untyped-call]
                self.url, transport=self.transport.kombu_transport(), **self.transport.connection_options())
        return self._connection

    def _close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            try:
                connection.release()
            except Exception:
                pass

    def _on_change(self, leading: bool) -> None:
        if leading:
            logger.info("Exporting the lengths of %s for the fleet (this worker holds the lease %r)",
                        ", ".join(self.queues), self.election.lease.name)
            with self._lock:
                self._read_at = 0.0  # read at once
        else:
            with self._lock:
                self._lengths, self._read_at = {}, 0.0

    # -- in the metrics server's thread ------------------------------------------------------------

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """``celery_queue_length{queue_name}`` while this worker leads and its reading is fresh
        (no older than three intervals), else nothing."""
        with self._lock:
            lengths, read_at = dict(self._lengths), self._read_at
        if not lengths or not self.election.leading or time.monotonic() - read_at > 3 * self.interval:
            return
        family = GaugeMetricFamily("celery_queue_length", "Messages waiting in the broker queue (exported "
                                   "by one elected worker of the fleet).", labels=("queue_name",))
        for queue, length in sorted(lengths.items()):
            family.add_metric((queue,), length)
        yield family


def election_families(elections: dict[str, Election], names: tuple[str, ...],
                      values: tuple[str, ...]) -> Iterator[Any]:
    """The figures of every election the worker's plugins track: whether this worker leads each
    lease, how often it became its leader, whether the broker refuses it now."""
    from prometheus_client.core import CounterMetricFamily

    if not elections:
        return
    labels = (*names, "lease")
    leader = GaugeMetricFamily("worker_lease_leader", "1 while this worker holds the lease (it leads).",
                               labels=labels)
    terms = CounterMetricFamily("worker_lease_terms", "Times this worker became the lease's holder.",
                                labels=labels)
    failing = GaugeMetricFamily("worker_lease_broker_error", "1 while the broker does not answer this "
                                "worker's lease calls.", labels=labels)
    for name, election in sorted(elections.items()):
        leader.add_metric((*values, name), 1 if election.leading else 0)
        terms.add_metric((*values, name), election.terms)
        failing.add_metric((*values, name), 1 if election.last_error is not None else 0)
    yield from (leader, terms, failing)
