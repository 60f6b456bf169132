"""The result backend on a Redis Cluster: Celery's keys and values (``celery-task-meta-<id>``,
Celery's meta in ``result_serializer``), one script per stored result on the primary of its key's
slot, published on a channel named like the key (sharded pub/sub where the cluster has it) for the
clients waiting; saved groups and chords (:mod:`.chords`) in keys tagged with the group id."""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from redis import exceptions as redis_errors

from worker_core.exceptions import ResultDecodeError, ResultError, ResultTimeout
from worker_core.redaction import redact_url
from worker_core.results import READY_STATES, SUCCESS, ResultCodec, make_meta, pending_meta

from .chords import ClusterChords
from .cluster import Refused
from .keys import key_slot
from .options import check_backend
from .scripts import COUNT, Script

if TYPE_CHECKING:
    from worker_core import Settings
    from worker_core.slots import (
        BackendCountsDeliveries,
        JoinsChords,
        ResultBackend,
        SavesGroups,
        SuccessIsFinal,
    )

    from .cluster import Router
    from .listener import ResultListener

__all__ = ["RedisClusterBackend"]

logger = logging.getLogger(__name__)

#: Store a task result unless SUCCESS is already stored, and publish it, atomically.
#:
#: KEYS[1] the result's key; ARGV: [1] the meta, [2] milliseconds to keep it (0: forever), [3]
#: how to publish ('s' SPUBLISH on the key's channel, 'p' PUBLISH), [4] for a meta Lua cannot
#: read (not JSON) the SHA-1 of the value the caller read ('' for none; absent for JSON): stored
#: only if that value is still there. 1 stored, 0 ignored (a SUCCESS is there), -1 changed since read.
STORE_RESULT = Script(
    "store-result",
    """
local current = redis.call('GET', KEYS[1])
if ARGV[4] then
  local seen = current and redis.sha1hex(current) or ''
  if seen ~= ARGV[4] then return -1 end
elseif current then
  local ok, meta = pcall(cjson.decode, current)
  if ok and type(meta) == 'table' and meta['status'] == 'SUCCESS' then return 0 end
end
local ms = tonumber(ARGV[2])
if ms <= 0 then redis.call('SET', KEYS[1], ARGV[1])
elseif ms % 1000 == 0 then redis.call('SETEX', KEYS[1], ms / 1000, ARGV[1])
else redis.call('PSETEX', KEYS[1], ms, ARGV[1]) end
if ARGV[3] == 's' then redis.call('SPUBLISH', KEYS[1], ARGV[1])
else redis.call('PUBLISH', KEYS[1], ARGV[1]) end
return 1
""",
)

#: Save a group's result and publish it. KEYS[1] the group key; ARGV: the value, seconds to keep
#: it (0: forever), how to publish.
SAVE_GROUP = Script(
    "save-group",
    """
if tonumber(ARGV[2]) > 0 then redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
else redis.call('SET', KEYS[1], ARGV[1]) end
if ARGV[3] == 's' then redis.call('SPUBLISH', KEYS[1], ARGV[1])
else redis.call('PUBLISH', KEYS[1], ARGV[1]) end
return 1
""",
)

#: Reads and conditional writes of a result in a serializer other than JSON before giving up.
CHECKED_STORE_ATTEMPTS = 10

_ERRORS = (redis_errors.ConnectionError, redis_errors.TimeoutError)


class _Connected:
    """The cluster client of one process, and its result subscriptions."""

    def __init__(self, backend: RedisClusterBackend) -> None:
        from .cluster import Router, connect

        config = backend.config
        self.pid = os.getpid()
        self.router: Router = Router(connect(config.seeds, config.connection))
        self.kind = self._kind(config.sharded_pubsub)
        self._listener: ResultListener | None = None
        self._decode = lambda value: backend.codec.decode(value, "a result published")
        self._lock = threading.Lock()

    def _kind(self, sharded: bool | None) -> str:
        if sharded is not None:
            return "s" if sharded else "p"
        client = self.router.client
        node = client.get_redis_connection(client.get_default_node())
        try:
            node.execute_command("SPUBLISH", "{worker}:probe", "")
        except redis_errors.MovedError:
            pass
        except redis_errors.ResponseError:
            return "p"
        return "s"

    @property
    def listener(self) -> ResultListener:
        if self._listener is None:
            with self._lock:
                if self._listener is None:
                    from .listener import ResultListener

                    self._listener = ResultListener(self.router, self.kind == "s", self._decode)
        return self._listener

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
        self.router.close()


class RedisClusterBackend(ClusterChords):
    """Results in ``celery-task-meta-<id>`` (Celery's meta in ``result_serializer``), kept
    ``result_expires`` seconds, published on a channel of the same name; a SUCCESS is never
    overwritten. Thread-safe; in a forked child it connects again."""

    success_is_final: ClassVar[bool] = True

    def __init__(self, url: str, settings: Settings) -> None:
        self.url = url
        self.config = check_backend(
            url, settings.result_backend_transport_options, settings.redis_backend_use_ssl
        )
        self.expires = settings.result_expires
        self.extended = settings.result_extended
        self.chord_expires = (
            settings.result_expires
            if settings.result_chord_expires is None
            else settings.result_chord_expires
        )
        self.codec = ResultCodec.from_settings(settings)
        self.chord_ordered = self.config.chord_ordered
        self._lock = threading.Lock()
        self._connected: _Connected | None = None

    def __repr__(self) -> str:
        return f"<RedisClusterBackend {redact_url(self.url)}>"

    def key_for(self, task_id: str) -> str:
        return f"{self.config.key_prefix}celery-task-meta-{task_id}"

    def group_key(self, group_id: str, suffix: str = "") -> str:
        return f"{self.config.key_prefix}celery-taskset-meta-{{{group_id}}}{suffix}"

    # -- worker side -------------------------------------------------------------------------------

    def store_result(
        self,
        task_id: str,
        result: Any,
        state: str,
        traceback: str | None = None,
        request: Mapping[str, Any] | None = None,
        *,
        serializer: str | None = None,
    ) -> None:
        meta = make_meta(task_id, state, result, traceback, request, extended=self.extended)
        name = serializer or self.codec.serializer
        try:
            payload = self.codec.encode(meta, name)
        except Exception as exc:
            raise ResultError(
                f"cannot encode the result of task {task_id} as {name}: {type(exc).__name__}: {exc}"
            ) from exc
        milliseconds = round(self.expires * 1000) if self.expires else 0
        key = self.key_for(task_id)
        action = f"store the result of task {task_id}"
        if name == "json":
            self._retrying(
                action,
                lambda connected: self._run(
                    connected, STORE_RESULT, [key], [payload, milliseconds, connected.kind]
                ),
            )
            return

        def store_checked(connected: _Connected) -> Any:
            """A meta Lua cannot read: read the key and look for a SUCCESS here, then write only if
            the key still holds what was read."""
            current = self._one(connected, key, ("GET", key))
            if current is not None and self._holds_success(current, task_id):
                return 0
            raw = current if isinstance(current, bytes) else str(current).encode()
            seen = hashlib.sha1(raw).hexdigest() if current is not None else ""
            return self._run(connected, STORE_RESULT, [key], [payload, milliseconds, connected.kind, seen])

        for _ in range(CHECKED_STORE_ATTEMPTS):
            if self._retrying(action, store_checked) != -1:
                return
        raise ResultError(
            f"cannot store the result of task {task_id}: {key} changed each of {CHECKED_STORE_ATTEMPTS} "
            f"times between reading and writing it"
        )

    def _holds_success(self, value: bytes | str, task_id: str) -> bool:
        try:
            meta = self.codec.decode(value, f"the stored result of task {task_id}")
        except ResultDecodeError:
            return False
        return bool(meta.get("status") == SUCCESS)

    # -- client side -------------------------------------------------------------------------------

    def get_task_meta(self, task_id: str) -> Mapping[str, Any]:
        return self._read(task_id) or pending_meta(task_id)

    def _read(self, task_id: str) -> dict[str, Any] | None:
        key = self.key_for(task_id)
        value = self._retrying(
            f"read the result of task {task_id}", lambda connected: self._one(connected, key, ("GET", key))
        )
        if value is None:
            return None
        return self.codec.decode(value, f"the stored result of task {task_id} ({key})")

    def on_task_call(self, task_id: str) -> None:
        """Subscribe to the task's channel before it is sent, so its publish is not missed."""
        try:
            self._current().listener.subscribe(self.key_for(task_id), early=True)
        except Exception as exc:
            logger.warning("could not subscribe to the result of task %s: %r", task_id, exc)

    def wait_for(
        self, task_id: str, timeout: float | None = None, interval: float = 0.5
    ) -> Mapping[str, Any]:
        """Wait on pub/sub, reading the key again every ``interval`` seconds as well."""

        def ready(key: str) -> dict[str, Any] | None:
            meta = self._read(task_id)
            return meta if meta is not None and meta.get("status") in READY_STATES else None

        try:
            return self._current().listener.wait(self.key_for(task_id), timeout, ready, interval)
        except ResultTimeout as exc:
            try:
                state = str(self.get_task_meta(task_id).get("status"))
            except Exception:
                state = "unknown"
            raise ResultTimeout(
                f"task {task_id} did not finish within {timeout:g}s (state: {state}); {exc}"
            ) from None

    def forget(self, task_id: str) -> None:
        key = self.key_for(task_id)
        self._retrying(
            f"forget the result of task {task_id}", lambda connected: self._one(connected, key, ("DEL", key))
        )

    # -- groups ------------------------------------------------------------------------------------

    def save_group(self, group_id: str, result: Any) -> None:
        key, value = self.group_key(group_id), self.codec.encode({"result": result})
        seconds = round(self.expires) if self.expires else 0
        self._retrying(
            f"save group {group_id}",
            lambda connected: self._run(connected, SAVE_GROUP, [key], [value, seconds, connected.kind]),
        )

    def restore_group(self, group_id: str) -> Any | None:
        key = self.group_key(group_id)
        value = self._retrying(
            f"restore group {group_id}", lambda connected: self._one(connected, key, ("GET", key))
        )
        if value is None:
            return None
        meta = self.codec.decode(value, f"the saved group {group_id} ({key})")
        if "result" not in meta:
            raise ResultError(f"the saved group {group_id} ({key}) has no 'result': {meta!r}")
        return meta["result"]

    def delete_group(self, group_id: str) -> None:
        key = self.group_key(group_id)
        self._retrying(f"delete group {group_id}", lambda connected: self._one(connected, key, ("DEL", key)))

    # -- the poison cap's counters ------------------------------------------------------------

    def count_delivery(self, key: str, expires: float) -> int:
        """INCR and PEXPIRE ``key`` (after the ``global_keyprefix``) in one script, at once."""
        name = self.config.key_prefix + key
        return int(self._run(self._current(), COUNT, [name], [max(1, round(expires * 1000))]))

    def close(self) -> None:
        with self._lock:
            connected, self._connected = self._connected, None
        if connected is not None and connected.pid == os.getpid():
            connected.close()

    # -- internals -------------------------------------------------------------------------------

    def _script(self, script: Script, keys: list[str], args: list[Any], action: str) -> Any:
        return self._retrying(action, lambda connected: self._run(connected, script, keys, args))

    def _command(self, key: str, command: tuple[Any, ...], action: str) -> Any:
        return self._retrying(action, lambda connected: self._one(connected, key, command))

    @staticmethod
    def _run(connected: _Connected, script: Script, keys: list[str], args: list[Any]) -> Any:
        router = connected.router
        return router.run(
            key_slot(keys[0]), [router.script(script, keys, args)], write=False, retry=True
        ).replies[0]

    @staticmethod
    def _one(connected: _Connected, key: str, command: tuple[Any, ...]) -> Any:
        return connected.router.run(key_slot(key), [command], write=False, retry=True).replies[0]

    def _current(self) -> _Connected:
        connected = self._connected
        if connected is None or connected.pid != os.getpid():
            with self._lock:
                connected = self._connected
                if connected is None or connected.pid != os.getpid():
                    # after a fork the parent's connections stay untouched: this process opens its own
                    try:
                        connected = self._connected = _Connected(self)
                    except (ValueError, TypeError) as exc:
                        raise ResultError(
                            f"cannot use the result backend {redact_url(self.url)!r}: {exc}"
                        ) from exc
        return connected

    def _retrying(self, action: str, call: Callable[[_Connected], Any]) -> Any:
        """``call`` with Celery's retry policy for connection errors (20 tries, 1 s apart)."""
        policy = self.config.retry_policy
        retries, interval = 0, float(policy["interval_start"])
        while True:
            try:
                connected = self._current()
                return call(connected)
            except Refused as exc:
                raise ResultError(f"cannot {action} in the Redis Cluster: {exc}") from exc
            except _ERRORS as exc:
                if retries >= policy["max_retries"]:
                    raise ResultError(f"cannot {action} in the Redis Cluster: {exc}") from exc
                retries += 1
                logger.warning(
                    "cannot %s in the Redis Cluster (%s); retry %d/%d in %.1fs",
                    action,
                    exc,
                    retries,
                    policy["max_retries"],
                    interval,
                )
                time.sleep(interval)  # the pause is the retry policy's
                interval = min(interval + float(policy["interval_step"]), float(policy["interval_max"]))


if TYPE_CHECKING:
    _BACKEND: type[ResultBackend] = RedisClusterBackend
    _FINAL: type[SuccessIsFinal] = RedisClusterBackend
    _GROUPS: type[SavesGroups] = RedisClusterBackend
    _CHORDS: type[JoinsChords] = RedisClusterBackend
    _COUNTS: type[BackendCountsDeliveries] = RedisClusterBackend
