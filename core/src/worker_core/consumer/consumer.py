"""The consumer: runs the consumer blueprint (connection, task queues, remote control, events,
the event loop) inside the worker's Consumer step, and starts it again after a lost connection.

Its jobs live in collaborators the steps drive: :class:`~.connection.BrokerConnection`,
:class:`~.tasks.TaskConsumer` (queues and prefetch), :class:`~.reservations.Reservations`
(what the worker holds and how it goes to the pool) and :class:`~.inbox.Inbox` (work handed to
the loop's thread). Each is given what it uses, never the consumer: the consumer builds them and
is where they meet. The consumer is also the event loop's :class:`~worker_core.slots.LoopContext`,
and what a :class:`~worker_core.request.Request` is received by (its ``RequestHost``).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from ..bootsteps import Blueprint
from ..exceptions import ConnectionLostError
from ..health.state import BROKER_BLOCKED, BROKER_DISCONNECTED
from ..options import scheme_of
from ..redaction import redact_value
from .brokerstate import START, BrokerState, backoff_delay
from .clock import CHECK_INTERVAL, Clock
from .connection import BrokerConnection
from .handler import accepted, make_handler, request_class
from .inbox import Inbox
from .leases import LeaseCheck
from .poison import PoisonCap
from .refusal import Refuser
from .reservations import Reservations
from .tasks import TaskConsumer

if TYPE_CHECKING:
    from kombu.connection import Connection
    from kombu.message import Message

    from ..protocol import TaskEnvelope
    from ..request import Request
    from ..slots import Transport
    from ..worker.worker import Worker
    from .fence import LeaseFence

__all__ = ["Consumer"]

logger = logging.getLogger("worker.consumer")


class Consumer:
    """Runs the consumer blueprint, restarting it after every lost broker connection."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.app = worker.app
        self.options = worker.options
        self.hostname = worker.hostname
        self.timer = worker.timer
        self.hub = worker.hub
        self.blueprint: Blueprint[Consumer] = Blueprint(worker.plan.graph("consumer"))
        self.log_info = logger.isEnabledFor(logging.INFO) or logging.getLogger("worker.request").isEnabledFor(
            logging.INFO
        )
        #: observer hooks (:mod:`worker_core.hookspecs`): called if anyone implements them
        self.notify = worker.notify
        self.inbox = Inbox()
        app, plugins, settings = self.app, worker.plugins, self.app.settings
        #: whether the broker refuses work now (full, read-only, busy, blocking the connection)
        self.broker_state = BrokerState(notify=self._notify_from_any_thread)
        #: the clock tasks are held by (the broker's when the transport tells it)
        self.clock = Clock(plugins)
        self.broker = BrokerConnection(
            plugins, settings, self.options, stopping=lambda: worker.stopping, health=worker.health,
            inbox=self.inbox, clock=self.clock, broker_state=self.broker_state,
            on_disconnect=lambda: self.tasks.forget(),
            forget_unstarted=lambda: self.reservations.forget_unstarted())
        self.poison = PoisonCap(app, plugins, self.broker,
                                done=lambda request: self.reservations.task_done(request, started=False))
        self.leases = LeaseCheck(self.broker, plugins, settings)
        self.tasks = TaskConsumer(app, self.options, queues=worker.queues,
                                  before_consuming=worker.before_consuming, timer=self.timer,
                                  hostname=self.hostname, broker=self.broker, poison=self.poison)
        #: what refuses a message the worker cannot honour
        self.refuser = Refuser(app, self.notify, self.tasks.dead_letter)
        self.reservations = Reservations(
            app, self.options, pool=lambda: worker.pool, timer=self.timer, clock=self.clock,
            broker=self.broker, tasks=self.tasks, leases=self.leases, poison=self.poison,
            revoked=worker.revoked, revoked_stamps=worker.revoked_stamps,
            on_task_message=worker.on_task_message, notify=self.notify, log_info=self.log_info,
            make_request=self.make_request, accept=accepted(app))
        self.clock.on_jump.append(self.reservations.eta_held.rearm)
        self._request_class = request_class(app)
        #: the ``on_message`` callback of the task consumer
        self.on_message = make_handler(app, make_request=self.make_request, tasks=self.tasks,
                                       reservations=self.reservations, poison=self.poison,
                                       refuser=self.refuser)
        self.restart_count = 0
        self._ready_once = False
        self.health = worker.health
        #: starts in a row that the broker refused (the delay before the next one grows)
        self._refused_starts = 0
        self._ticking: Any = None

    @property
    def connection(self) -> Connection | None:
        return self.broker.connection

    @property
    def fence(self) -> LeaseFence:
        """The leases of what the worker holds (the reservations keep them)."""
        return self.reservations.fence

    def make_request(self, message: Message, envelope: TaskEnvelope, task: Any) -> Request:
        """The request of a message received here (of the app loader's class, for its app)."""
        request: Request = self._request_class(self, message, envelope, task,
                                               reservations=self.reservations)
        return request

    @property
    def transport(self) -> Transport:
        return self.broker.transport

    @property
    def result_reprs(self) -> bool:
        """Whether the pool reports a successful task's return value (its repr): for the log at
        INFO, and for whoever observes ``task_succeeded`` (task events)."""
        return self.log_info or self.worker.implements("task_succeeded")

    # -- lifecycle: run the blueprint, restart it after a lost connection -----------------------

    def start(self) -> None:
        self.inbox.bind_to_current_thread()
        self.health.consumer_started()
        if self._ticking is None and self.timer is not None:
            self._ticking = self.timer.call_repeatedly(CHECK_INTERVAL, self._tick)
            self.fence.gate(self.worker.pool)
        while True:
            try:
                self.blueprint.start(self)
                if self.broker.switch_to is not None:
                    self._switch_broker()
                    continue
                return
            except Exception as exc:
                refusal = self.broker.refusal(exc)
                lost = refusal is not None or self.broker.is_connection_error(exc)
                if self.worker.stopping and (lost or isinstance(exc, ConnectionLostError)):
                    return
                if refusal is not None:
                    self._after_refused_start(refusal)
                    continue
                if not lost:
                    raise
                logger.warning(
                    "consumer: Connection to broker lost. Trying to re-establish the connection... (%s: %s)",
                    type(exc).__name__, exc,
                )
                self.restart_count += 1
                self.health.hold(BROKER_DISCONNECTED)
                self._after_connection_lost()

    def _after_refused_start(self, refusal: str) -> None:
        """The broker refused what starting needs (declaring the queues, say): a state, not a lost
        connection. Said once, then started again after a bounded, jittered delay."""
        self.broker_state.refused_by(START, refusal)
        self.restart_count += 1
        self._after_connection_lost()
        delay = backoff_delay(self._refused_starts)
        self._refused_starts += 1
        deadline = time.monotonic() + delay
        while time.monotonic() < deadline and not self.worker.stopping:
            self.inbox.run_pending()
            time.sleep(min(0.1, max(deadline - time.monotonic(), 0.0)))

    def _tick(self) -> None:
        """Every second: a jump of the wall clock, and leases lost meanwhile."""
        try:
            self.clock.check(self.broker.connection, self.broker.current, len(self.reservations.eta_held))
            self.fence.check()
        except Exception:
            logger.exception("Internal error while checking the clock and the leases")

    def _notify_from_any_thread(self, hook: str, **kwargs: Any) -> None:
        """The broker refuses work, or takes it again: readiness says so at once (from any
        thread), and the hook is called in the loop's thread."""
        if hook == "broker_refused":
            self.health.hold(BROKER_BLOCKED)
        else:
            self.health.release(BROKER_BLOCKED)
        self.inbox.call(lambda: self.notify(hook, worker=self.worker, **kwargs))

    def stop(self, *, terminate: bool) -> None:
        # Messages delivered while the consumer is cancelled wait, unacknowledged, for the close
        # that gives them back: none goes to a pool that is about to stop.
        self.reservations.draining = True
        (self.blueprint.terminate if terminate else self.blueprint.stop)(self)
        self.inbox.close()

    def _after_connection_lost(self) -> None:
        """Forget what the lost connection's acknowledgements cannot reach, then Celery's prefetch
        reduction: do not over-fetch while tasks are still running."""
        broker, reservations, settings = self.broker, self.reservations, self.app.settings
        broker.received_from = broker.current
        if not broker.acks_survive_reconnect():
            dropped = reservations.forget_unstarted()
            if dropped:
                logger.warning("Dropped %d task(s) received but not started before the connection was "
                               "lost: the broker delivers them again", dropped)
            if settings.worker_cancel_long_running_tasks_on_connection_loss:
                for request in [r for r in reservations.active if r.acks_late and not r.acknowledged]:
                    try:
                        request.cancel_after_connection_loss(self.worker.pool)
                    except Exception:
                        logger.exception("Failed to cancel %s after the connection loss", request.label)
        elif settings.worker_cancel_long_running_tasks_on_connection_loss and reservations.active:
            logger.info("Running tasks go on: %s acknowledges them on the next connection "
                        "(worker_cancel_long_running_tasks_on_connection_loss has nothing to cancel)",
                        scheme_of(broker.current or ""))
        running = len(reservations.active)
        if running and settings.worker_enable_prefetch_count_reduction:
            self.tasks.reduce_after_connection_loss(running)

    def _switch_broker(self) -> None:
        """Leave the current broker once the running tasks are acknowledged there."""
        self.blueprint.stop(self)
        self.reservations.draining = False
        self.restart_count += 1
        self.broker.switch()

    def _begin_drain(self) -> None:
        """Stop consuming, then give back at once every message not started, while the running
        tasks finish: no new delivery can take the place of one given back."""
        self.reservations.draining = True
        self.tasks.stop()
        held = self.reservations.forget_unstarted(give_back=not self.broker.lost)
        why = "Warm shutdown" if self.worker.stopping else "Switching brokers"
        logger.info("%s: waiting for %d running task(s); %d not started went back to the broker",
                    why, self.reservations.inflight, held)

    # -- what the event loop asks (LoopContext) ---------------------------------------------------

    def on_ready(self) -> None:
        self.health.release(BROKER_DISCONNECTED)
        if self._refused_starts:
            self._refused_starts = 0
            self.broker_state.accepted_by(START)
        if not self._ready_once:
            self._ready_once = True
            self.worker.on_ready()

    def should_run(self) -> bool:
        if self.worker.terminating or self.broker.connection is None:
            return False
        if self.worker.stopping or self.broker.switch_to is not None:
            if not self.reservations.draining:
                self._begin_drain()
            return self.reservations.inflight > 0
        return True

    def heartbeat_rate(self) -> float:
        return float(self.app.settings.broker_heartbeat_checkrate)

    def drain_timeout(self, default: float) -> float:
        """How long a blocking drain may wait: short while pool threads may queue callbacks."""
        if self.inbox.pending:
            return 0.0
        return 0.01 if self.reservations.inflight else default

    def perform_pending_operations(self) -> None:
        self.health.beat()  # every turn of the loop: the liveness probe's evidence
        self.inbox.run_pending()

    def update_qos(self) -> None:
        self.tasks.update_qos()

    def info(self) -> dict[str, Any]:
        return {**self.tasks.info(), **self.reservations.info(), "broker": self._broker_info(),
                "broker_state": self.broker_state.info(), "wall_clock": self.clock.info(),
                "leases": self.fence.info()}

    def _broker_info(self) -> dict[str, Any] | None:
        """The connection as Celery's ``stats`` gives it (kombu's ``Connection.info()``, which
        monitors such as Flower read as a mapping) and ``uri``, the URL in use, without its
        password and with every other secret hidden."""
        current, connection = self.broker.current, self.broker.connection
        if current is None:
            return None
        info: dict[str, Any] = {}
        if connection is not None:
            try:
                info = dict(connection.info())
            except Exception:  # a transport that cannot describe itself: the URL alone
                info = {}
        info.pop("password", None)
        info["uri"] = current
        shown: dict[str, Any] = redact_value("broker", info)  # URLs and secret-named values hidden
        return shown
