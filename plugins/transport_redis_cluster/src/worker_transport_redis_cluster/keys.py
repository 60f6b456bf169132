"""Where everything lives: every key and channel of one queue carries the queue's name as its hash
tag, so they share one slot and one primary, and a script over them is atomic; queues hash to
different slots, so queues spread over the primaries.

For a queue ``Q`` (after the ``global_keyprefix`` ``P``)::

    P{Q}:ready:<step>   a list per priority step (LPUSH to publish, RPOP to take: first in, first out)
    P{Q}:unacked        a hash: delivery tag -> "<step> <item>" for every message delivered, not settled
    P{Q}:leases         a sorted set: "<tag> <owner>" scored by the lease's deadline (the broker's clock)
    P{Q}:redelivered    a set: the tags of messages given back, flagged when next delivered
    P{Q}:wake           the (sharded) pub/sub channel that wakes consumers when the queue fills

A list item is ``<delivery tag> <kombu envelope as JSON>``. Exchanges keep their bindings in
``P{E}:bindings`` and fan out on the channel ``P{E}:fanout``. A sharded queue ``Q`` of ``N``
shards is ``N`` queues ``Q@<tag>`` whose tags are chosen to fall in ``N`` equal ranges of slots
(so with the slots spread evenly, on as many primaries as they can), plus ``Q`` itself.
"""

from __future__ import annotations

from bisect import bisect
from functools import lru_cache

import attrs
from redis.crc import key_slot as _key_slot

__all__ = ["QueueKeys", "exchange_bindings", "exchange_fanout", "key_slot", "shard_names", "step_for"]

SLOTS = 16384


def key_slot(key: str) -> int:
    """The slot of ``key``, as the cluster computes it (its hash tag when it has one)."""
    return int(_key_slot(key.encode()))


@attrs.frozen
class QueueKeys:
    """The keys and channel of one (physical) queue."""

    queue: str
    prefix: str
    steps: tuple[int, ...]

    @property
    def tag(self) -> str:
        return f"{self.prefix}{{{self.queue}}}"

    @property
    def lists(self) -> list[str]:
        """The priority lists, served first to last."""
        return [f"{self.tag}:ready:{step}" for step in self.steps]

    def list_for(self, step: int) -> str:
        return f"{self.tag}:ready:{step}"

    @property
    def unacked(self) -> str:
        return f"{self.tag}:unacked"

    @property
    def leases(self) -> str:
        return f"{self.tag}:leases"

    @property
    def redelivered(self) -> str:
        return f"{self.tag}:redelivered"

    @property
    def wake(self) -> str:
        return f"{self.tag}:wake"

    @property
    def records(self) -> list[str]:
        """The keys that hold records (the fetch scripts' first keys)."""
        return [self.unacked, self.leases, self.redelivered]

    @property
    def slot(self) -> int:
        return key_slot(self.tag)


def exchange_bindings(prefix: str, exchange: str) -> str:
    return f"{prefix}{{{exchange}}}:bindings"


def exchange_fanout(prefix: str, exchange: str) -> str:
    return f"{prefix}{{{exchange}}}:fanout"


def step_for(priority: int, steps: tuple[int, ...]) -> int:
    """The priority step a message of ``priority`` goes to: the largest step not above it."""
    return steps[max(bisect(steps, priority) - 1, 0)]


@lru_cache(maxsize=256)
def shard_names(queue: str, count: int) -> tuple[str, ...]:
    """The ``count`` physical queues of the sharded queue ``queue``: ``queue@<n>``, shard ``i``
    taking the first ``n`` whose slot falls in the ``i``-th of ``count`` equal ranges of slots, so
    the same names come out in every process, and with the slots spread evenly over the primaries
    (as ``redis-cli --cluster create`` spreads them) the shards spread over as many primaries."""
    names = []
    width = SLOTS / count
    for index in range(count):
        low, high = int(index * width), int((index + 1) * width)
        n = 0
        while not low <= key_slot(f"{queue}@{n}") < high:
            n += 1
        names.append(f"{queue}@{n}")
    return tuple(names)
