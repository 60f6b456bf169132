"""The consumer blueprint's steps: Connection, Failback, Tasks, Control and the event loop (last).

The consumer blueprint is stopped and started again after every lost broker connection; the
worker blueprint around it is not. The events plugin adds Events and Heart.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..bootsteps import Condition, Step
from ..control.node import RETRY_SECONDS, start_node
from ..redaction import redact_url

if TYPE_CHECKING:
    from ..control.node import ControlNode
    from ..options import WorkerOptions
    from .consumer import Consumer

logger = logging.getLogger("worker.control")

__all__ = ["CONSUMER_STEPS", "ConnectionStep", "ControlStep", "FailbackStep", "LoopStep", "TasksStep"]


class ConnectionStep(Step["Consumer"]):
    """Connects to the broker, retrying and failing over as configured."""

    name = "Connection"
    slot = "transport"

    def describe(self, options: WorkerOptions) -> str:
        return "broker " + " ; ".join(redact_url(url) for url in options.brokers)

    def start(self, consumer: Consumer) -> None:
        consumer.broker.connect()

    def stop(self, consumer: Consumer) -> None:
        consumer.broker.disconnect()


class FailbackStep(Step["Consumer"]):
    """With several brokers, moves back to the preferred one (failover ``priority``: the first)
    as soon as it answers again, once the running tasks are done where they came from."""

    name = "Failback"
    requires = ("Connection",)
    condition = Condition("several broker URLs are given", lambda options: len(options.brokers) > 1)

    def __init__(self) -> None:
        super().__init__()
        self._entry: Any = None

    def describe(self, options: WorkerOptions) -> str:
        return f"checks every broker_failback_interval whether the {options.failover} strategy prefers " \
               f"another broker"

    def start(self, consumer: Consumer) -> None:
        if self._entry is None and consumer.timer is not None:
            interval = consumer.app.settings.broker_failback_interval
            self._entry = consumer.timer.call_repeatedly(interval, consumer.broker.check_preferred_broker)

    def stop(self, consumer: Consumer) -> None:
        if self._entry is not None:
            self._entry.cancel()
            self._entry = None


class TasksStep(Step["Consumer"]):
    """Consumes the task queues with the prefetch limit (QoS)."""

    name = "Tasks"
    requires = ("Connection",)
    after = ("Events", "Heart")  # monitors hear of the worker before its first task

    def describe(self, options: WorkerOptions) -> str:
        return "consume " + ", ".join(options.queues)

    def start(self, consumer: Consumer) -> None:
        consumer.tasks.start(consumer.on_message, consumer.refuser.refuse_undecodable)

    def stop(self, consumer: Consumer) -> None:
        consumer.tasks.stop()


class ControlStep(Step["Consumer"]):
    """Answers remote-control commands (``workerctl inspect``/``control``, ``celery inspect``)."""

    name = "Control"
    # After Tasks: on RabbitMQ declaring the control queue takes round trips, and tasks already
    # waiting start meanwhile (the allow-list was checked before the worker started).
    requires = ("Tasks",)
    condition = Condition("worker_enable_remote_control is on", lambda options: options.remote_control)
    label = "remote control: ping, stats, active, autoscale, pool_grow, shutdown, ..."

    def __init__(self) -> None:
        super().__init__()
        self.node: ControlNode | None = None
        self._retry: Any = None

    def start(self, consumer: Consumer) -> None:
        connection = consumer.broker.connection
        assert connection is not None
        self.node = start_node(consumer.worker, connection, announce=not consumer.restart_count)
        if self.node is None and consumer.timer is not None:
            # another connection holds the queue: take it once that connection is gone
            self._retry = consumer.timer.call_repeatedly(
                RETRY_SECONDS, lambda: consumer.inbox.call(self._try_again, consumer))

    def _try_again(self, consumer: Consumer) -> None:
        connection = consumer.broker.connection
        if self.node is not None or connection is None or consumer.broker.lost:
            return
        self.node = start_node(consumer.worker, connection, announce=False, quiet=True)
        if self.node is not None:
            self._cancel_retry()
            logger.info("Remote control is on: this worker's queue %s.celery.pidbox is free again",
                        consumer.worker.hostname)

    def _cancel_retry(self) -> None:
        retry, self._retry = self._retry, None
        if retry is not None:
            retry.cancel()

    def stop(self, consumer: Consumer) -> None:
        self._cancel_retry()
        node, self.node = self.node, None
        if node is not None and not consumer.broker.lost:
            node.close()


class LoopStep(Step["Consumer"]):
    """Runs the event loop until the worker stops or the connection is lost."""

    name = "Loop"
    last = True
    slot = "loop"

    def describe(self, options: WorkerOptions) -> str:
        return f"{options.loop} event loop"

    def start(self, consumer: Consumer) -> None:
        worker = consumer.worker
        loop = worker.plugins.slot("loop", consumer.options.loop)()
        hub = consumer.hub
        if hub is not None:
            if consumer.restart_count:
                # The lost connection's descriptors and tick callbacks must not linger in the
                # poller; everything that lives on the hub registers again.
                hub.reset()
                hub.on_tick.clear()
                if worker.pool is not None:
                    worker.pool.register_with_event_loop(hub)
            consumer.inbox.install(hub)
        try:
            loop.run(consumer)
        except Exception as exc:
            if consumer.broker.is_connection_error(exc):
                consumer.broker.lost = True
            raise


def CONSUMER_STEPS() -> list[Step[Consumer]]:
    return [ConnectionStep(), FailbackStep(), TasksStep(), ControlStep(), LoopStep()]
