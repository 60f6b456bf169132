"""Storing a task's state on Celery's Redis result backend in one round trip.

Celery's Redis backend reads the stored meta first (a SUCCESS already stored is never replaced),
then writes and publishes it in a pipeline: two round trips for every task, the most of a no-op
task's cost in a pool process. :class:`AtomicRedisBackend` is that backend with the same
configuration (URL, key prefix, expiry, serializer, retry policy), whose store does the check,
the write and the publish in one Lua script: the same keys and values, the same messages to
waiting clients, the check and the write now atomic. It serves the app's tasks in the worker's
processes (as ``task.backend``, Celery's own way of giving a task a backend) when the app's
backend is Celery's Redis backend itself and its results are JSON; any other backend is used as
it is. It relies on Celery's backend internals, so it is a fast path
(:mod:`worker_core.fastpaths`): checked against the Celery versions it was tested with and the
names it relies on before its first use, turned off with one log line when they changed (or with
``WORKER_STOCK_KOMBU=1``), Celery's own store running instead.
"""

from __future__ import annotations

import hashlib
import logging
import os
from typing import TYPE_CHECKING, Any

import celery as _celery_package
from celery import states
from celery.backends.base import BaseKeyValueStoreBackend
from celery.backends.redis import RedisBackend
from celery.exceptions import BackendStoreError
from kombu.utils.encoding import bytes_to_str
from redis.exceptions import NoScriptError

from worker_core.fastpaths import FastPath, FastPaths, Library, attribute, reads, signature

if TYPE_CHECKING:
    from celery import Celery

__all__ = ["PATHS", "AtomicRedisBackend", "atomic_backend_for", "current", "forget"]

logger = logging.getLogger(__name__)

CELERY = Library(_celery_package, "celery", (5, 5), (5, 8))

#: the store replaced and what it does, as this module does it
PATHS = {
    "store": FastPath(
        "the one-round-trip result store", "Celery's Redis backend stores each state itself (a read, "
        "then the write and the publish)", (CELERY,), (
            signature(BaseKeyValueStoreBackend, "_store_result",
                      "(self, task_id, result, state, traceback=None, request=None, **kwargs)"),
            reads(BaseKeyValueStoreBackend, "_store_result", "_get_result_meta", "_get_task_meta_for",
                  "_set_with_state", "get_key_for_task", "encode", "SUCCESS"),
            signature(RedisBackend, "_get_result_meta",
                      "(self, result, state, traceback, request, format_date=True, encode=False)"),
            reads(RedisBackend, "_set_with_state", "failure_expires", "FAILURE", "set"),
            reads(RedisBackend, "set", "_MAX_STR_VALUE_SIZE", "ensure", "_set"),
            reads(RedisBackend, "_set", "expires", "setex", "publish"),
            attribute(RedisBackend, "_MAX_STR_VALUE_SIZE"),
        ), still="results are stored as Celery stores them, in two round trips"),
}

_fast_paths = FastPaths(PATHS, "worker-celery", logger)
#: whether the fast path is on in this process: decided at the first call, said once in the log
current = _fast_paths.current
#: decide again at the next :func:`current`
forget = _fast_paths.forget

#: KEYS[1] the task's key; ARGV[1] the encoded meta, ARGV[2] seconds to keep it (0: for ever)
STORE_UNLESS_SUCCESS = """
local current = redis.call('GET', KEYS[1])
if current then
    local ok, meta = pcall(cjson.decode, current)
    if ok and type(meta) == 'table' and meta['status'] == 'SUCCESS' then
        return 0
    end
end
local seconds = tonumber(ARGV[2])
if seconds > 0 then
    redis.call('SETEX', KEYS[1], seconds, ARGV[1])
else
    redis.call('SET', KEYS[1], ARGV[1])
end
redis.call('PUBLISH', KEYS[1], ARGV[1])
return 1
"""


#: what EVALSHA names the script by
STORE_SHA = hashlib.sha1(STORE_UNLESS_SUCCESS.encode()).hexdigest()


class AtomicRedisBackend(RedisBackend):  # type: ignore[misc]
    """Celery's Redis result backend, storing each state in one round trip (see the module).

    The stores go through one connection of this process's own, made by the backend's pool (its
    URL, TLS and timeouts), which saves the pool's checkout and release per task (a third of a
    store's cost in redis-py); reads, subscriptions and chords use the pool as Celery does.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._store_connection: Any = None
        self._store_pid = 0

    def _store_result(self, task_id: Any, result: Any, state: str, traceback: Any = None,
                      request: Any = None, **kwargs: Any) -> Any:
        meta = self._get_result_meta(result=result, state=state, traceback=traceback, request=request)
        meta["task_id"] = bytes_to_str(task_id)
        value = self.encode(meta)
        if isinstance(value, str) and len(value) > self._MAX_STR_VALUE_SIZE:
            raise BackendStoreError("value too large for Redis backend", state=state, task_id=task_id)
        expires = self.failure_expires if state == states.FAILURE else self.expires
        self.ensure(self._store_unless_success, (self.get_key_for_task(task_id), value, expires or 0))
        return result

    def _store_unless_success(self, key: Any, value: Any, expires: float) -> None:
        if self._store_connection is None or self._store_pid != os.getpid():
            self._store_connection = self.client.connection_pool.make_connection()
            self._store_pid = os.getpid()
        connection = self._store_connection
        try:
            try:
                connection.send_command("EVALSHA", STORE_SHA, 1, key, value, int(expires))
                connection.read_response()
            except NoScriptError:  # a new or flushed server: load it, then store
                connection.send_command("SCRIPT", "LOAD", STORE_UNLESS_SUCCESS)
                connection.read_response()
                connection.send_command("EVALSHA", STORE_SHA, 1, key, value, int(expires))
                connection.read_response()
        except BaseException:
            connection.disconnect()  # the next attempt (``ensure`` retries) connects again
            raise


def atomic_backend_for(app: Celery) -> AtomicRedisBackend | None:
    """The one-round-trip store for ``app``'s results, or None when its backend is not Celery's
    Redis backend with JSON results, or the fast path is off (the backend is used as it is)."""
    backend = app.backend
    if type(backend) is not RedisBackend or backend.serializer != "json" or "store" not in current():
        return None
    return AtomicRedisBackend(app=app, url=backend.url)
