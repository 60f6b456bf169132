"""One client's reply queue (the client's side of ``rpc://``): declared as Celery's client
declares it, consumed without acknowledgements, and each task's latest state kept until the
client reads it, whatever order tasks finish in."""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from kombu.exceptions import OperationalError

from ...exceptions import ResultDecodeError, ResultError, ResultTimeout
from ..meta import PENDING, READY_STATES, SUCCESS, pending_meta

if TYPE_CHECKING:
    from kombu.connection import Connection
    from kombu.entity import Queue

    from ..codec import ResultCodec

__all__ = ["KEPT_UNREAD", "Replies"]

logger = logging.getLogger(__name__)

#: States kept for tasks not asked about yet, per client; beyond it the oldest is dropped, with
#: a warning (Celery's client keeps 8,192 in all).
KEPT_UNREAD = 100_000
#: Finished states kept after they were read (another AsyncResult of the same task reads them).
KEPT_READ = 10_000
#: Forgotten task ids whose states are dropped if they still arrive.
KEPT_FORGOTTEN = 10_000
#: Messages taken at most by one non-blocking look at the queue (``get_task_meta``).
TAKEN_AT_ONCE = 10_000

_Meta = Mapping[str, Any]


class Replies:
    """The reply queue named ``oid`` of one thread of one process, and what arrived on it.

    Used by its own thread only (:meth:`close` aside). States arrive on one connection of its
    own: the queue is declared on it before a task is sent (:meth:`declare`) and consumed from
    the first read on, with ``no_ack`` as Celery's client consumes it.

    :param connect: a new (not yet connected) kombu connection to the broker.
    :param queue: the reply queue, as Celery declares it (see ``RPCBackend.reply_queue``).
    :param refresh: seconds after which :meth:`declare` declares the queue again while nothing
        consumes it (RabbitMQ deletes a queue unused for its ``x-expires``); None: never again.
    :param retry_policy: how often and how long apart to connect again after a lost connection.
    """

    def __init__(self, oid: str, connect: Callable[[], Connection], queue: Queue, codec: ResultCodec,
                 broker: str, refresh: float | None, retry_policy: Mapping[str, float]) -> None:
        self.oid = oid
        self.pid = os.getpid()
        self._connect = connect
        self._queue = queue
        self._codec = codec
        self._broker = broker
        self._refresh = refresh
        self._retry_policy = retry_policy
        self._connection: Any = None
        self._consumer: Any = None
        self._declared_at: float | None = None
        self._unread: dict[str, _Meta | ResultDecodeError] = {}
        self._read: OrderedDict[str, _Meta] = OrderedDict()
        self._forgotten: OrderedDict[str, None] = OrderedDict()
        self._dropped = 0

    # -- what the backend asks ---------------------------------------------------------------------

    def declare(self) -> None:
        """Make sure the queue exists before a task naming it is sent (a broker drops what is sent
        to a queue that does not exist): declared once per connection, and again after
        ``refresh`` seconds while nothing consumes it."""
        if self._consumer is not None:
            return  # consuming keeps it
        at = self._declared_at
        if at is not None and self._connection is not None and (
                self._refresh is None or time.monotonic() - at < self._refresh):
            return
        self._retrying("declare", lambda connection: self._queue(connection.default_channel).declare())
        self._declared_at = time.monotonic()

    def meta(self, task_id: str) -> _Meta:
        """The latest state that arrived for ``task_id`` (PENDING when none), after taking what
        has arrived by now."""
        self._take_arrived()
        return self._lookup(task_id) or pending_meta(task_id)

    def wait(self, task_id: str, timeout: float | None) -> _Meta:
        """Wait until a finished state of ``task_id`` arrives, keeping what comes for others."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            found = self._lookup(task_id)
            if found is not None and found.get("status") in READY_STATES:
                return found
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise ResultTimeout(self._timed_out(task_id, timeout or 0, found))
            self._drain(left)

    def forget(self, task_id: str) -> None:
        """Drop what arrived for ``task_id``, and what still comes for it."""
        if self._connection is not None:
            self._take_arrived()
        self._unread.pop(task_id, None)
        self._read.pop(task_id, None)
        self._forgotten[task_id] = None
        if len(self._forgotten) > KEPT_FORGOTTEN:
            self._forgotten.popitem(last=False)

    def close(self) -> None:
        """Close the connection (what arrived stays; the next use connects again). RabbitMQ then
        deletes the queue if something consumed it (it is ``auto_delete``, as Celery's)."""
        connection, self._connection, self._consumer, self._declared_at = self._connection, None, None, None
        if connection is not None and self.pid == os.getpid():
            _release(connection)

    # -- reading -----------------------------------------------------------------------------------

    def _lookup(self, task_id: str) -> _Meta | None:
        state = self._unread.get(task_id)
        if state is None:
            read = self._read.get(task_id)
            if read is not None:
                self._read.move_to_end(task_id)
            return read
        if isinstance(state, ResultDecodeError):
            raise state
        if state.get("status") in READY_STATES:
            del self._unread[task_id]
            self._read[task_id] = state
            if len(self._read) > KEPT_READ:
                self._read.popitem(last=False)
        return state

    def _take_arrived(self) -> None:
        for _ in range(TAKEN_AT_ONCE):
            if not self._drain(0):
                return

    def _drain(self, timeout: float | None) -> bool:
        """Wait up to ``timeout`` seconds (None: no limit) for what arrives; False if nothing did.
        A lost connection is opened again (on the next call if this one found it lost)."""
        connection = self._consuming()
        try:
            connection.drain_events(timeout=timeout)
        except TimeoutError:
            return False
        except (*connection.connection_errors, *connection.channel_errors) as exc:
            logger.warning("lost the connection to the broker %s while reading results on reply queue %s "
                           "(%s: %s); connecting again", self._broker, self.oid, type(exc).__name__, exc)
            self.close()
            return False
        return True

    def _consuming(self) -> Any:
        if self._consumer is None:
            def consume(connection: Any) -> Any:
                import kombu

                consumer = kombu.Consumer(  # type: ignore[attr-defined,no-untyped-call]
                    connection.default_channel, [self._queue], on_message=self._arrived, no_ack=True)
                consumer.consume()  # declared first (auto_declare), on the channel that consumes
                return consumer

            self._consumer = self._retrying("consume", consume)
            self._declared_at = time.monotonic()
        return self._connection

    def _arrived(self, message: Any) -> None:
        properties = message.properties or {}
        correlation_id = properties.get("correlation_id")
        what = f"the result of task {correlation_id} on reply queue {self.oid}"
        try:
            meta = self._codec.decode_message(message.body, message.content_type, message.content_encoding,
                                              what)
            if not isinstance(meta.get("status"), str):
                raise ResultDecodeError(f"{what} is not Celery's format: it has no status ({meta!r:.200})")
        except ResultDecodeError as exc:
            if isinstance(correlation_id, str) and correlation_id not in self._forgotten:
                self._unread[correlation_id] = exc  # raised when that task is read
            else:
                logger.error("dropped a message on reply queue %s: %s", self.oid, exc)
            return
        task_id = meta.get("task_id") or correlation_id
        if not isinstance(task_id, str):
            logger.error("dropped a message on reply queue %s naming no task (no task_id, no "
                         "correlation_id): %r", self.oid, dict(meta))
            return
        self._keep(task_id, meta)

    def _keep(self, task_id: str, meta: _Meta) -> None:
        if task_id in self._forgotten:
            return
        current = self._unread.get(task_id) or self._read.get(task_id)
        if isinstance(current, Mapping):
            status = current.get("status")
            if status == SUCCESS:
                return  # a SUCCESS stays, as a stored one does: a late duplicate run cannot undo it
            if status in READY_STATES and meta["status"] not in READY_STATES:
                return  # a state from before it finished, come late on another connection
        self._read.pop(task_id, None)
        self._unread[task_id] = meta
        if len(self._unread) > KEPT_UNREAD:
            oldest = next(iter(self._unread))
            del self._unread[oldest]
            self._dropped += 1
            log = logger.warning if self._dropped == 1 else logger.debug
            log("reply queue %s holds states of more than %d tasks not asked about: dropped the oldest "
                "(task %s); read results as they come, or forget those you do not need", self.oid,
                KEPT_UNREAD, oldest)

    def _timed_out(self, task_id: str, timeout: float, found: _Meta | None) -> str:
        state = found.get("status") if found is not None else PENDING
        text = f"task {task_id} did not finish within {timeout:g}s (state: {state})"
        if found is None:
            text += (f"; with the rpc result backend only the client that sent a task receives its states, "
                     f"on its reply queue (this thread's is {self.oid}): read its result in the thread and "
                     f"process that sent it")
        return text

    # -- connecting --------------------------------------------------------------------------------

    def _retrying(self, action: str, call: Callable[[Any], Any]) -> Any:
        """``call(connection)``, connecting first, and again after a lost connection, with the
        retry policy; ResultError once it is spent."""
        retries, interval = 0, float(self._retry_policy["interval_start"])
        while True:
            connection = self._connection
            if connection is None:
                connection = self._connection = self._connect()
            # OperationalError: kombu's name for a connection it could not make within its timeout
            errors = (*connection.connection_errors, *connection.channel_errors, OperationalError)
            try:
                return call(connection)
            except errors as exc:
                self.close()
                if retries >= self._retry_policy["max_retries"]:
                    raise ResultError(f"cannot {action} reply queue {self.oid} on the broker {self._broker}: "
                                      f"{type(exc).__name__}: {exc}") from exc
                retries += 1
                logger.warning("cannot %s reply queue %s on the broker %s (%s: %s); retry %d/%d in %.1fs",
                               action, self.oid, self._broker, type(exc).__name__, exc, retries,
                               self._retry_policy["max_retries"], interval)
                time.sleep(interval)
                interval = min(interval + float(self._retry_policy["interval_step"]),
                               float(self._retry_policy["interval_max"]))


def _release(connection: Any) -> None:
    try:
        connection.release()
    except Exception:  # closing a broken connection: nothing more to do with it
        pass
