"""The consumer blueprint's steps: Connection, Tasks and the event loop (last).

The consumer blueprint is stopped and started again after every lost broker connection; the
worker blueprint around it is not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..bootsteps import Condition, Step
from ..redaction import redact_url

if TYPE_CHECKING:
    from ..options import WorkerOptions
    from .consumer import Consumer

__all__ = ["CONSUMER_STEPS", "ConnectionStep", "ControlStep", "LoopStep", "TasksStep"]


class ConnectionStep(Step["Consumer"]):
    """Connects to the broker, retrying and failing over as configured."""

    name = "Connection"
    slot = "transport"

    def describe(self, options: WorkerOptions) -> str:
        return "broker " + " ; ".join(redact_url(url) for url in options.brokers)

    def start(self, consumer: Consumer) -> None:
        consumer.connect()

    def stop(self, consumer: Consumer) -> None:
        consumer.disconnect()


class TasksStep(Step["Consumer"]):
    """Consumes the task queues with the prefetch limit (QoS)."""

    name = "Tasks"
    requires = ("Connection",)
    after = ("Events", "Heart")  # monitors hear of the worker before its first task

    def describe(self, options: WorkerOptions) -> str:
        return "consume " + ", ".join(options.queues)

    def start(self, consumer: Consumer) -> None:
        consumer.start_consuming()

    def stop(self, consumer: Consumer) -> None:
        consumer.stop_consuming()


class ControlStep(Step["Consumer"]):
    """Answers remote-control commands (``workerctl inspect``/``control``, ``celery inspect``)."""

    name = "Control"
    # After Tasks: on RabbitMQ declaring the control queue takes round trips, and tasks already
    # waiting start meanwhile (the allow-list was checked before the worker started).
    requires = ("Tasks",)
    condition = Condition("worker_enable_remote_control is on", lambda options: options.remote_control)
    label = "remote control: ping, stats, active, autoscale, pool_grow, shutdown, ..."

    def start(self, consumer: Consumer) -> None:
        consumer.start_control()

    def stop(self, consumer: Consumer) -> None:
        consumer.stop_control()


class LoopStep(Step["Consumer"]):
    """Runs the event loop until the worker stops or the connection is lost."""

    name = "Loop"
    last = True
    slot = "loop"

    def describe(self, options: WorkerOptions) -> str:
        return f"{options.loop} event loop"

    def start(self, consumer: Consumer) -> None:
        consumer.run_loop()


def CONSUMER_STEPS() -> list[Step[Consumer]]:
    return [ConnectionStep(), TasksStep(), ControlStep(), LoopStep()]
