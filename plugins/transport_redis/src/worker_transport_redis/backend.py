"""The Redis result backend: Celery's keys and values, one round trip per stored result, and
waiting on pub/sub as Celery's client does, so Celery clients and workers share the results;
saved groups and chords (:mod:`.chords`), in Celery's keys too."""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from worker_core.exceptions import ResultDecodeError, ResultError, ResultTimeout
from worker_core.redaction import redact_url
from worker_core.results import READY_STATES, SUCCESS, ResultCodec, make_meta, pending_meta

from .backend_options import check_backend
from .chords import COUNT_PART, FINISH, RedisChords
from .refusals import Backoff, refusal

if TYPE_CHECKING:
    from worker_core import Settings
    from worker_core.slots import (
        BackendCountsDeliveries,
        JoinsChords,
        ResultBackend,
        SavesGroups,
        SuccessIsFinal,
    )

    from .listener import ResultListener

__all__ = ["RedisBackend"]

logger = logging.getLogger(__name__)

#: Reads and conditional writes of a result in a serializer other than JSON before giving up,
#: when other writers keep changing its key in between.
CHECKED_STORE_ATTEMPTS = 10


def _bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else value  # as Redis holds it


def _certificate_refused(exc: BaseException) -> bool:
    """Whether ``exc`` (redis-py wraps the socket's error) comes from a certificate check."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class _Connected:
    """The connections of one process: the pool, a client, the store script, the listener."""

    def __init__(self, pool: Any, codec: ResultCodec) -> None:
        import redis

        from .listener import ResultListener
        from .scripts import STORE_RESULT

        self.pid = os.getpid()
        self.pool = pool
        self.client = redis.Redis(connection_pool=pool)
        self.store = self.client.register_script(STORE_RESULT)
        self.chord_count = self.client.register_script(COUNT_PART)
        self.chord_finish = self.client.register_script(FINISH)
        self.listener: ResultListener = ResultListener(
            self.client, lambda value: codec.decode(value, "a result published"))
        self.errors: tuple[type[BaseException], ...] = (redis.ConnectionError, redis.TimeoutError)


class RedisBackend(RedisChords):
    """Results in ``celery-task-meta-<id>`` (Celery's meta in ``result_serializer``, kombu JSON by
    default), kept ``result_expires`` seconds, published on a channel of the same name; a
    SUCCESS is never overwritten.

    Thread-safe; in a forked child it connects again (the parent's sockets are left alone).
    """

    #: The store script never replaces a SUCCESS (a late duplicate run cannot overwrite it).
    success_is_final: ClassVar[bool] = True

    def __init__(self, url: str, settings: Settings) -> None:
        self.url = url
        self.config = check_backend(url, settings.result_backend_transport_options,
                                    settings.redis_backend_use_ssl)
        self.expires = settings.result_expires
        self.extended = settings.result_extended
        self.chord_expires = (settings.result_expires if settings.result_chord_expires is None
                              else settings.result_chord_expires)
        self.codec = ResultCodec.from_settings(settings)
        self.chord_ordered = bool(self.config.options.get("result_chord_ordered", True))
        self._lock = threading.Lock()
        self._connected: _Connected | None = None
        #: since when (monotonic) Redis refuses this process's writes, else None
        self._refused_since: float | None = None

    def __repr__(self) -> str:
        return f"<RedisBackend {self.config.scheme}>"

    def key_for(self, task_id: str) -> str:
        return self.config.key_prefix + task_id

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
            raise ResultError(f"cannot encode the result of task {task_id} as {name}: "
                              f"{type(exc).__name__}: {exc}") from exc
        # Celery: no expiry when result_expires is unset or 0.
        milliseconds = round(self.expires * 1000) if self.expires else 0
        key = self.key_for(task_id)
        if name == "json":
            args: list[str | bytes | int] = [payload, milliseconds]
            self._retrying(f"store the result of task {task_id}",
                           lambda connected: connected.store(keys=[key], args=args))
        else:
            self._retrying(f"store the result of task {task_id}", lambda connected: self._store_checked(
                connected, task_id, key, payload, milliseconds))

    # -- client side -------------------------------------------------------------------------------

    def get_task_meta(self, task_id: str) -> Mapping[str, Any]:
        return self._read(task_id) or pending_meta(task_id)

    def on_task_call(self, task_id: str) -> None:
        """Subscribe to the task's channel before it is sent, so its PUBLISH cannot be missed."""
        try:
            self._current().listener.subscribe(self.key_for(task_id), early=True)
        except Exception as exc:
            # Sending the task matters more: wait_for subscribes again and reads the key.
            logger.warning("could not subscribe to the result of task %s: %r", task_id, exc)

    def wait_for(
        self, task_id: str, timeout: float | None = None, interval: float = 0.5
    ) -> Mapping[str, Any]:
        """Wait on pub/sub (``interval`` is not used: nothing is polled)."""
        def ready(key: str) -> dict[str, Any] | None:
            meta = self._read(task_id)
            return meta if meta is not None and meta.get("status") in READY_STATES else None

        try:
            return self._current().listener.wait(self.key_for(task_id), timeout, ready)
        except ResultTimeout as exc:
            state = self._state_for_timeout(task_id)
            raise ResultTimeout(f"task {task_id} did not finish within {timeout:g}s (state: {state}); "
                                f"{exc}") from None

    def forget(self, task_id: str) -> None:
        key = self.key_for(task_id)
        self._retrying(f"forget the result of task {task_id}", lambda connected: connected.client.delete(key))

    # -- groups and chords ---------------------------------------------------------------------

    def group_key(self, group_id: str, suffix: str = "") -> str:
        return f"{self.config.group_prefix}{group_id}{suffix}"

    def save_group(self, group_id: str, result: Any) -> None:
        """``celery-taskset-meta-<group_id>`` = ``{"result": result}``, kept ``result_expires``
        and published on a channel of the same name, as Celery saves a GroupResult."""
        key, value = self.group_key(group_id), self.codec.encode({"result": result})
        seconds = round(self.expires) if self.expires else 0

        def save(connected: _Connected) -> Any:
            with connected.client.pipeline() as pipe:
                pipe.set(key, value, ex=seconds or None)
                pipe.publish(key, value)
                return pipe.execute()

        self._retrying(f"save group {group_id}", save)

    def restore_group(self, group_id: str) -> Any | None:
        key = self.group_key(group_id)
        value = self._retrying(f"restore group {group_id}", lambda connected: connected.client.get(key))
        if value is None:
            return None
        meta = self.codec.decode(value, f"the saved group {group_id} ({key})")
        if "result" not in meta:
            raise ResultError(f"the saved group {group_id} ({key}) has no 'result': {meta!r}")
        return meta["result"]

    def delete_group(self, group_id: str) -> None:
        key = self.group_key(group_id)
        self._retrying(f"delete group {group_id}", lambda connected: connected.client.delete(key))

    # -- the poison cap's counters ------------------------------------------------------------

    def count_delivery(self, key: str, expires: float) -> int:
        """INCR and EXPIRE ``key`` (after the ``global_keyprefix``) in one transaction, at once:
        the worker waits on it, so a connection error is raised, not retried."""
        name = self.config.counter_prefix + key
        with self._current().client.pipeline(transaction=True) as pipe:
            pipe.incr(name)
            pipe.expire(name, max(1, round(expires)))
            count, _ = pipe.execute()
        return int(count)

    def close(self) -> None:
        with self._lock:
            connected, self._connected = self._connected, None
        if connected is not None and connected.pid == os.getpid():
            connected.listener.close()
            connected.pool.disconnect()

    # -- internals -------------------------------------------------------------------------------

    def _current(self) -> _Connected:
        connected = self._connected
        if connected is None or connected.pid != os.getpid():
            with self._lock:
                connected = self._connected
                if connected is None or connected.pid != os.getpid():
                    # After a fork the parent's connections stay untouched (closing them here
                    # would shut the parent's sockets): this process opens its own.
                    self._refused_since = None  # (another process: its own refusals)
                    try:
                        connected = self._connected = _Connected(self.config.pool(), self.codec)
                    except (ValueError, TypeError) as exc:
                        raise ResultError(
                            f"cannot use the result backend {redact_url(self.url)!r}: {exc}") from exc
        return connected

    def _store_checked(self, connected: _Connected, task_id: str, key: str, payload: str | bytes,
                       milliseconds: int) -> None:
        """Store a meta Lua cannot read (not JSON): read the key and look for a SUCCESS here,
        then write only if the key still holds what was read."""
        import hashlib  # here: OpenSSL's library is loaded only by a worker storing results so

        for _ in range(CHECKED_STORE_ATTEMPTS):
            current = connected.client.get(key)
            if current is not None and self._holds_success(current, task_id):
                return
            seen = hashlib.sha1(_bytes(current)).hexdigest() if current is not None else ""
            if connected.store(keys=[key], args=[payload, milliseconds, seen]) != -1:
                return
        raise ResultError(f"cannot store the result of task {task_id}: {key} changed each of "
                          f"{CHECKED_STORE_ATTEMPTS} times between reading and writing it")

    def _holds_success(self, value: bytes | str, task_id: str) -> bool:
        try:
            meta = self.codec.decode(value, f"the stored result of task {task_id}")
        except ResultDecodeError:
            return False  # unreadable here (a format not accepted): replaced, as a SUCCESS cannot be told
        return bool(meta.get("status") == SUCCESS)

    def _read(self, task_id: str) -> dict[str, Any] | None:
        key = self.key_for(task_id)
        value = self._retrying(f"read the result of task {task_id}",
                               lambda connected: connected.client.get(key))
        if value is None:
            return None
        return self.codec.decode(value, f"the stored result of task {task_id} ({key})")

    def _state_for_timeout(self, task_id: str) -> str:
        try:
            return str(self.get_task_meta(task_id).get("status"))
        except Exception:
            return "unknown"

    def _refused(self, reason: str) -> None:
        with self._lock:
            if self._refused_since is not None:
                return
            self._refused_since = time.monotonic()
        logger.warning("The result backend's Redis refuses work: %s; each result is tried again with a "
                       "growing delay for up to %gs (refused_retry_seconds), then FAILURE is stored with "
                       "the reason (said once until it takes them again)", reason,
                       self.config.refused_retry_seconds)

    def _accepted(self) -> None:
        since = self._refused_since
        if since is None:
            return
        with self._lock:
            if self._refused_since is None:
                return
            self._refused_since = None
        logger.warning("The result backend's Redis takes work again after %.1fs", time.monotonic() - since)

    def _retrying(self, action: str, call: Callable[[_Connected], Any]) -> Any:
        """``call`` with Celery's retry policy for connection errors (20 tries, 1 s apart); while
        Redis refuses (out of memory, read-only, busy), again after a growing, jittered delay, for
        up to ``refused_retry_seconds``. A refusal is said once per process, and so is its end."""
        policy = self.config.retry_policy
        retries, interval = 0, float(policy["interval_start"])
        refused_at: float | None = None
        backoff = Backoff(first=0.1, cap=2.0)
        while True:
            connected = self._current()
            try:
                done = call(connected)
                self._accepted()
                return done
            except Exception as exc:
                reason = refusal(exc)
                if reason is not None:
                    now = time.monotonic()
                    refused_at = now if refused_at is None else refused_at
                    self._refused(reason)
                    bound = self.config.refused_retry_seconds
                    if now - refused_at >= bound:
                        raise ResultError(f"cannot {action} in Redis ({self.config.scheme}): it refused "
                                          f"for {bound:g}s: {reason}") from exc
                    time.sleep(min(backoff.failed(), max(bound - (now - refused_at), 0.0)))
                    continue
                if not isinstance(exc, connected.errors):
                    raise
                if _certificate_refused(exc):
                    raise ResultError(f"cannot {action} in Redis ({self.config.scheme}): {exc} (the server's "
                                      f"certificate was refused; retrying does not change that)") from exc
                if retries >= policy["max_retries"]:
                    raise ResultError(f"cannot {action} in Redis ({self.config.scheme}): {exc}") from exc
                retries += 1
                logger.warning("cannot %s in Redis (%s); retry %d/%d in %.1fs", action, exc, retries,
                               policy["max_retries"], interval)
                time.sleep(interval)
                interval = min(interval + float(policy["interval_step"]), float(policy["interval_max"]))


if TYPE_CHECKING:
    # mypy proves the class satisfies its slot's Protocol and the capabilities it offers.
    _BACKEND: type[ResultBackend] = RedisBackend
    _FINAL: type[SuccessIsFinal] = RedisBackend
    _GROUPS: type[SavesGroups] = RedisBackend
    _CHORDS: type[JoinsChords] = RedisBackend
    _COUNTS: type[BackendCountsDeliveries] = RedisBackend
