"""The interfaces of the single-implementation slots: what a pool, transport, event loop,
autoscaler, failover strategy or result backend plugin must provide.

Each slot has its own entry-point group (see :data:`worker_core.plugins.SLOT_GROUPS`); the entry
point names a class (or factory) that the worker calls as documented below. Only the chosen
implementation is imported, so a plugin's module should import its heavy dependencies lazily.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import attrs

if TYPE_CHECKING:
    from kombu.asynchronous import Hub

__all__ = [
    "AcceptCallback",
    "Autoscaler",
    "AutoscalerFactory",
    "EventLoop",
    "FailoverStrategy",
    "LoopContext",
    "Pool",
    "PoolFactory",
    "PoolOptions",
    "ResultBackend",
    "Transport",
]

#: ``accept_callback(pid, time_accepted)``: the job started running in process ``pid``.
AcceptCallback = Callable[[int, float], None]


# ---------------------------------------------------------------------------------------------
# Pool
# ---------------------------------------------------------------------------------------------


@attrs.frozen
class PoolOptions:
    """What the worker asks of a pool. A pool that cannot honour an option it was given
    (for example a hard time limit in a thread) refuses it in :meth:`Pool.check_options`."""

    concurrency: int
    soft_time_limit: float | None = None
    time_limit: float | None = None
    max_tasks_per_child: int | None = None
    max_memory_per_child: int | None = None  # KiB of resident memory
    scheduling: str = "fair"  # "fair": only idle executors get jobs; "fcfs": any executor
    #: Called once in every new process or thread before it takes jobs.
    initializer: Callable[[], None] | None = attrs.field(default=None, eq=False)
    #: Options declared by plugins (``WorkerOptions.extra``).
    extra: Mapping[str, Any] = attrs.field(factory=dict)


@runtime_checkable
class Pool(Protocol):
    """Runs jobs: inline (solo), in threads, in child processes, or anywhere a plugin likes.

    Construction: the entry point names a class called as ``Pool(options: PoolOptions)``; its
    class method :meth:`check_options` is called first and refuses options the pool cannot honour.

    **Jobs.** :meth:`apply_async` hands over ``target(*args, **kwargs)``; ``target`` is a
    module-level function (picklable by reference) and ``args`` hold plain data, so a process pool
    can send them to a child. The job's outcome is reported through the callbacks, never raised:

    - ``accept_callback(pid, time_accepted)`` when the job starts running (before ``callback``);
    - ``callback(retval)`` with the target's return value;
    - ``error_callback(exc)`` if the job could not finish: ``WorkerLostError`` when its process
      died, ``TimeLimitExceeded`` after the hard limit, ``JobWithdrawn`` when
      :meth:`withdraw_queued` gave it back unstarted;
    - ``timeout_callback(soft, seconds)`` when the soft (``soft=True``) or hard limit passes.

    Callbacks may be called from any thread; the worker's callbacks are thread-safe and cheap.
    Exactly one of ``callback``/``error_callback`` is called per job. A pool may call
    ``error_callback`` before :meth:`apply_async` returns (a job it cannot even send, such as
    unpicklable arguments for a process pool); calling :meth:`apply_async` after :meth:`stop` or
    :meth:`terminate` raises ``PoolError``.

    **Event loop.** Under the async loop the worker calls :meth:`register_with_event_loop` with
    kombu's hub once the pool started; the pool then does its I/O (pipes, timers) on the hub
    without threads, calls the callbacks in the hub's thread, and expects its methods to be
    called from the hub's thread. Under the sync loop it is never called and the pool uses its
    own threads.

    The contract suite in :mod:`worker_core.testing.pool_contract` checks all of this against
    any pool class.
    """

    #: Whether jobs run in separate processes (time limits can kill them, memory is isolated).
    is_process_pool: ClassVar[bool]

    #: Optional: a pool that always runs exactly this many jobs at once (solo: 1) declares it;
    #: ``-c`` is then ignored with a warning and ``--autoscale`` is refused before start-up.
    fixed_concurrency: ClassVar[int | None]

    #: Optional, False when absent: every executor takes its next job from one queue as soon as
    #: it is free, so a queued job never waits behind a busy executor while another is idle. Fair
    #: scheduling then needs no gate: the worker hands such a pool every task it has received
    #: instead of one per idle executor, and the pool must offer :meth:`withdraw_queued`.
    shared_queue: ClassVar[bool]

    def withdraw_queued(self) -> int:
        """Optional (required with ``shared_queue``): give back every job not started yet, each
        through its ``error_callback`` with ``JobWithdrawn``; return how many. The worker calls
        it on a warm shutdown and when the connection the messages came on is lost, so those
        messages go back to the broker instead of running late or twice."""

    @classmethod
    def check_options(cls, options: PoolOptions) -> None:
        """Raise ``ConfigurationError`` for an option this pool cannot honour."""

    def start(self) -> None:
        """Create the executors. Raise ``PoolError`` if they cannot start."""

    def stop(self) -> None:
        """Warm stop: take no new jobs, wait for running ones, then release the executors."""

    def terminate(self) -> None:
        """Cold stop: kill running jobs and release the executors now."""

    def apply_async(
        self,
        target: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        callback: Callable[[Any], None] | None = None,
        error_callback: Callable[[BaseException], None] | None = None,
        accept_callback: AcceptCallback | None = None,
        timeout_callback: Callable[[bool, float], None] | None = None,
        soft_timeout: float | None = None,
        timeout: float | None = None,
        name: str | None = None,
    ) -> Any:
        """Run a job; per-job limits override the pool's defaults.

        ``name`` labels the job in the pool's log lines (the worker passes the task's name, for
        example when a pool warns once per task that it cannot enforce that task's limits);
        pools may ignore it. A pool that offers :meth:`withdraw_job` returns the job's handle
        for it; others return None.
        """

    def withdraw_job(self, handle: Any) -> bool:
        """Optional: take back the job ``apply_async`` returned ``handle`` for, if no executor has
        started it; True if it was taken back, and then none of its callbacks is ever called.
        The worker calls it to discard a revoked task that waits in the pool."""

    @property
    def num_processes(self) -> int:
        """How many executors exist now."""

    def grow(self, n: int = 1) -> None:
        """Add ``n`` executors."""

    def shrink(self, n: int = 1) -> None:
        """Remove ``n`` idle executors; raise ``PoolError`` when every executor is busy."""

    def maintain_pool(self) -> None:
        """Replace dead or retired executors so the pool keeps its size."""

    def did_start_ok(self) -> bool:
        """Whether every executor came up after :meth:`start`."""

    def register_with_event_loop(self, hub: Hub) -> None:
        """Move the pool's I/O onto the hub (async loop only)."""

    def terminate_job(self, pid: int, signal: int | None = None) -> None:
        """Stop the job running in process ``pid`` (``signal`` defaults to SIGTERM)."""

    def info(self) -> Mapping[str, Any]:
        """Statistics for ``workerctl inspect stats``: implementation, processes, limits, ..."""


PoolFactory = Callable[[PoolOptions], Pool]


# ---------------------------------------------------------------------------------------------
# Transport
# ---------------------------------------------------------------------------------------------


@runtime_checkable
class Transport(Protocol):
    """Tells the worker how to reach one kind of broker through kombu.

    Registered under each URL scheme it serves (``redis``, ``rediss``, ``sentinel``); the entry
    point names a class whose class attributes are read before anything is imported, and which is
    instantiated as ``Transport(url, settings)`` when the worker connects.
    """

    #: Whether the transport can be driven by kombu's hub (the async event loop).
    supports_async: ClassVar[bool]
    #: Optional (``False`` when absent): whether a message received on one connection can be
    #: acknowledged on the next one to the same broker. When not, the worker drops the tasks it
    #: received but had not started when a connection is lost, and the broker delivers them again.
    acks_survive_reconnect: ClassVar[bool]

    @classmethod
    def default_result_backend(cls, broker_url: str) -> str | None:
        """The result backend URL to use when none is configured, or ``None`` for none."""

    def kombu_transport(self) -> Any:
        """The kombu transport (class or alias) to pass to ``kombu.Connection(transport=...)``."""

    def connection_options(self) -> Mapping[str, Any]:
        """Extra keyword arguments for ``kombu.Connection`` (transport options, heartbeat, ...)."""

    def queue_depth(self, connection: Any, queue: str) -> int:
        """Messages waiting in ``queue`` (for autoscalers that read the backlog)."""


# ---------------------------------------------------------------------------------------------
# Event loop
# ---------------------------------------------------------------------------------------------


class LoopContext(Protocol):
    """What the consumer offers the event loop that drives it."""

    connection: Any
    hub: Hub | None
    #: kombu's timer (``kombu.asynchronous.timer.Timer``), shared with the hub when there is one
    timer: Any

    def heartbeat_rate(self) -> float:
        """How many times per heartbeat interval to check AMQP heartbeats."""

    def drain_timeout(self, default: float) -> float:
        """How long a blocking drain may wait now (shorter while pool threads report back)."""

    def should_run(self) -> bool:
        """False once the worker is stopping or the connection was closed."""

    def perform_pending_operations(self) -> None:
        """Run callbacks queued from other threads (acks, QoS updates, timers)."""

    def update_qos(self) -> None:
        """Send a changed prefetch count to the broker (batched: only when it changed)."""

    def on_ready(self) -> None:
        """Called once consuming has started."""


@runtime_checkable
class EventLoop(Protocol):
    """Drives the consumer: reads broker messages and runs timers until told to stop.

    The entry point names a class instantiated with no arguments.
    """

    #: Whether the loop runs on kombu's hub (the Hub step is then part of the worker).
    uses_hub: ClassVar[bool]

    def run(self, context: LoopContext) -> None:
        """Loop until ``context.should_run()`` is false. A lost connection propagates as the
        transport's connection error, so the consumer can reconnect."""


# ---------------------------------------------------------------------------------------------
# Autoscaler
# ---------------------------------------------------------------------------------------------


@runtime_checkable
class Autoscaler(Protocol):
    """Grows and shrinks the pool between a minimum and a maximum with demand."""

    def maybe_scale(self) -> None:
        """Look at demand now and grow or shrink; errors are logged, never raised."""

    def update(self, max: int | None = None, min: int | None = None) -> tuple[int, int]:
        """Change the bounds at run time; return the new ``(max, min)``."""

    def info(self) -> Mapping[str, Any]:
        """``{"max", "min", "current", "qty"}`` for ``workerctl inspect stats``."""

    def start(self) -> None:
        """Begin scaling (a thread under the sync loop, hub timers under the async loop)."""

    def stop(self) -> None:
        """Stop scaling."""


#: ``factory(pool, max, min, *, demand, on_max_change, hub, backlog) -> Autoscaler`` where
#: ``demand()`` returns the reserved requests, ``on_max_change(diff)`` moves the prefetch count,
#: ``hub`` is None under the sync loop, and ``backlog()`` counts the messages still waiting in
#: the broker on the worker's queues (a call to the broker: use it at most every second or so).
AutoscalerFactory = Callable[..., Autoscaler]


# ---------------------------------------------------------------------------------------------
# Failover strategy
# ---------------------------------------------------------------------------------------------


@runtime_checkable
class FailoverStrategy(Protocol):
    """Chooses which of several broker URLs to try next.

    The entry point names a class instantiated as ``Strategy(urls)``.
    """

    def first(self) -> str:
        """The URL to connect to at start-up."""

    def next(self, failed: str) -> str:
        """The URL to try after ``failed`` could not be reached."""

    def preferred(self, current: str) -> str | None:
        """A better URL to move back to while connected to ``current``, or ``None``."""

    def __iter__(self) -> Iterator[str]:
        """An endless iterator of URLs in the order they should be tried."""


# ---------------------------------------------------------------------------------------------
# Result backend
# ---------------------------------------------------------------------------------------------


@runtime_checkable
class ResultBackend(Protocol):
    """Stores task states and results in Celery's format, and lets clients wait for them.

    The entry point (named after the URL scheme) names a class instantiated as
    ``Backend(url, settings)``.
    """

    def store_result(
        self,
        task_id: str,
        result: Any,
        state: str,
        traceback: str | None = None,
        request: Mapping[str, Any] | None = None,
    ) -> None:
        """Save ``{"status", "result", "traceback", "children", "date_done", "task_id"}``.

        ``result`` is already encoded (exceptions as ``exc_type``/``exc_message``/``exc_module``).
        """

    def get_task_meta(self, task_id: str) -> Mapping[str, Any]:
        """The stored meta, or ``{"status": "PENDING", "result": None, ...}`` when there is none."""

    def wait_for(
        self, task_id: str, timeout: float | None = None, interval: float = 0.5
    ) -> Mapping[str, Any]:
        """Block until the task is ready; raise ``ResultTimeout`` after ``timeout`` seconds."""

    def on_task_call(self, task_id: str) -> None:
        """Called by the client just before it publishes the task (to subscribe early)."""

    def forget(self, task_id: str) -> None:
        """Delete a stored result."""

    def close(self) -> None:
        """Release connections; also called in a child process after fork."""
