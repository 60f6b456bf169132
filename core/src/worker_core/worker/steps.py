"""The worker blueprint's steps: Timer, Hub, Pool, Autoscaler and Consumer (last)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..bootsteps import Condition, Step

if TYPE_CHECKING:
    from ..options import WorkerOptions
    from .worker import Worker

__all__ = ["TimerStep", "HubStep", "PoolStep", "AutoscalerStep", "ConsumerStep", "WORKER_STEPS"]


class TimerStep(Step["Worker"]):
    """Schedules ETA tasks, retries and periodic checks."""

    name = "Timer"
    label = "ETA, countdown and periodic checks"

    def start(self, worker: Worker) -> None:
        worker.start_timer()

    def stop(self, worker: Worker) -> None:
        worker.stop_timer()


class HubStep(Step["Worker"]):
    """The event loop's hub (kombu's), shared by the pool, the consumer and the timer."""

    name = "Hub"
    requires = ("Timer",)
    condition = Condition("the async event loop is used", lambda options: options.loop == "async")
    label = "kombu hub: one poller for broker, pool and timer"

    def start(self, worker: Worker) -> None:
        worker.start_hub()

    def stop(self, worker: Worker) -> None:
        worker.stop_hub()


class PoolStep(Step["Worker"]):
    """The execution pool chosen with ``-P``."""

    name = "Pool"
    requires = ("Timer",)
    after = ("Hub",)
    slot = "pool"

    def describe(self, options: WorkerOptions) -> str:
        if options.autoscale:
            size = f"autoscale {options.autoscale.min}..{options.autoscale.max}"
        else:
            size = f"concurrency {options.concurrency}"
        return f"{options.pool} pool, {size}, {options.scheduling} scheduling"

    def start(self, worker: Worker) -> None:
        worker.start_pool()

    def stop(self, worker: Worker) -> None:
        worker.stop_pool(terminate=False)

    def terminate(self, worker: Worker) -> None:
        worker.stop_pool(terminate=True)


class AutoscalerStep(Step["Worker"]):
    """Grows and shrinks the pool between ``--autoscale MAX,MIN`` with demand."""

    name = "Autoscaler"
    requires = ("Pool",)
    slot = "autoscaler"
    condition = Condition("--autoscale is given", lambda options: options.autoscale is not None)

    def describe(self, options: WorkerOptions) -> str:
        bounds = f"{options.autoscale.min}..{options.autoscale.max}" if options.autoscale else ""
        return f"{options.autoscaler} autoscaler, {bounds} processes"

    def start(self, worker: Worker) -> None:
        worker.start_autoscaler()

    def stop(self, worker: Worker) -> None:
        worker.stop_autoscaler()


class ConsumerStep(Step["Worker"]):
    """Takes messages from the broker and feeds the pool; runs the consumer blueprint."""

    name = "Consumer"
    last = True

    def describe(self, options: WorkerOptions) -> str:
        prefetch = (options.max_concurrency or 1) * options.prefetch_multiplier
        return f"queues {', '.join(options.queues)}; prefetch {prefetch}"

    def start(self, worker: Worker) -> None:
        worker.start_consumer()

    def stop(self, worker: Worker) -> None:
        worker.stop_consumer(terminate=False)

    def terminate(self, worker: Worker) -> None:
        worker.stop_consumer(terminate=True)


def WORKER_STEPS() -> list[Step["Worker"]]:
    return [TimerStep(), HubStep(), PoolStep(), AutoscalerStep(), ConsumerStep()]
