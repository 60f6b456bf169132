"""Leases and record tables on Redis: a lease is a key holding ``"<token> <holder>"`` with a
deadline (``PX``, kept by the server, so no client clock matters) and a counter for its fencing
tokens; a message sent under a lease is pushed by the script that checks the lease and sets its
key (``SET NX PX``), so it is sent once or not at all.

Keys (after the ``global_keyprefix``): ``worker.lease.<name>`` (the holding),
``worker.lease.<name>.token`` (the last token), ``worker.lease.<name>.sent.<key>`` (a key sent),
``worker.lease.<name>.records`` (a hash), ``worker.records.<name>`` and its ``.version``.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import redis as redis_py
from kombu.connection import Connection
from kombu.messaging import Producer
from kombu.transport import redis as _redis
from kombu.utils import json as _json

from worker_core.election import check_lease
from worker_core.exceptions import LeaseLost
from worker_core.slots import LeaseState

from . import internals

if TYPE_CHECKING:
    from worker_core.slots import Lease, RecordTable, SendsOnce

__all__ = ["RedisLease", "RedisRecords"]

# kombu is not annotated: its module is typed as Any here, once.
kombu_redis: Any = _redis
dumps: Callable[[Any], str] = _json.dumps

#: KEYS: the holding, the token counter. ARGV: the holder, the ttl in ms, the holding this
#: object has ('' for none). The token when held (again), false when another holds it.
ACQUIRE = """
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
"""
#: KEYS: the holding. ARGV: the holding this object has, the ttl in ms. 1 renewed, 0 lost.
RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""
#: KEYS: the holding. ARGV: the holding this object has.
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 0
"""
#: KEYS: the holding, the key sent, the records, then the lists to push to. ARGV: the holding,
#: ms to keep the key, the record's field ('' for none) and value, the payload.
#: -1 lost the lease, 0 sent already, 1 sent.
SEND_ONCE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
if not redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[2]) then return 0 end
for i = 4, #KEYS do redis.call('LPUSH', KEYS[i], ARGV[5]) end
if ARGV[3] ~= '' then redis.call('HSET', KEYS[3], ARGV[3], ARGV[4]) end
return 1
"""
#: KEYS: the holding, the records. ARGV: the holding, then (field, 's' or 'd', value) triples.
WRITE_RECORDS = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
for i = 2, #ARGV, 3 do
  if ARGV[i + 1] == 's' then redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 2])
  else redis.call('HDEL', KEYS[2], ARGV[i]) end
end
return 1
"""
#: KEYS: the table, its version. ARGV: 's' or 'd', the key, the value.
WRITE_TABLE = """
local changed
if ARGV[1] == 's' then redis.call('HSET', KEYS[1], ARGV[2], ARGV[3]); changed = 1
else changed = redis.call('HDEL', KEYS[1], ARGV[2]) end
if changed == 1 then redis.call('INCR', KEYS[2]) end
return changed
"""


def _texts(found: Mapping[Any, Any]) -> dict[str, str]:
    """A hash as redis-py gives it (bytes) as text."""
    return {key.decode(): value.decode() for key, value in found.items()}


class _Keeping:
    """What a lease channel keeps back while a message is sent once: each list and payload."""

    def __init__(self) -> None:
        self.pushes: list[tuple[str, str]] = []


class LeaseChannel(kombu_redis.Channel):  # type: ignore[misc]
    """kombu's Redis channel for a lease's connection: inside :meth:`RedisLease.send_once` the
    message is not pushed but kept, for the lease's script to push."""

    keeping: _Keeping | None = None

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        keeping = self.keeping
        if keeping is None:
            super()._put(queue, message, **kwargs)
            return
        name = internals.priority_list(self, queue, message)
        keeping.pushes.append((self.global_keyprefix + name, dumps(message)))

    def _put_fanout(self, exchange: str, message: dict[str, Any], routing_key: str, **kwargs: Any) -> None:
        if self.keeping is not None:
            raise ValueError(f"a message sent once goes to queues, not to the fanout exchange {exchange!r}")
        super()._put_fanout(exchange, message, routing_key, **kwargs)


class LeaseSentinelChannel(LeaseChannel, kombu_redis.SentinelChannel):  # type: ignore[misc]
    """The same through Sentinel."""


class LeaseTransport(kombu_redis.Transport):  # type: ignore[misc]
    Channel = LeaseChannel


class LeaseSentinelTransport(kombu_redis.SentinelTransport):  # type: ignore[misc]
    Channel = LeaseSentinelChannel


class _Connected:
    """A kombu connection of a lease or table's own (opened on first use), its channel, and a
    plain redis-py client on the channel's pool (the channel's client may add the key prefix to
    some commands but not to others: every key here is prefixed by hand)."""

    def __init__(self, url: str, sentinel: bool, options: Mapping[str, Any], timeout: float | None) -> None:
        self._url = url
        self._transport = LeaseSentinelTransport if sentinel else LeaseTransport
        self._options = dict(options)
        if timeout is not None:
            # a call to a broker that stopped answering gives up in time for the lease's deadline
            transport_options = dict(self._options.get("transport_options") or {})
            for name in ("socket_timeout", "socket_connect_timeout"):
                given = transport_options.get(name)
                transport_options[name] = timeout if given is None else min(float(given), timeout)
            self._options["transport_options"] = transport_options
        self._connection: Any = None
        self._client: redis_py.Redis | None = None
        self._scripts: dict[str, Any] = {}

    @property
    def channel(self) -> LeaseChannel:
        if self._connection is None:
            self._connection = Connection(self._url, transport=self._transport, **self._options)
        channel: LeaseChannel = self._connection.default_channel
        return channel

    @property
    def client(self) -> redis_py.Redis:
        if self._client is None:
            self._client = redis_py.Redis(connection_pool=self.channel.pool)
        return self._client

    def key(self, name: str) -> str:
        return str(self.channel.global_keyprefix) + name

    def run(self, script: str, keys: list[str], args: list[Any]) -> Any:
        found = self._scripts.get(script)
        if found is None:
            found = self._scripts[script] = self.client.register_script(script)
        return found(keys=keys, args=args)

    def close(self) -> None:
        connection, self._connection, self._client = self._connection, None, None
        if connection is not None:
            connection.release()


class RedisLease:
    """A :class:`~worker_core.slots.Lease` (and :class:`~worker_core.slots.SendsOnce`) on Redis."""

    def __init__(self, url: str, sentinel: bool, options: Mapping[str, Any], name: str, holder: str,
                 ttl: float) -> None:
        check_lease(name, ttl)
        self.name = name
        self.holder = f"{holder}#{secrets.token_hex(3)}"
        self.ttl = float(ttl)
        self._redis = _Connected(url, sentinel, options, timeout=max(0.2, self.ttl / 3))
        self._held = ""  # the holding's value while this object holds the lease
        self._token: int | None = None
        self._base = f"worker.lease.{name}"

    def __repr__(self) -> str:
        return f"<RedisLease {self.name!r} {self.holder}>"

    @property
    def bound(self) -> float:
        return self.ttl

    @property
    def token(self) -> int | None:
        return self._token

    @property
    def _ttl_ms(self) -> int:
        return max(1, round(self.ttl * 1000))

    def acquire(self, wait: float = 0.0) -> int | None:
        deadline = time.monotonic() + wait
        while True:
            keys = [self._redis.key(self._base), self._redis.key(f"{self._base}.token")]
            token = self._redis.run(ACQUIRE, keys, [self.holder, self._ttl_ms, self._held])
            if token is not None:
                self._token = int(token)
                self._held = f"{self._token} {self.holder}"
                return self._token
            self._token, self._held = None, ""
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            time.sleep(min(0.05, left))

    def renew(self) -> bool:
        if self._token is None:
            return False
        if self._redis.run(RENEW, [self._redis.key(self._base)], [self._held, self._ttl_ms]):
            return True
        self._token, self._held = None, ""
        return False

    def release(self) -> None:
        if self._token is None:
            return
        held, self._token, self._held = self._held, None, ""
        self._redis.run(RELEASE, [self._redis.key(self._base)], [held])

    def current(self) -> LeaseState | None:
        key = self._redis.key(self._base)
        with self._redis.client.pipeline(transaction=True) as pipe:
            pipe.get(key)
            pipe.pttl(key)
            held, left = pipe.execute()
        if held is None:
            return None
        token, _, holder = bytes(held).decode().partition(" ")
        return LeaseState(holder, int(token), left / 1000 if left and left > 0 else None)

    def close(self) -> None:
        try:
            if self._token is not None:
                self.release()
        finally:
            self._redis.close()

    # -- sending once ----------------------------------------------------------------------------

    def send_once(self, key: str, publish: Callable[[Any], None], *, record: tuple[str, str] | None = None,
                  keep: float) -> bool:
        if self._token is None:
            raise LeaseLost(f"the lease {self.name!r} is not held by {self.holder}; nothing was sent")
        channel = self._redis.channel
        channel.keeping = keeping = _Keeping()
        try:
            publish(Producer(channel))
        finally:
            channel.keeping = None
        payloads = {payload for _, payload in keeping.pushes}
        if len(payloads) != 1:
            raise ValueError(f"send_once({key!r}) sends one message; the publish sent {len(payloads)}")
        field, value = record if record is not None else ("", "")
        sent = self._redis.run(
            SEND_ONCE,
            [self._redis.key(self._base), self._redis.key(f"{self._base}.sent.{key}"),
             self._redis.key(f"{self._base}.records"), *(name for name, _ in keeping.pushes)],
            [self._held, max(1, round(keep * 1000)), field, value, payloads.pop()],
        )
        if sent == -1:
            self._token, self._held = None, ""
            raise LeaseLost(f"the lease {self.name!r} was lost by {self.holder}; {key!r} was not sent")
        return bool(sent == 1)

    def records(self) -> dict[str, str] | None:
        found = self._redis.client.hgetall(self._redis.key(f"{self._base}.records"))
        return _texts(found)

    def write_records(self, changes: Mapping[str, str | None]) -> None:
        if self._token is None:
            raise LeaseLost(f"the lease {self.name!r} is not held by {self.holder}; nothing was written")
        args: list[Any] = [self._held]
        for field, value in changes.items():
            args += [field, "d", ""] if value is None else [field, "s", value]
        written = self._redis.run(WRITE_RECORDS, [self._redis.key(self._base),
                                                  self._redis.key(f"{self._base}.records")], args)
        if written == -1:
            self._token, self._held = None, ""
            raise LeaseLost(f"the lease {self.name!r} was lost by {self.holder}; nothing was written")


class RedisRecords:
    """A :class:`~worker_core.slots.RecordTable` on Redis: a hash and a version counter."""

    def __init__(self, url: str, sentinel: bool, options: Mapping[str, Any], name: str) -> None:
        check_lease(name)
        self.name = name
        self._redis = _Connected(url, sentinel, options, timeout=None)
        self._base = f"worker.records.{name}"

    def read(self) -> dict[str, str]:
        found = self._redis.client.hgetall(self._redis.key(self._base))
        return _texts(found)

    def version(self) -> int:
        found = self._redis.client.get(self._redis.key(f"{self._base}.version"))
        return 0 if found is None else int(found)

    def _write(self, op: str, key: str, value: str) -> int:
        return int(self._redis.run(WRITE_TABLE, [self._redis.key(self._base),
                                                 self._redis.key(f"{self._base}.version")], [op, key, value]))

    def put(self, key: str, value: str) -> None:
        self._write("s", key, value)

    def delete(self, key: str) -> bool:
        return self._write("d", key, "") == 1

    def close(self) -> None:
        self._redis.close()


if TYPE_CHECKING:
    _LEASE: type[Lease] = RedisLease
    _ONCE: type[SendsOnce] = RedisLease
    _TABLE: type[RecordTable] = RedisRecords
