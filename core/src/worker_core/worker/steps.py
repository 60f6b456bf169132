"""The worker blueprint's steps: Timer, Hub, Pool, Autoscaler and Consumer (last)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import execution
from ..bootsteps import Condition, Step
from ..consumer.consumer import Consumer
from ..exceptions import PoolError
from ..slots import PoolOptions

if TYPE_CHECKING:
    from ..options import WorkerOptions
    from .worker import Worker

__all__ = ["WORKER_STEPS", "AutoscalerStep", "ConsumerStep", "HubStep", "PoolStep", "TimerStep"]


class TimerStep(Step["Worker"]):
    """Schedules ETA tasks, retries and periodic checks."""

    name = "Timer"
    label = "ETA, countdown and periodic checks"

    def start(self, worker: Worker) -> None:
        from kombu.asynchronous.timer import Timer

        worker.timer = Timer()

    def stop(self, worker: Worker) -> None:
        if worker.timer is not None:
            worker.timer.clear()


class HubStep(Step["Worker"]):
    """The event loop's hub (kombu's), shared by the pool, the consumer and the timer."""

    name = "Hub"
    requires = ("Timer",)
    condition = Condition("the async event loop is used", lambda options: options.loop == "async")
    label = "kombu hub: one poller for broker, pool and timer"

    def start(self, worker: Worker) -> None:
        from kombu.asynchronous import Hub, set_event_loop

        worker.hub = Hub(timer=worker.timer)
        set_event_loop(worker.hub)

    def stop(self, worker: Worker) -> None:
        if worker.hub is not None:
            from kombu.asynchronous import set_event_loop

            worker.hub.close()
            set_event_loop(None)


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
        options = worker.options
        assert options.pool is not None  # the plan resolved it to a name
        pool_cls = worker.plugins.slot("pool", options.pool)
        size = max(1, options.autoscale.min) if options.autoscale else (options.concurrency or 1)
        pool_options = PoolOptions(
            concurrency=size,
            soft_time_limit=options.soft_time_limit,
            time_limit=options.time_limit,
            max_tasks_per_child=options.max_tasks_per_child,
            max_memory_per_child=options.max_memory_per_child,
            scheduling=options.scheduling,
            initializer=execution.process_initializer,
            finalizer=execution.process_finalizer,
            extra=options.extra,
        )
        pool_cls.check_options(pool_options)
        pool = pool_cls(pool_options)
        worker.pool = pool
        pool.start()
        if not pool.did_start_ok():
            raise PoolError(f"Could not start worker processes ({options.pool} pool)")
        if worker.hub is not None:
            pool.register_with_event_loop(worker.hub)

    def stop(self, worker: Worker) -> None:
        if worker.pool is not None:
            worker.pool.stop()

    def terminate(self, worker: Worker) -> None:
        if worker.pool is not None:
            worker.pool.terminate()


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
        options = worker.options
        assert options.autoscale is not None and worker.pool is not None  # the Pool step started first
        factory = worker.plugins.slot("autoscaler", options.autoscaler)
        scaler = factory(
            worker.pool,
            options.autoscale.max,
            options.autoscale.min,
            demand=worker.demand,
            on_max_change=worker.on_max_concurrency_change,
            hub=worker.hub,
            backlog=worker.backlog,
        )
        worker.autoscaler = scaler
        if worker.hub is not None:
            worker.on_task_message.append(scaler.maybe_scale)
        scaler.start()

    def stop(self, worker: Worker) -> None:
        if worker.autoscaler is not None:
            worker.autoscaler.stop()


class ConsumerStep(Step["Worker"]):
    """Takes messages from the broker and feeds the pool; runs the consumer blueprint."""

    name = "Consumer"
    last = True

    def describe(self, options: WorkerOptions) -> str:
        prefetch = (options.max_concurrency or 1) * options.prefetch_multiplier
        return f"queues {', '.join(options.queues)}; prefetch {prefetch}"

    def start(self, worker: Worker) -> None:
        worker.consumer = Consumer(worker)
        worker.consumer.start()

    def stop(self, worker: Worker) -> None:
        if worker.consumer is not None:
            worker.consumer.stop(terminate=False)

    def terminate(self, worker: Worker) -> None:
        if worker.consumer is not None:
            worker.consumer.stop(terminate=True)


def WORKER_STEPS() -> list[Step[Worker]]:
    return [TimerStep(), HubStep(), PoolStep(), AutoscalerStep(), ConsumerStep()]
