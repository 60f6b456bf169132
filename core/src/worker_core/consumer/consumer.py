"""The consumer: takes messages from the broker, keeps the prefetch window, dispatches requests
to the pool when it has room, and survives lost connections by restarting its blueprint."""

from __future__ import annotations

import collections
import itertools
import logging
import math
import os
import threading
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

import kombu
from kombu.common import QoS

from ..app.broker import task_queue
from ..bootsteps import Blueprint
from ..exceptions import ConnectionLostError
from ..options import scheme_of
from ..protocol import utcnow
from ..redaction import redact_url
from .connect import Connector
from .handler import make_handler
from .ratelimit import RateLimits
from .refusal import describe_message, refuse_undecodable

if TYPE_CHECKING:
    from kombu.connection import Connection
    from kombu.message import Message
    from kombu.messaging import Consumer as TaskConsumer

    from ..request import Request
    from ..worker.worker import Worker

__all__ = ["Consumer"]

logger = logging.getLogger("worker.consumer")


class Consumer:
    """Runs the consumer blueprint (Connection, Tasks, Loop) inside the worker's Consumer step.

    It is also the event loop's :class:`~worker_core.slots.LoopContext`.
    """

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.app = worker.app
        self.options = worker.options
        self.hostname = worker.hostname
        self.timer = worker.timer
        self.hub = worker.hub
        self.blueprint: Blueprint[Consumer] = Blueprint(worker.plan.graph("consumer"))
        settings = self.app.settings
        self.multiplier = self.options.prefetch_multiplier
        self.max_prefetch = (self.options.max_concurrency or 1) * self.multiplier
        self.connector = Connector(
            worker.plugins, settings, self.options.brokers, self.options.failover,
            should_continue=lambda: not worker.stopping,
            connection_options=self._heartbeat_options(),
        )
        self.connection: Connection | None = None
        self.task_consumer: TaskConsumer | None = None
        self.qos: QoS | None = None
        self.control: Any = None
        #: the event dispatcher (the events plugin's Events step), None without one
        self.events: Any = None
        self.fcfs = self.options.scheduling == "fcfs"
        self.log_info = logger.isEnabledFor(logging.INFO) or logging.getLogger("worker.request").isEnabledFor(
            logging.INFO
        )
        #: whether the pool reports a successful task's return value (its repr)
        self.result_reprs = self.log_info
        # requests: ready to dispatch, waiting for their ETA, running or queued in the pool
        self.ready: collections.deque[Request] = collections.deque()
        #: the broker the requests kept across a lost connection came from
        self._received_from: str | None = None
        self.eta_held: set[Request] = set()
        self.reserved: set[Request] = set()
        self.active: set[Request] = set()
        self.inflight = 0
        self.totals: collections.Counter[str] = collections.Counter()
        self.restart_count = 0
        self.reduced_prefetch = False
        self._initial_prefetch: int | None = None
        self._switch_to: str | None = None
        self._connection_errors: tuple[type[BaseException], ...] = ()
        #: the broker went away: stopping must not wait for it
        self.connection_lost = False
        self._failback_timer: Any = None
        self._dispatching = False
        self._draining = False
        self._ready_once = False
        self._loop_ident = threading.get_ident()
        self._pending: collections.deque[tuple[Callable[..., Any], tuple[Any, ...]]] = collections.deque()
        self._waker: tuple[int, int] | None = None
        self._wake_sent = False
        self._handler = make_handler(self)
        self.revoked = worker.revoked
        self.rate_limits = RateLimits(self.timer, self._reserve_now)
        self.rate_limits_enabled = not settings.worker_disable_rate_limits
        if not worker.observes_tasks:
            self.notify = self._notify_nobody  # type: ignore[method-assign]

    def _heartbeat_options(self) -> dict[str, Any]:
        return {"heartbeat": self.app.settings.broker_heartbeat} if self.app.settings.broker_heartbeat else {}

    # -- shutdown flags ----------------------------------------------------------------------------

    @property
    def terminating(self) -> bool:
        return self.worker.terminating

    # -- lifecycle: run the blueprint, restart it after a lost connection ---------------------------

    def start(self) -> None:
        self._loop_ident = threading.get_ident()
        while True:
            try:
                self.blueprint.start(self)
                if self._switch_to is not None:
                    self._switch_broker()
                    continue
                return
            except Exception as exc:
                if self.worker.stopping and (
                    self._is_connection_error(exc) or isinstance(exc, ConnectionLostError)
                ):
                    return
                if not self._is_connection_error(exc):
                    raise
                logger.warning(
                    "consumer: Connection to broker lost. Trying to re-establish the connection... (%s: %s)",
                    type(exc).__name__, exc,
                )
                self.restart_count += 1
                self._after_connection_lost()

    def stop(self, *, terminate: bool) -> None:
        (self.blueprint.terminate if terminate else self.blueprint.stop)(self)
        self._close_waker()

    def _is_connection_error(self, exc: BaseException) -> bool:
        # The connection is already released when a failed start unwinds, so its error classes
        # are remembered from when it was opened.
        return isinstance(exc, (OSError, *self._connection_errors))

    def _after_connection_lost(self) -> None:
        """Forget what the lost connection's acknowledgements cannot reach, then Celery's prefetch
        reduction: do not over-fetch while tasks are still running."""
        self._received_from = self.connector.current
        if not self._acks_survive_reconnect():
            dropped = self._forget_unstarted()
            if dropped:
                logger.warning("Dropped %d task(s) received but not started before the connection was "
                               "lost: the broker delivers them again", dropped)
            if self.app.settings.worker_cancel_long_running_tasks_on_connection_loss:
                for request in [r for r in self.active if r.acks_late and not r.acknowledged]:
                    try:
                        request.cancel_after_connection_loss(self.worker.pool)
                    except Exception:
                        logger.exception("Failed to cancel %s after the connection loss", request.label)
        elif self.app.settings.worker_cancel_long_running_tasks_on_connection_loss and self.active:
            logger.info("Running tasks go on: %s acknowledges them on the next connection "
                        "(worker_cancel_long_running_tasks_on_connection_loss has nothing to cancel)",
                        scheme_of(self.connector.current or ""))
        running = len(self.active)
        if running and self.app.settings.worker_enable_prefetch_count_reduction:
            reduced = max(self.multiplier, self.max_prefetch - running * self.multiplier)
            if reduced < self.max_prefetch:
                self.reduced_prefetch = True
                self._initial_prefetch = reduced
                logger.info(
                    "Temporarily reducing the prefetch count to %d to avoid over-fetching since %d tasks "
                    "are currently being processed.\nThe prefetch count will be gradually restored to %d "
                    "as the tasks complete processing.", reduced, running, self.max_prefetch,
                )

    # -- Connection step -------------------------------------------------------------------------

    def _acks_survive_reconnect(self) -> bool:
        # AMQP delivery tags belong to the channel they came on: after a reconnect the broker
        # delivers those messages again, and running the old copies would run them twice.
        url = self.connector.current
        if url is None:
            return False
        transport = self.app.plugins.slot("transport", scheme_of(url))
        return bool(getattr(transport, "acks_survive_reconnect", False))

    def connect(self) -> None:
        self.connection_lost = False
        self.connection = self.connector.connect(on_wait=self.perform_pending_operations)
        if self._received_from not in (None, self.connector.current):
            # Requests kept across the lost connection belong to the broker left behind: it
            # gives their messages back; this one cannot acknowledge them.
            dropped = self._forget_unstarted()
            if dropped:
                logger.warning("Dropped %d task(s) received from %s before switching brokers: that "
                               "broker delivers them again", dropped, redact_url(self._received_from))
        self._received_from = None
        self._connection_errors = (
            *self.connection.recoverable_connection_errors, *self.connection.recoverable_channel_errors
        )
        self._watch_preferred_broker()

    def disconnect(self) -> None:
        connection, self.connection = self.connection, None
        self.task_consumer = None
        if connection is None:
            return
        try:
            if self.connection_lost:
                # Closing politely would wait for a broker that is gone (forever, if the network
                # hangs): only drop what is ours. The broker gives unacknowledged messages back.
                connection.collect()
            else:
                connection.release()
        except Exception as exc:
            logger.debug("error while closing the broker connection: %r", exc)

    # -- Tasks step ------------------------------------------------------------------------------

    def start_consuming(self) -> None:
        assert self.connection is not None
        first, self.worker.before_consuming = self.worker.before_consuming, []
        for callback in first:
            callback()
        channel = self.connection.default_channel
        queues = [task_queue(name, self.app.settings) for name in self.worker.queues]
        self.task_consumer = kombu.Consumer(  # type: ignore[attr-defined,no-untyped-call]
            channel, queues=queues, on_message=self._handler, no_ack=False,
            # the transport or kombu could not build the message (a bad envelope or body
            # encoding, a 'compression' header kombu cannot undo): refuse it
            on_decode_error=lambda message, exc: refuse_undecodable(self, message, exc),
        )
        prefetch = self._initial_prefetch or self.max_prefetch
        self._initial_prefetch = None
        self.qos = QoS(self._set_prefetch, prefetch)
        self.qos.update()
        logger.debug("basic.qos: prefetch_count->%d", prefetch)
        self.task_consumer.consume()

    def add_queue(self, queue: Any) -> None:
        """Start consuming ``queue`` (a kombu queue) too (remote ``add_consumer``)."""
        if self.task_consumer is not None and not self.connection_lost:
            self.task_consumer.add_queue(queue)
            self.task_consumer.consume()

    def cancel_queue(self, name: str) -> None:
        """Stop consuming the queue ``name`` (remote ``cancel_consumer``); the messages already
        received from it are still worked on."""
        if self.task_consumer is not None and not self.connection_lost:
            self.task_consumer.cancel_by_queue(name)

    def _set_prefetch(self, prefetch_count: int) -> None:
        if self.task_consumer is not None:
            self.task_consumer.qos(prefetch_count=prefetch_count, apply_global=True)

    def stop_consuming(self) -> None:
        if self.task_consumer is not None and not self.connection_lost:
            try:
                self.task_consumer.cancel()
            except Exception as exc:
                logger.debug("error while cancelling the consumer: %r", exc)

    # -- Control step ----------------------------------------------------------------------------

    def start_control(self) -> None:
        from ..control.node import start_node

        assert self.connection is not None
        self.control = start_node(self.worker, self.connection, announce=not self.restart_count)

    def stop_control(self) -> None:
        control, self.control = self.control, None
        if control is not None and not self.connection_lost:
            control.close()

    # -- Loop step -------------------------------------------------------------------------------

    def run_loop(self) -> None:
        loop = self.worker.plugins.slot("loop", self.options.loop)()
        hub = self.hub
        if hub is not None:
            if self.restart_count:
                # The lost connection's descriptors and tick callbacks must not linger in the
                # poller; everything that lives on the hub registers again.
                hub.reset()
                hub.on_tick.clear()
                if self.worker.pool is not None:
                    self.worker.pool.register_with_event_loop(hub)
            self._install_waker()
        try:
            loop.run(self)
        except Exception as exc:
            if self._is_connection_error(exc):
                self.connection_lost = True
            raise

    def on_ready(self) -> None:
        if not self._ready_once:
            self._ready_once = True
            self.worker.on_ready()

    def should_run(self) -> bool:
        if self.worker.terminating:
            return False
        if self.connection is None:
            return False
        if self.worker.stopping or self._switch_to is not None:
            if not self._draining:
                self._begin_drain()
            return self.inflight > 0
        return True

    # -- moving back to a preferred broker (failover strategy "priority") -----------------------

    def _watch_preferred_broker(self) -> None:
        if len(self.options.brokers) < 2 or self.timer is None:
            return
        if self._failback_timer is None:
            interval = self.app.settings.broker_failback_interval
            self._failback_timer = self.timer.call_repeatedly(
                interval, self._check_preferred_broker
            )

    def _check_preferred_broker(self) -> None:
        current = self.connector.current
        if current is None or self._switch_to is not None or self.worker.stopping:
            return
        preferred = self.connector.strategy.preferred(current)
        if preferred is None or preferred == current:
            return
        if self.connector.answers(preferred):
            logger.warning("consumer: broker %s answers again; moving back to it from %s",
                           redact_url(preferred), redact_url(current))
            self._switch_to = preferred

    def _switch_broker(self) -> None:
        """Leave the current broker once the running tasks are acknowledged there."""
        target, self._switch_to = self._switch_to, None
        self.blueprint.stop(self)
        self._draining = False
        self.restart_count += 1
        self.connector.current = target

    def _begin_drain(self) -> None:
        self._draining = True
        self.stop_consuming()
        held = self._forget_unstarted()
        why = "Warm shutdown" if self.worker.stopping else "Switching brokers"
        logger.info("%s: waiting for %d running task(s); %d not started will go back to the broker",
                    why, self.inflight, held)

    def _forget_unstarted(self) -> int:
        """Drop the requests not started yet (ready, waiting for their ETA, or queued in a pool
        that can give them back): their messages stay unacknowledged and the broker delivers them
        again. Returns how many."""
        held = len(self.ready) + len(self.eta_held)
        for request in self.eta_held:
            if request.timer_entry is not None:
                request.timer_entry.cancel()
                request.timer_entry = None
        for request in [*self.ready, *self.eta_held]:
            self.reserved.discard(request)
        self.ready.clear()
        self.eta_held.clear()
        held += self.rate_limits.forget()
        withdraw = getattr(self.worker.pool, "withdraw_queued", None)
        if withdraw is not None:
            held += withdraw()
        return held

    def heartbeat_rate(self) -> float:
        return float(self.app.settings.broker_heartbeat_checkrate)

    def drain_timeout(self, default: float) -> float:
        """How long a blocking drain may wait: short while pool threads may queue callbacks."""
        if self._pending:
            return 0.0
        return 0.01 if self.inflight else default

    def update_qos(self) -> None:
        qos = self.qos
        if qos is not None and qos.prev != qos.value:
            qos.update()

    # -- work coming back from other threads -------------------------------------------------------

    def in_loop(self, fn: Callable[..., Any], *args: Any) -> None:
        """Call ``fn(*args)`` in the loop's thread (now, if this is that thread)."""
        if threading.get_ident() == self._loop_ident:
            fn(*args)
            return
        self._pending.append((fn, args))
        if self._waker is not None and not self._wake_sent:
            self._wake_sent = True
            try:
                os.write(self._waker[1], b"\0")
            except OSError:
                pass

    def wake(self) -> None:
        """Interrupt a hub loop waiting in poll (safe from a signal handler)."""
        if self._waker is not None:
            try:
                os.write(self._waker[1], b"\0")
            except OSError:
                pass

    def perform_pending_operations(self) -> None:
        pending = self._pending
        while pending:
            fn, args = pending.popleft()
            try:
                fn(*args)
            except Exception:
                logger.exception("error in a callback from the pool")

    def _install_waker(self) -> None:
        if self._waker is None:
            read_fd, write_fd = os.pipe()
            os.set_blocking(read_fd, False)
            os.set_blocking(write_fd, False)
            self._waker = (read_fd, write_fd)
        assert self.hub is not None
        self.hub.add_reader(self._waker[0], self._on_wake)

    def _on_wake(self, *_: Any) -> None:
        assert self._waker is not None
        # Drain before clearing the flag: clearing first lets a wake-up written in between be
        # drained here with the flag left set, and every later wake-up would be skipped.
        try:
            while os.read(self._waker[0], 4096):
                pass
        except BlockingIOError:
            pass
        self._wake_sent = False
        self.perform_pending_operations()

    def _close_waker(self) -> None:
        if self._waker is not None:
            if self.hub is not None:
                try:
                    self.hub.remove(self._waker[0])
                except Exception:
                    pass
            for fd in self._waker:
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._waker = None

    # -- broker operations (loop thread only) --------------------------------------------------

    def ack(self, message: Message) -> None:
        try:
            message.ack()
        except Exception as exc:
            logger.error("Could not acknowledge %s: %r; the broker will deliver it again",
                         describe_message(message), exc)

    def reject(self, message: Message, *, requeue: bool) -> None:
        try:
            message.reject(requeue=requeue)
        except Exception as exc:
            logger.error("Could not reject %s: %r", describe_message(message), exc)

    def republish(self, message: Message, extra_headers: dict[str, Any]) -> bool:
        """Publish a copy of ``message`` (same body, properties and route) with more headers."""
        if self.connection is None:
            return False
        info = message.delivery_info or {}
        properties = message.properties or {}
        headers = dict(message.headers or {})
        headers.update(extra_headers)
        try:
            kombu.Producer(self.connection.default_channel).publish(  # type: ignore[attr-defined,no-untyped-call]
                message.body, exchange=info.get("exchange") or "", routing_key=info.get("routing_key") or "",
                headers=headers, content_type=message.content_type,
                content_encoding=message.content_encoding, delivery_mode=2,
                priority=properties.get("priority"), correlation_id=properties.get("correlation_id"),
                reply_to=properties.get("reply_to") or None, retry=True,
            )
        except Exception as exc:
            logger.error(
                "Could not send %s again: %r; it is requeued instead", describe_message(message), exc
            )
            return False
        return True

    def _restore_prefetch_step(self) -> None:
        if not self.reduced_prefetch or self.qos is None:
            return
        if self.qos.value < self.max_prefetch:
            self.qos.increment_eventually(
                min(self.multiplier, self.max_prefetch - self.qos.value)
            )
        if self.qos.value >= self.max_prefetch:
            self.reduced_prefetch = False
            logger.info(
                "Resuming normal operations following a restart.\nPrefetch count has been restored to "
                "the maximum of %d", self.max_prefetch,
            )

    # -- requests ------------------------------------------------------------------------------

    def notify(self, hook: str, **kwargs: Any) -> None:
        self.worker.notify(hook, **kwargs)

    def _notify_nobody(self, hook: str, **kwargs: Any) -> None:
        """Stands in for :meth:`notify` when no plugin observes tasks."""

    def receive(self, request: Request) -> None:
        if self.log_info:
            logger.info("Task %s received", request.label)
        if request.id in self.revoked:
            request.revoke("revoked")
            return
        self.notify("task_received", request=request)
        envelope = request.envelope
        if envelope.expires is not None or envelope.eta is not None:
            now = utcnow()
            if envelope.expires is not None and envelope.expires <= now:
                request.revoke("expired")
                return
            if envelope.eta is not None and envelope.eta > now:
                self._hold_until_eta(request, (envelope.eta - now).total_seconds())
                return
        self._reserve(request)

    def _hold_until_eta(self, request: Request, delay: float) -> None:
        # The message stays unacknowledged until it runs; widen the window so it does not
        # block other messages meanwhile.
        assert self.qos is not None and self.timer is not None
        self.qos.increment_eventually()
        self.eta_held.add(request)
        request.timer_entry = self.timer.call_after(
            delay, self._eta_due, (request,)
        )

    def _eta_due(self, request: Request) -> None:
        if request not in self.eta_held:
            return
        self.eta_held.discard(request)
        request.timer_entry = None
        if self.qos is not None:
            self.qos.decrement_eventually()
        expires = request.envelope.expires
        if expires is not None and expires <= utcnow():
            request.revoke("expired")
            return
        self._reserve(request)

    def _reserve(self, request: Request) -> None:
        rate = request.task.rate_per_second
        if rate and self.rate_limits_enabled:
            self.rate_limits.hold(request, rate)
            return
        self._reserve_now(request)

    def _reserve_now(self, request: Request) -> None:
        self.reserved.add(request)
        self.ready.append(request)
        for callback in self.worker.on_task_message:
            callback()
        self.dispatch()

    def change_max_prefetch(self, difference: int) -> None:
        """The pool's maximum moved by ``difference``: move the prefetch by that many times the
        multiplier (the autoscaler's ``update``)."""
        delta = difference * self.multiplier
        self.max_prefetch = max(self.multiplier, self.max_prefetch + delta)
        if self.qos is not None:
            if delta > 0:
                self.qos.increment_eventually(delta)
            elif delta < 0:
                self.qos.decrement_eventually(-delta)

    def capacity(self) -> float:
        pool = self.worker.pool
        if self.fcfs or pool is None or getattr(pool, "shared_queue", False):
            return math.inf
        return float(pool.num_processes)

    def dispatch(self) -> None:
        """Hand ready requests to the pool while it has room (only idle executors under fair)."""
        if self._dispatching or self._draining:
            return
        self._dispatching = True
        try:
            pool = self.worker.pool
            ready = self.ready
            while ready and self.inflight < self.capacity():
                request = ready.popleft()
                expires = request.envelope.expires
                if expires is not None and expires <= utcnow():
                    request.revoke("expired")
                    continue
                self.inflight += 1
                try:
                    request.execute_using_pool(pool)
                except Exception as exc:
                    self.inflight -= 1
                    logger.error("Could not hand %s to the pool: %r; it goes back to the broker",
                                 request.label, exc)
                    self.reserved.discard(request)
                    request.reject(requeue=True)
        finally:
            self._dispatching = False

    def requests_by_id(self, task_ids: Collection[str]) -> dict[str, Request]:
        """The requests with these ids this worker holds: waiting (for room, their ETA or their
        rate limit), queued in the pool or running."""
        return {request.id: request
                for request in itertools.chain(self.reserved, self.eta_held, self.rate_limits.waiting())
                if request.id in task_ids}

    def revoke_waiting(self, task_ids: Collection[str]) -> list[Request]:
        """Discard the requests with these ids that have not gone to the pool (waiting for room,
        their ETA or their rate limit): stored REVOKED and acknowledged at once. Returns them."""
        waiting = [request for request in self.ready if request.id in task_ids]
        if waiting:
            kept = [request for request in self.ready if request.id not in task_ids]
            self.ready.clear()
            self.ready.extend(kept)
        held = [request for request in self.eta_held if request.id in task_ids]
        for request in held:
            self.eta_held.discard(request)
            if request.timer_entry is not None:
                request.timer_entry.cancel()
                request.timer_entry = None
            if self.qos is not None:
                self.qos.decrement_eventually()
        held += self.rate_limits.discard(task_ids)
        for request in waiting + held:
            request.revoke("revoked")
        return waiting + held + self._withdraw_from_pool(task_ids)

    def _withdraw_from_pool(self, task_ids: Collection[str]) -> list[Request]:
        """Take the requests with these ids that wait in the pool, not started, back from it (if
        it can give them back): stored REVOKED and acknowledged at once. Returns them."""
        withdraw = getattr(self.worker.pool, "withdraw_job", None)
        if withdraw is None:
            return []
        taken = [request for request in self.reserved
                 if request.id in task_ids and request.pool_job is not None and request.worker_pid is None
                 and not request.finished and withdraw(request.pool_job)]
        for request in taken:
            request.discard("revoked")
            self.task_done(request)  # it left the pool
        return taken

    def task_started(self, request: Request) -> None:
        self.active.add(request)
        self.notify("task_started", request=request, pid=request.worker_pid)

    def task_done(self, request: Request, *, started: bool = True) -> None:
        request.finished = True
        request.pool_job = None  # the pool's job holds the request's callbacks: no cycle is left
        self.reserved.discard(request)
        self.active.discard(request)
        if started:
            self.inflight -= 1
            if self.reduced_prefetch:
                self._restore_prefetch_step()
        self.totals[request.name] += 1
        if not self._dispatching:
            self.dispatch()

    def info(self) -> dict[str, Any]:
        return {
            "prefetch_count": self.qos.value if self.qos is not None else None,
            "total": dict(self.totals),
            "reserved": len(self.reserved),
            "active": len(self.active),
            "waiting": len(self.ready),
            "in_pool": self.inflight,
            "eta_held": len(self.eta_held),
            "broker": redact_url(self.connector.current) if self.connector.current else None,
        }
