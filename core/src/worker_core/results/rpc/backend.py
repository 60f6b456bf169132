"""The ``rpc://`` result backend, Celery's RPC backend on the wire: each state of a task is a
message sent through the broker's default exchange to the queue its task message named in
``reply_to``, and only the client owning that queue reads it. Works over any transport the
worker has (RabbitMQ, Redis, the embedded file)."""

from __future__ import annotations

import logging
import os
import threading
import uuid
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from ...app.broker import broker_urls, connect
from ...app.context import current_context
from ...exceptions import ConfigurationError, ResultError
from ...plugins.manager import PluginManager
from ...redaction import redact_url
from ..codec import ResultCodec
from ..meta import make_meta
from .publisher import Publisher
from .replies import Replies

if TYPE_CHECKING:
    from kombu.connection import Connection
    from kombu.entity import Queue

    from ...app.settings import Settings
    from ...plugins.manager import PluginManager
    from ...slots import RepliesToSender, ResultBackend, SuccessIsFinal

__all__ = ["RETRY_POLICY", "RPCBackend", "reply_queue"]

logger = logging.getLogger(__name__)

#: Celery's RPC backend's retry policy: for each result published, and here for reading too.
RETRY_POLICY: Mapping[str, float] = {"max_retries": 20, "interval_start": 0, "interval_step": 1,
                                     "interval_max": 1}


def reply_queue(oid: str, expires: float | None) -> Queue:
    """The reply queue named ``oid`` exactly as Celery's client declares it: durable,
    ``auto_delete``, reached through the default exchange by its name, and with ``expires``
    (``result_expires``) as RabbitMQ's ``x-expires``."""
    import kombu

    return kombu.Queue(oid, kombu.Exchange(""), oid, durable=True,  # type: ignore[attr-defined,no-untyped-call]
                       auto_delete=True, expires=expires)


class RPCBackend:
    """States sent to each task's client as messages (``rpc://``, or ``rpc``), as Celery's RPC
    backend sends them: the meta as the body in ``result_serializer``, the message's
    ``correlation_id`` that of the task's (its id), transient unless ``result_persistent``.

    Worker side: publishes from the process and thread that store (a prefork child, a pool
    thread, the main process), each on a producer and connection of its own reused for the next
    result. Client side: each thread reads its own reply queue (:meth:`reply_to`) on a
    connection of its own. A forked child opens its own connections and gets its own queue.
    """

    #: A client never replaces a SUCCESS it received with a later state of the same task.
    success_is_final: ClassVar[bool] = True

    def __init__(self, url: str, settings: Settings) -> None:
        scheme, _, rest = url.partition("://")
        if scheme.lower() != "rpc" or rest.strip("/"):
            raise ConfigurationError(
                f"result backend URL {redact_url(url)!r} is not 'rpc://': the rpc result backend takes "
                f"nothing after its scheme, since results travel through the broker (broker_url)")
        self.url = url
        self.settings = settings
        self.broker_urls = broker_urls(settings)
        self.codec = ResultCodec.from_settings(settings)
        self.extended = settings.result_extended
        self.delivery_mode = 2 if settings.result_persistent else 1
        # no expiry when result_expires is unset or 0, as for the stored results
        self.expires = settings.result_expires or None
        self._local = threading.local()
        self._lock = threading.Lock()
        self._publisher: Publisher | None = None
        self._clients: weakref.WeakSet[Replies] = weakref.WeakSet()
        self._plugins: PluginManager | None = None
        self._warned_pid = 0

    def __repr__(self) -> str:
        return "<RPCBackend rpc://>"

    @property
    def broker(self) -> str:
        """The broker results travel through, for messages (passwords hidden)."""
        return " ; ".join(redact_url(url) for url in self.broker_urls)

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
        """Publish the task's meta to the queue its message named in ``reply_to``; without one,
        nothing is sent (no client asked for it), as in Celery."""
        reply_to = request.get("reply_to") if request else None
        if not reply_to or request is None:
            self._nowhere_to_send(task_id, state)
            return
        meta = make_meta(task_id, state, result, traceback, request, extended=self.extended)
        try:
            body, content_type, encoding = self.codec.encode_message(meta, serializer)
        except Exception as exc:
            raise ResultError(f"cannot encode the result of task {task_id} as "
                              f"{serializer or self.codec.serializer}: {type(exc).__name__}: {exc}") from exc
        correlation_id = request.get("correlation_id") or task_id
        try:
            self._current_publisher().publish(body, reply_to, correlation_id, content_type, encoding,
                                              self.delivery_mode)
        except Exception as exc:
            raise ResultError(f"cannot send the {state} of task {task_id} to reply queue {reply_to} on the "
                              f"broker {self.broker}: {type(exc).__name__}: {exc}") from exc

    # -- client side -------------------------------------------------------------------------------

    def reply_to(self) -> str:
        return self._client().oid

    def on_task_call(self, task_id: str) -> None:
        """Declare this thread's reply queue before the task is sent; not for a task sent by a
        task a worker runs, as Celery's prefork children do not: a retry names its client's
        queue, and nobody reads the worker's own (declaring it would keep a queue per process
        and thread filling on RabbitMQ for ``result_expires``)."""
        context = current_context()
        if context.id is not None and not context.called_directly:
            return
        self._client().declare()

    def get_task_meta(self, task_id: str) -> Mapping[str, Any]:
        return self._client().meta(task_id)

    def wait_for(
        self, task_id: str, timeout: float | None = None, interval: float = 0.5
    ) -> Mapping[str, Any]:
        """Wait for the task's state on this thread's reply queue (``interval`` is not used:
        nothing is polled)."""
        return self._client().wait(task_id, timeout)

    def forget(self, task_id: str) -> None:
        """Drop what this client received for the task: nothing is kept anywhere else (as in
        Celery)."""
        client: Replies | None = getattr(self._local, "client", None)
        if client is not None and client.pid == os.getpid():
            client.forget(task_id)

    def close(self) -> None:
        """Close this process's connections: every thread's reply queue connection (what
        arrived stays, and each reconnects when used again) and the result producers."""
        pid = os.getpid()
        with self._lock:
            publisher, self._publisher = self._publisher, None
            clients = [client for client in self._clients if client.pid == pid]
        if publisher is not None:
            publisher.close()
        for client in clients:
            client.close()

    # -- internals -------------------------------------------------------------------------------

    def _connect(self) -> Connection:
        """A new connection to the broker through its transport plugin. Without heartbeats: a
        client may wait long between two reads, and RabbitMQ would close its connection, and so
        delete its reply queue, if it missed them."""
        plugins = self._plugins
        if plugins is None:
            plugins = self._plugins = PluginManager(autoload=False)
        return connect(plugins, self.broker_urls, self.settings, heartbeat=0)

    def _client(self) -> Replies:
        client: Replies | None = getattr(self._local, "client", None)
        if client is None or client.pid != os.getpid():  # a forked child is another client
            refresh = self.expires / 2 if self.expires else None
            oid = str(uuid.uuid4())
            client = Replies(oid, self._connect, reply_queue(oid, self.expires), self.codec, self.broker,
                             refresh, RETRY_POLICY)
            self._local.client = client
            with self._lock:
                self._clients.add(client)
        return client

    def _current_publisher(self) -> Publisher:
        publisher = self._publisher
        if publisher is None or publisher.pid != os.getpid():
            with self._lock:
                publisher = self._publisher
                if publisher is None or publisher.pid != os.getpid():
                    # after a fork the parent's connections stay the parent's: this process opens its own
                    publisher = self._publisher = Publisher(self._connect, RETRY_POLICY)
        return publisher

    def _nowhere_to_send(self, task_id: str, state: str) -> None:
        """Log, once per process at warning level, that a state has no client to go to."""
        pid = os.getpid()
        if self._warned_pid == pid:
            logger.debug("the %s of task %s is not sent: its message has no reply_to", state, task_id)
            return
        self._warned_pid = pid
        logger.warning(
            "the %s of task %s is not sent: its message has no reply_to, and the rpc result backend sends "
            "each state to the client named there (Celery's clients always name themselves, this "
            "project's client does with result_backend='rpc://'); states of other such tasks are not sent "
            "either (logged at debug level)", state, task_id)


if TYPE_CHECKING:
    # mypy proves the class satisfies its slot's Protocol and the capabilities it offers.
    _BACKEND: type[ResultBackend] = RPCBackend
    _FINAL: type[SuccessIsFinal] = RPCBackend
    _REPLIES: type[RepliesToSender] = RPCBackend
