"""Leases and record tables on the cluster. A lease's keys share the hash tag
``{worker.lease.<name>}``: the holding ``"<token> <holder>"`` with a deadline the primary keeps
(``PX``, so no client clock matters), the counter of its fencing tokens, the keys sent, the
holder's records, and an **outbox**.

A message sent once cannot be pushed into its queue in the same script that checks the lease: the
queue lives in another slot, on another primary perhaps. So the script that checks the holding and
the key (``SET NX PX``) and writes the record also puts the message in the lease's outbox, all
atomically; then the message is moved to its queue by a second script, in the queue's slot, that
pushes it only if that outbox entry was never delivered there (a marker kept as long as the key
sent). A holder killed between the two leaves the message in the outbox: the next holder (or the
next send) moves it; whoever moves it, it reaches its queue once. A holder that lost the lease is
refused by the first script, so nothing it sends after a takeover reaches any queue.

Record tables: a hash and its version counter under ``{worker.records.<name>}``.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs
from kombu.connection import Connection
from kombu.messaging import Producer

from worker_core.election import check_lease
from worker_core.exceptions import LeaseLost
from worker_core.slots import LeaseState

from .cluster import Router, connect
from .keys import QueueKeys, key_slot
from .options import BrokerConfig
from .scripts import Script

if TYPE_CHECKING:
    from worker_core.slots import Lease, RecordTable, SendsOnce

    from .channel import Channel

__all__ = ["ClusterLease", "ClusterRecords"]

logger = logging.getLogger(__name__)

#: KEYS: the holding, the token counter. ARGV: the holder, the ttl in ms, the holding this object
#: has ('' for none). The token when held (again), false when another holds it.
ACQUIRE = Script(
    "lease-acquire",
    """
local held = redis.call('GET', KEYS[1])
if held then
  if held == ARGV[3] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return tonumber(string.match(held, '^(%d+)'))
  end
  return false
end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], token .. ' ' .. ARGV[1], 'PX', ARGV[2])
return token
""",
)
#: KEYS: the holding. ARGV: the holding this object has, the ttl in ms. 1 renewed, 0 lost.
RENEW = Script(
    "lease-renew",
    """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
""",
)
#: KEYS: the holding. ARGV: the holding this object has.
RELEASE = Script(
    "lease-release",
    """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 0
""",
)
#: KEYS: the holding, the key sent, the records, the outbox. ARGV: the holding, ms to keep the
#: key, the record's field ('' for none) and value, the outbox entry. -1 lost the lease, 0 sent
#: already, 1 sent (in the outbox).
SEND_ONCE = Script(
    "lease-send-once",
    """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
if not redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[2]) then return 0 end
redis.call('LPUSH', KEYS[4], ARGV[5])
if ARGV[3] ~= '' then redis.call('HSET', KEYS[3], ARGV[3], ARGV[4]) end
return 1
""",
)
#: In the destination queue's slot. KEYS: the marker of the outbox entry, the list. ARGV: the
#: item, the wake channel, how to wake, ms to keep the marker. 1 pushed, 0 delivered before.
DELIVER = Script(
    "lease-deliver",
    """
if not redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[4]) then return 0 end
if redis.call('LPUSH', KEYS[2], ARGV[1]) == 1 then
  if ARGV[3] == 's' then redis.call('SPUBLISH', ARGV[2], '1')
  elseif ARGV[3] == 'p' then redis.call('PUBLISH', ARGV[2], '1') end
end
return 1
""",
)
#: KEYS: the holding, the records. ARGV: the holding, then (field, 's' or 'd', value) triples.
WRITE_RECORDS = Script(
    "lease-write-records",
    """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
for i = 2, #ARGV, 3 do
  if ARGV[i + 1] == 's' then redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 2])
  else redis.call('HDEL', KEYS[2], ARGV[i]) end
end
return 1
""",
)
#: KEYS: the table, its version. ARGV: 's' or 'd', the key, the value.
WRITE_TABLE = Script(
    "records-write",
    """
local changed
if ARGV[1] == 's' then redis.call('HSET', KEYS[1], ARGV[2], ARGV[3]); changed = 1
else changed = redis.call('HDEL', KEYS[1], ARGV[2]) end
if changed == 1 then redis.call('INCR', KEYS[2]) end
return changed
""",
)

#: the most outbox entries one drain moves
DRAIN_BATCH = 100


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _texts(found: Any) -> dict[str, str]:
    return {_text(key): _text(value) for key, value in (found or {}).items()}


def _quick(config: BrokerConfig, timeout: float | None) -> BrokerConfig:
    """``config`` whose calls give up within ``timeout`` seconds (in time for a lease's deadline)."""
    if timeout is None:
        return config
    connection = dict(config.connection)
    for name in ("socket_timeout", "socket_connect_timeout"):
        given = connection.get(name)
        connection[name] = timeout if given is None else min(float(given), timeout)
    return attrs.evolve(config, connection=connection)


class _Store:
    """A router of a lease's or table's own, opened on first use."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self._router: Router | None = None

    @property
    def router(self) -> Router:
        if self._router is None:
            config = self.config
            self._router = Router(
                connect(config.seeds, config.connection), config.wait_for_replicas, config.wait_timeout
            )
        return self._router

    def run(self, script: Script, keys: list[str], args: list[Any], *, write: bool = False) -> Any:
        """``script`` on the slot of ``keys``; ``write``: WAIT for the replicas afterwards when the
        transport waits for them (a token or a key sent must survive a failover)."""
        router = self.router
        return router.run(key_slot(keys[0]), [router.script(script, keys, args)], write=write).replies[0]

    def commands(self, key: str, commands: list[tuple[Any, ...]]) -> list[Any]:
        return self.router.run(key_slot(key), commands, write=False, retry=True).replies

    def close(self) -> None:
        router, self._router = self._router, None
        if router is not None:
            router.close()


class ClusterLease:
    """A :class:`~worker_core.slots.Lease` (and :class:`~worker_core.slots.SendsOnce`) on a Redis
    Cluster (see the module docstring)."""

    def __init__(self, config: BrokerConfig, name: str, holder: str, ttl: float) -> None:
        check_lease(name, ttl)
        self.name = name
        self.holder = f"{holder}#{secrets.token_hex(3)}"
        self.ttl = float(ttl)
        self._config = _quick(config, max(0.2, self.ttl / 3))
        self._store = _Store(self._config)
        self._connection: Any = None
        self._held = ""
        self._token: int | None = None
        prefix = config.key_prefix
        base = f"{prefix}{{worker.lease.{name}}}"
        self._holding, self._counter = base, f"{base}:token"
        self._records, self._outbox = f"{base}:records", f"{base}:outbox"
        self._sent = f"{base}:sent:"

    def __repr__(self) -> str:
        return f"<ClusterLease {self.name!r} {self.holder}>"

    @property
    def bound(self) -> float:
        return self.ttl

    @property
    def token(self) -> int | None:
        return self._token

    @property
    def _ttl_ms(self) -> int:
        return max(1, round(self.ttl * 1000))

    def _lost(self) -> None:
        self._token, self._held = None, ""

    def acquire(self, wait: float = 0.0) -> int | None:
        deadline = time.monotonic() + wait
        while True:
            token = self._store.run(
                ACQUIRE, [self._holding, self._counter], [self.holder, self._ttl_ms, self._held], write=True
            )
            if token is not None:
                first = self._token is None
                self._token = int(token)
                self._held = f"{self._token} {self.holder}"
                if first:
                    self._drain()  # what an earlier holder sent and could not move
                return self._token
            self._lost()
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            time.sleep(min(0.05, left))  # the pause is the point: the holder keeps the lease meanwhile

    def renew(self) -> bool:
        if self._token is None:
            return False
        if self._store.run(RENEW, [self._holding], [self._held, self._ttl_ms]):
            return True
        self._lost()
        return False

    def release(self) -> None:
        if self._token is None:
            return
        held = self._held
        self._lost()
        self._store.run(RELEASE, [self._holding], [held])

    def current(self) -> LeaseState | None:
        held, left = self._store.commands(self._holding, [("GET", self._holding), ("PTTL", self._holding)])
        if held is None:
            return None
        token, _, holder = _text(held).partition(" ")
        return LeaseState(holder, int(token), left / 1000 if left and left > 0 else None)

    def close(self) -> None:
        try:
            if self._token is not None:
                self.release()
        finally:
            connection, self._connection = self._connection, None
            if connection is not None:
                connection.release()
            self._store.close()

    # -- sending once ----------------------------------------------------------------------------

    def _channel(self) -> Channel:
        if self._connection is None:
            from .kombu_transport import CONFIG, Transport

            self._connection = Connection(
                self._config.url, transport=Transport, transport_options={CONFIG: self._config}
            )
        channel: Channel = self._connection.default_channel
        return channel

    def send_once(
        self, key: str, publish: Callable[[Any], None], *, record: tuple[str, str] | None = None, keep: float
    ) -> bool:
        if self._token is None:
            raise LeaseLost(f"the lease {self.name!r} is not held by {self.holder}; nothing was sent")
        channel = self._channel()
        kept: list[tuple[str, int, str]] = []
        channel.keeping = kept
        try:
            publish(Producer(channel))
        finally:
            channel.keeping = None
        items = {item for _, _, item in kept}
        if len(items) != 1:
            raise ValueError(f"send_once({key!r}) sends one message; the publish sent {len(items)}")
        keep_ms = max(1, round(keep * 1000))
        entry = json.dumps(
            {
                "id": uuid.uuid4().hex,
                "keep": keep_ms,
                "item": items.pop(),
                "to": sorted({(queue, step) for queue, step, _ in kept}),
            }
        )
        field, value = record if record is not None else ("", "")
        sent = self._store.run(
            SEND_ONCE,
            [self._holding, self._sent + key, self._records, self._outbox],
            [self._held, keep_ms, field, value, entry],
            write=True,
        )
        if sent == -1:
            self._lost()
            raise LeaseLost(f"the lease {self.name!r} was lost by {self.holder}; {key!r} was not sent")
        if sent == 1:
            self._drain()
        return bool(sent == 1)

    def _drain(self) -> None:
        """Move every outbox entry to its queues, oldest first; what cannot be moved now stays
        for the next drain (it is sent: nothing can take it back)."""
        try:
            while True:
                entries = self._store.commands(self._outbox, [("LRANGE", self._outbox, -DRAIN_BATCH, -1)])[0]
                if not entries:
                    return
                for raw in reversed(entries):
                    self._deliver(_text(raw))
                    self._store.commands(self._outbox, [("LREM", self._outbox, -1, raw)])
        except Exception as exc:
            logger.warning(
                "Could not move the messages the lease %r sent to their queues yet (%s: %s): they stay in "
                "its outbox and go on the next send or takeover",
                self.name,
                type(exc).__name__,
                exc,
            )

    def _deliver(self, raw: str) -> None:
        try:
            entry = json.loads(raw)
            targets = [(str(queue), int(step)) for queue, step in entry["to"]]
            item, keep, ident = str(entry["item"]), int(entry["keep"]), str(entry["id"])
        except (ValueError, KeyError, TypeError) as exc:
            logger.error(
                "Dropped an outbox entry of lease %r that is not one this transport writes (%r): %r",
                self.name,
                exc,
                raw[:200],
            )
            return
        router = self._store.router
        kind = self._channel().wake_kind
        for queue, step in targets:
            keys = QueueKeys(queue, self._config.key_prefix, self._config.priority_steps)
            marker = f"{keys.tag}:outbox:{ident}"
            router.run(
                keys.slot,
                [router.script(DELIVER, [marker, keys.list_for(step)], [item, keys.wake, kind, keep])],
                write=False,
                retry=True,
            )

    def records(self) -> dict[str, str] | None:
        return _texts(self._store.commands(self._records, [("HGETALL", self._records)])[0])

    def write_records(self, changes: Mapping[str, str | None]) -> None:
        if self._token is None:
            raise LeaseLost(f"the lease {self.name!r} is not held by {self.holder}; nothing was written")
        args: list[Any] = [self._held]
        for field, value in changes.items():
            args += [field, "d", ""] if value is None else [field, "s", value]
        if self._store.run(WRITE_RECORDS, [self._holding, self._records], args) == -1:
            self._lost()
            raise LeaseLost(f"the lease {self.name!r} was lost by {self.holder}; nothing was written")


class ClusterRecords:
    """A :class:`~worker_core.slots.RecordTable` on a Redis Cluster: a hash and a version counter."""

    def __init__(self, config: BrokerConfig, name: str) -> None:
        check_lease(name)
        self.name = name
        self._store = _Store(config)
        base = f"{config.key_prefix}{{worker.records.{name}}}"
        self._table, self._version = base, f"{base}:version"

    def read(self) -> dict[str, str]:
        return _texts(self._store.commands(self._table, [("HGETALL", self._table)])[0])

    def version(self) -> int:
        found = self._store.commands(self._version, [("GET", self._version)])[0]
        return 0 if found is None else int(found)

    def _write(self, op: str, key: str, value: str) -> int:
        return int(self._store.run(WRITE_TABLE, [self._table, self._version], [op, key, value]))

    def put(self, key: str, value: str) -> None:
        self._write("s", key, value)

    def delete(self, key: str) -> bool:
        return self._write("d", key, "") == 1

    def close(self) -> None:
        self._store.close()


if TYPE_CHECKING:
    _LEASE: type[Lease] = ClusterLease
    _ONCE: type[SendsOnce] = ClusterLease
    _TABLE: type[RecordTable] = ClusterRecords
