"""The interfaces of the single-implementation slots: what a pool, transport, event loop,
autoscaler, failover strategy, result backend or app loader plugin must provide, and what it may
offer.

Each slot has its own entry-point group (see :data:`worker_core.plugins.SLOT_GROUPS`); the entry
point names a class that the worker constructs as documented below. Only the chosen
implementation is imported, so a plugin's module should import its heavy dependencies lazily.

**Required and optional.** A slot's Protocol (:class:`Pool`, :class:`Transport`,
:class:`EventLoop`, :class:`Autoscaler`, :class:`FailoverStrategy`, :class:`ResultBackend`) lists
what every implementation must have: the plugin manager refuses a class that lacks any of it
when it loads the class, naming each missing member. Everything optional is a small capability
Protocol of its own (:class:`WithdrawsQueuedJobs`, :class:`WithdrawsOneJob`,
:class:`StopsOneJob`, :class:`SharesOneQueue`, :class:`FixedConcurrency`,
:class:`AcksSurviveReconnect`, :class:`LeasesMessages`, :class:`OffersResultBackend`,
:class:`CountsDeliveries`, :class:`FansOutEvents`, :class:`BuffersDeliveries`, :class:`AdoptsQueues`,
:class:`DelaysOnBroker`, :class:`RewritesUrls`, :class:`ElectsLeaders`, :class:`KeepsRecords`,
:class:`ReportsRefusals`, :class:`TellsTime`, :class:`ExplainsConnectFailures`,
:class:`OrdersByPriority`, :class:`SuccessIsFinal`, :class:`DiscardsResults`, :class:`SavesGroups`,
:class:`JoinsChords`, :class:`RepliesToSender`, :class:`BackendCountsDeliveries`,
:class:`RestartsProcesses`): a plugin offers one by defining all of its members, and the worker
tests for it with ``isinstance``. A capability made of class attributes is tested on the class
itself as well as on an instance (a class object carries its class attributes):
``isinstance(PoolClass, FixedConcurrency)``.
A class that defines some members of a capability but not all of them is refused at load.

One module by design: every slot's interface is declared in one place a plugin author reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import attrs

if TYPE_CHECKING:
    from kombu.asynchronous import Hub

    from .app.base import App
    from .app.settings import Settings
    from .options import WorkerOptions

__all__ = [
    "CAPABILITIES",
    "REQUIRED",
    "AcceptCallback",
    "AcksSurviveReconnect",
    "AdoptsQueues",
    "AppLoader",
    "Autoscaler",
    "AutoscalerFactory",
    "BackendCountsDeliveries",
    "BrokerStatus",
    "BuffersDeliveries",
    "ChordCount",
    "ConnectFailure",
    "CountsDeliveries",
    "DelaysOnBroker",
    "DiscardsResults",
    "ElectsLeaders",
    "EventLoop",
    "ExplainsConnectFailures",
    "FailoverStrategy",
    "FansOutEvents",
    "FencesLeases",
    "FixedConcurrency",
    "ForeignApp",
    "JoinsChords",
    "KeepsRecords",
    "Lease",
    "LeaseState",
    "LeasesMessages",
    "ListsConfiguration",
    "LoopContext",
    "OffersResultBackend",
    "OrdersByPriority",
    "ParksMessages",
    "Pool",
    "PoolFactory",
    "PoolOptions",
    "RecordTable",
    "RepliesToSender",
    "ReportsRefusals",
    "RestartsProcesses",
    "ResultBackend",
    "RewritesUrls",
    "SavesGroups",
    "SendsOnce",
    "SharesOneQueue",
    "StopsOneJob",
    "SuccessIsFinal",
    "TellsTime",
    "Transport",
    "WithdrawsOneJob",
    "WithdrawsQueuedJobs",
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
    #: Called with its exit status in every process or thread that ends without being killed
    #: (recycled, shrunk, the pool stopping), after its last job; the solo pool calls it with 0
    #: when it stops.
    finalizer: Callable[[int], None] | None = attrs.field(default=None, eq=False)
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
      :meth:`WithdrawsQueuedJobs.withdraw_queued` gave it back unstarted;
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

    **Optional capabilities**: :class:`FixedConcurrency`, :class:`SharesOneQueue`,
    :class:`WithdrawsQueuedJobs`, :class:`WithdrawsOneJob`, :class:`StopsOneJob`.

    The contract suite in :mod:`worker_core.testing.pool_contract` checks all of this against
    any pool class.
    """

    #: Whether jobs run in separate processes (time limits can kill them, memory is isolated).
    is_process_pool: ClassVar[bool]

    def __init__(self, options: PoolOptions) -> None:
        """Prepare the pool; start nothing yet (that is :meth:`start`)."""

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
        pools may ignore it. A pool that is :class:`WithdrawsOneJob` returns the job's handle
        for :meth:`~WithdrawsOneJob.withdraw_job`; others return None.
        """

    @property
    def num_processes(self) -> int:
        """How many executors exist now."""

    def grow(self, n: int = 1) -> None:
        """Add ``n`` executors; a pool that cannot grow raises ``PoolError``."""

    def shrink(self, n: int = 1) -> None:
        """Remove ``n`` idle executors; raise ``PoolError`` when every executor is busy (or when
        the pool cannot change its size)."""

    def maintain_pool(self) -> None:
        """Replace dead or retired executors so the pool keeps its size."""

    def did_start_ok(self) -> bool:
        """Whether every executor came up after :meth:`start`."""

    def register_with_event_loop(self, hub: Hub) -> None:
        """Move the pool's I/O onto the hub (async loop only)."""

    def terminate_job(self, pid: int, signal: int | None = None) -> None:
        """Stop the job running in process ``pid`` (``signal`` defaults to SIGTERM); a pool that
        cannot stop a running job raises ``PoolError`` saying so."""

    def info(self) -> Mapping[str, Any]:
        """Statistics for ``workerctl inspect stats``: implementation, processes, limits, ..."""


#: What the pool slot's entry point names: usually the pool class itself.
PoolFactory = Callable[[PoolOptions], Pool]


@runtime_checkable
class FixedConcurrency(Protocol):
    """A pool that always runs exactly ``fixed_concurrency`` jobs at once (solo: 1).

    Read on the pool's class before it is built (``isinstance(pool_class, FixedConcurrency)``):
    the worker then ignores ``-c`` with a warning, runs with that concurrency, and refuses
    ``--autoscale`` before start-up. Without it, the concurrency is ``-c`` (default: the number
    of CPUs) and the pool is expected to grow and shrink.
    """

    fixed_concurrency: ClassVar[int]


@runtime_checkable
class WithdrawsQueuedJobs(Protocol):
    """A pool that can give back every job it holds that no executor has started.

    The worker calls :meth:`withdraw_queued` on a warm shutdown and when the connection the
    messages came on is lost, so those messages go back to the broker instead of running late or
    twice. Without it, the worker holds back what the pool has not started itself (it hands the
    pool only as many jobs as it has idle executors under fair scheduling), and jobs queued in the
    pool run before the pool stops.
    """

    def withdraw_queued(self) -> int:
        """Give back every job not started yet, each through its ``error_callback`` with
        ``JobWithdrawn``; return how many."""


@runtime_checkable
class SharesOneQueue(WithdrawsQueuedJobs, Protocol):
    """A pool whose executors take their next job from one queue as soon as they are free, so a
    queued job never waits behind a busy executor while another is idle.

    Declared with ``shared_queue = True`` (``False`` means the same as leaving it out); test for
    it with ``isinstance(pool, SharesOneQueue) and pool.shared_queue``. Fair scheduling then
    needs no gate: the worker hands such a pool every task it has received instead of one per
    idle executor, and gets back the unstarted ones with :meth:`withdraw_queued`. Without it,
    under fair scheduling the worker hands the pool a job only when an executor is idle.
    """

    shared_queue: ClassVar[bool]


@runtime_checkable
class WithdrawsOneJob(Protocol):
    """A pool that can take back one job it holds, if no executor has started it.

    The worker calls :meth:`withdraw_job` to discard a revoked task that waits in the pool, with
    the handle :meth:`Pool.apply_async` returned for it. Without it, a revoked task already handed
    to the pool is discarded when it starts instead (its result is stored as REVOKED then).
    """

    def withdraw_job(self, handle: Any) -> bool:
        """Take back the job ``apply_async`` returned ``handle`` for, if no executor has
        started it; True if it was taken back, and then none of its callbacks is ever called."""


@runtime_checkable
class StopsOneJob(Protocol):
    """A pool whose processes run many jobs at once (an event loop's coroutines), so that a job
    is stopped on its own rather than by killing its process.

    The worker calls :meth:`stop_job` instead of :meth:`Pool.terminate_job` to stop a running
    task (a revoke with ``terminate``, a task cancelled after a lost connection), with the handle
    :meth:`Pool.apply_async` returned for it. The job still reports its end through its
    callbacks (the worker, which settled the task already, ignores them).
    """

    def stop_job(self, handle: Any, signal: int | None = None) -> None:
        """Stop the running job ``apply_async`` returned ``handle`` for (``signal`` as
        :meth:`Pool.terminate_job` takes it: what it means is the pool's to document); raise
        ``PoolError`` when it runs nowhere (not started, or finished)."""


@runtime_checkable
class RestartsProcesses(Protocol):
    """A pool that can replace every one of its processes (Celery's ``pool_restart``).

    The remote ``pool_restart`` command calls :meth:`restart` (only with ``worker_pool_restarts``
    on, as in Celery), after importing or reloading the task modules in the worker's process, so
    the new processes run the new code. Without it, ``pool_restart`` answers that this pool cannot
    restart.
    """

    def restart(self) -> None:
        """Replace every process: each finishes the jobs it was given, then exits, and a new one
        takes its place; returns at once."""


# ---------------------------------------------------------------------------------------------
# Transport
# ---------------------------------------------------------------------------------------------


@runtime_checkable
class Transport(Protocol):
    """Tells the worker how to reach one kind of broker through kombu.

    Registered under each URL scheme it serves (``redis``, ``rediss``, ``sentinel``); a scheme
    with ``+`` (``db+postgresql://``) is served by the entry point named after the whole scheme,
    else by the one named after its part before ``+`` (``db``). The entry point names a class whose
    class attributes are read before anything is imported, and which is instantiated as
    ``Transport(url, settings)`` when the worker connects.

    **Optional capabilities**: :class:`AcksSurviveReconnect`, :class:`LeasesMessages`,
    :class:`OffersResultBackend`, :class:`CountsDeliveries`, :class:`FansOutEvents`,
    :class:`BuffersDeliveries`, :class:`AdoptsQueues`, :class:`DelaysOnBroker`,
    :class:`RewritesUrls`, :class:`ElectsLeaders`, :class:`KeepsRecords`, :class:`ReportsRefusals`,
    :class:`TellsTime`, :class:`ExplainsConnectFailures`, :class:`OrdersByPriority`; its channels may be
    :class:`ParksMessages` and :class:`FencesLeases`. The worker never asks which broker it has:
    what differs between brokers is one of these, with the behaviour without it said in its
    docstring.

    The contract suite in :mod:`worker_core.testing.transport_contract` checks a transport against
    a real broker of its kind.
    """

    #: Whether the transport can be driven by kombu's hub (the async event loop).
    supports_async: ClassVar[bool]

    def __init__(self, url: str, settings: Settings) -> None:
        """Check the URL and the ``broker_*`` settings without connecting; raise
        ``ConfigurationError`` naming what is wrong."""

    def kombu_transport(self) -> Any:
        """The kombu transport (class or alias) to pass to ``kombu.Connection(transport=...)``."""

    def connection_options(self) -> Mapping[str, Any]:
        """Extra keyword arguments for ``kombu.Connection`` (transport options, heartbeat, ...):
        a new mapping on every call, since kombu writes into what it is given."""

    def queue_depth(self, connection: Any, queue: str) -> int:
        """Messages waiting in ``queue``, 0 when it does not exist (for autoscalers that read the
        backlog); ``connection`` is a kombu connection made with :meth:`kombu_transport` and
        :meth:`connection_options`."""


@runtime_checkable
class AcksSurviveReconnect(Protocol):
    """A transport on which a message received on one connection can be acknowledged on the next
    one to the same broker (Redis: acknowledgements name the message, not the connection).

    Declared with ``acks_survive_reconnect = True`` (``False`` means the same as leaving it
    out); test for it with ``isinstance(transport, AcksSurviveReconnect) and
    transport.acks_survive_reconnect``. The worker then keeps running the tasks it received
    before a lost connection and acknowledges them on the new one. Without it (AMQP: delivery tags
    belong to the channel), the worker drops the tasks it received but had not started when a
    connection is lost, and the broker delivers them again.
    """

    acks_survive_reconnect: ClassVar[bool]


@runtime_checkable
class LeasesMessages(Protocol):
    """A transport whose broker lends each delivered message for a limited time (a visibility
    timeout) and then gives it, still unacknowledged, to another consumer (Redis, the embedded
    transport, kombu's SQS).

    Read on the class before anything connects (``isinstance(transport_class, LeasesMessages)``).
    With ``renews_leases = True`` the transport renews the lease of every message the worker holds
    (waiting for its ETA, its rate limit or a free slot, or running) well before the timeout, so a
    task may wait or run for longer than the timeout and still runs once. With ``False``, the
    worker warns once, naming the setting to raise, when a task's ETA or countdown is further away
    than :meth:`lease_timeout`: the broker would deliver its message again meanwhile.
    """

    renews_leases: ClassVar[bool]

    @classmethod
    def lease_timeout(cls, settings: Settings) -> float:
        """Seconds the broker lends a delivered message under ``settings`` (its visibility timeout)."""


@runtime_checkable
class OffersResultBackend(Protocol):
    """A transport that names a result backend to use when none is configured (the embedded
    transport keeps results in its own file).

    Read on the class before anything connects (``isinstance(transport_class,
    OffersResultBackend)``) by the worker and the app. Without it, or when it returns ``None``,
    results are ``disabled`` unless ``result_backend`` is set, as in Celery.
    """

    @classmethod
    def default_result_backend(cls, broker_url: str) -> str | None:
        """The result backend URL to use for ``broker_url`` when none is configured, or ``None``."""


@runtime_checkable
class CountsDeliveries(Protocol):
    """A transport that keeps counters on its broker, where they outlive any worker: the poison
    cap (``worker_redelivery_limit``) counts there the starts of a message the broker delivered
    again, so a task that takes its whole worker down (any pool) stops coming back.

    Called in the worker's main process (the event loop's thread) just before a message whose
    ``delivery_info['redelivered']`` is set goes to the pool, never for a first delivery: it
    costs nothing on the usual path. Test for it with ``isinstance(transport, CountsDeliveries)``.
    Without it (and without a result backend that is :class:`BackendCountsDeliveries`), only the
    broker's own count (a RabbitMQ quorum queue's ``x-delivery-count``) and the prefork pool's
    count of its lost children cap a poison message.
    """

    def count_delivery(self, connection: Any, key: str, expires: float) -> int:
        """Add one to the counter ``key`` (0 when it does not exist) and return the new value, in
        one atomic step that any number of workers may take at once; the counter is forgotten
        ``expires`` seconds after its last count. ``connection`` is a kombu connection made with
        :meth:`Transport.kombu_transport`. Raise on any failure (the task then runs uncounted,
        with a log line that says so)."""


@runtime_checkable
class FansOutEvents(Protocol):
    """A transport on which monitoring events must go out on a fanout exchange: kombu's Redis
    transport delivers a topic exchange's messages only within one process, so Celery's monitors
    (Flower, ``celery events``) bind to a fanout ``celeryev`` there, and this worker publishes so.

    Declared with ``fans_out_events = True`` (``False`` means the same as leaving it out); test
    for it with ``isinstance(transport, FansOutEvents) and transport.fans_out_events``. Without it
    the ``celeryev`` exchange is a topic exchange, as on RabbitMQ.
    """

    fans_out_events: ClassVar[bool]


@runtime_checkable
class BuffersDeliveries(Protocol):
    """A transport whose client reads deliveries into a buffer of its own while it waits for a
    broker's reply (py-amqp reads every frame up to the reply to a window change), where the event
    loop's poller cannot see them: nothing wakes the loop for them until the broker sends more.

    Declared with ``buffers_deliveries = True`` (``False`` means the same as leaving it out); test
    for it with ``isinstance(transport, BuffersDeliveries) and transport.buffers_deliveries``. The
    worker then reads the connection without waiting right after consuming starts (the async
    loop) and after each change of the prefetch window. Without it nothing is read but what the
    loop reads.
    """

    buffers_deliveries: ClassVar[bool]


@runtime_checkable
class AdoptsQueues(Protocol):
    """A transport whose broker keeps a queue with the arguments it was first declared with and
    refuses a declaration with others (RabbitMQ: ``PRECONDITION_FAILED``, which also closes the
    channel that sent it).

    Test for it with ``isinstance(transport, AdoptsQueues)``. The worker then declares each queue
    it consumes with :meth:`declare_queue` before consuming it (at start and for ``add_consumer``),
    and consumes what it returns; the app publishes once more, without declaring, when
    :meth:`declaration_differs` says a publish failed on such a refusal (the queue takes the
    message as it is). Without it, kombu declares the queues as the worker has them when
    consuming starts, and a failed declaration is an error like any other.
    """

    def declare_queue(self, connection: Any, queue: Any) -> Any:
        """Declare the kombu ``queue`` (its exchange, the queue, its bindings) on a channel of its
        own on ``connection``, never the one that consumes, and return the queue as the broker has
        it: with the arguments of a queue that exists with others where consuming it as it is is
        safe, in one log line naming the queue, the argument, both values and the setting to
        change. Raise :class:`~worker_core.exceptions.TopologyError` saying why when it cannot
        be consumed (a stream, an exchange of another type, a refusal for good)."""

    def declaration_differs(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the broker refusing a declaration because the queue or exchange
        exists with other arguments."""


@attrs.frozen
class ConnectFailure:
    """Why a connection to a broker could not be made, in words (what the broker refused and the
    fix), and whether trying again on the reconnect schedule can help (a missing virtual host may
    be created meanwhile; a wrong password stays wrong)."""

    reason: str
    retry: bool = True


@runtime_checkable
class ExplainsConnectFailures(Protocol):
    """A transport that says in words why a connection to its broker could not be made: a login,
    a virtual host, a permission refused. (A broker that refuses work on a connection it accepted
    is :class:`ReportsRefusals`.)

    Test for it with ``isinstance(transport, ExplainsConnectFailures)``. The worker asks it about
    every error a connection attempt raises: each attempt is then one log line with the reason,
    and one that trying again cannot mend stops the worker with that line. Without it (or when it
    returns None) the error is logged as the library words it, and every connection error is
    retried on the reconnect schedule.
    """

    def explain_connect_failure(self, exc: BaseException) -> ConnectFailure | None:
        """``exc``, raised by ``connection.connect()``, explained; None to leave it as it is."""


@runtime_checkable
class DelaysOnBroker(Protocol):
    """A transport whose broker can hold a message until its countdown is due, in the layout of
    Celery's native delayed delivery (RabbitMQ: the ``celery_delayed_<level>`` exchanges and
    queues), so Celery's clients and workers and this worker's share the delays.

    Test for it with ``isinstance(transport, DelaysOnBroker)``. Used as Celery uses it, for quorum
    queues (whose prefetch window is per consumer, so a message held in the worker for its
    countdown would block the window): when the worker consumes one it calls
    :meth:`declare_delays`, then :meth:`bind_to_delays` for each queue it consumes; the app sends
    a countdown of a second or more to a queue that is not on a direct exchange through
    :meth:`delayed_route`. The routing key of a message that comes out of the delays carries the
    delay's bits before its own (:func:`worker_core.protocol.strip_delay` takes them off).
    Without it every countdown waits in the worker.
    """

    def declare_delays(self, connection: Any, queue_type: str) -> None:
        """Declare the delays' exchanges, queues (of ``queue_type``: the setting
        ``broker_native_delayed_delivery_queue_type``) and bindings, on a channel of its own.
        Raise what the broker refused: the worker logs it and holds the countdowns itself."""

    def bind_to_delays(self, connection: Any, queue: Any) -> None:
        """Let the delayed messages meant for the kombu ``queue`` reach it, on a channel of its own
        (a queue whose exchange is direct cannot take part: say so in a log line)."""

    def delayed_route(self, seconds: float, routing_key: str) -> tuple[str, str]:
        """The exchange and routing key that hold a message ``seconds`` (1 or more) on the broker
        on its way to ``routing_key`` (the delay bits of an earlier delay replaced)."""


class BrokerStatus(Protocol):
    """What the worker gives a transport that :class:`ReportsRefusals`, to say when its broker
    refuses work and when it takes work again. Thread-safe and cheap: call it from any thread, as
    often as the refusal is seen (an episode is opened once, and closed once)."""

    def refused(self, reason: str) -> None:
        """The broker refuses work now, on a connection that still works (full, read-only, busy,
        blocking the connection): ``reason`` says so in words (``"Redis refuses work: out of
        memory"``). The first call opens an episode: logged once, counted, shown by ``inspect
        stats`` and the metrics, and the worker is not ready until it ends."""

    def accepted(self) -> None:
        """The broker takes work again: closes the episode, logged once with its duration (nothing
        when none is open)."""


@runtime_checkable
class ReportsRefusals(Protocol):
    """A transport whose broker can refuse work for a while on a connection that still works
    (Redis out of memory, a read-only replica, a busy script; RabbitMQ's ``connection.blocked``
    under a memory or disk alarm), and that tells that apart from a lost connection.

    The transport backs off (a bounded, jittered delay), keeps its connection and tries again,
    telling the worker's :class:`BrokerStatus` when the refusal starts and ends; the worker logs
    both, reports the state in ``inspect stats``, the metrics and :meth:`Worker.broker_state
    <worker_core.worker.worker.Worker.broker_state>` (readiness is ``broker-blocked``), and when a
    refusal reaches it as an error (at start-up, declaring queues) it waits a bounded, jittered
    delay before starting again instead of reconnecting at once. Read on the class before
    anything connects. Without it, every such error is a lost connection.
    """

    @classmethod
    def refusal(cls, exc: BaseException) -> str | None:
        """What ``exc`` means when it is such a refusal (a short phrase, as for
        :meth:`BrokerStatus.refused`), else None (a lost connection, or any other error)."""

    @classmethod
    def watch_refusals(cls, connection: Any, status: BrokerStatus) -> None:
        """Called with each kombu connection the consumer makes, before it connects: tell
        ``status`` of the refusals seen on it from now on."""


@runtime_checkable
class TellsTime(Protocol):
    """A transport whose broker tells its own time (Redis: ``TIME``).

    The worker reads it when it connects and whenever its own wall clock jumps: a difference
    beyond two seconds is logged (at start, and when it changes) and shown in ``inspect stats``,
    and tasks held for their ETA or countdown wait by the broker's clock, not the worker's, so a
    worker whose clock is off or steps runs them when the rest of the fleet does. Without it the
    worker has its own clock only. Read on the class before anything connects.
    """

    @classmethod
    def broker_time(cls, connection: Any) -> float:
        """The broker's clock now, in seconds since the epoch, read through ``connection`` (a kombu
        connection made with :meth:`Transport.kombu_transport`). Raise on any failure."""


@runtime_checkable
class OrdersByPriority(Protocol):
    """A transport that hands out a queue's waiting messages by their ``priority`` property
    first, then in the order they came (Redis's priority lists, RabbitMQ's ``x-max-priority``
    queues, the tables of PostgreSQL and the embedded transport).

    A client that speaks of priorities on another scale (Django's tasks: -100 to 100) maps them
    onto this one. Without it, the priority a message carries changes nothing of its order.
    Read on the class, with the settings the queues are declared with.
    """

    @classmethod
    def priority_order(cls, settings: Settings) -> tuple[int, int] | None:
        """``(first, last)``: the priority served first and the one served last (``(0, 9)`` on
        Redis, where the lower number wins; ``(9, 0)`` where the higher does), every whole number
        between them a priority; None when these settings leave priorities unhonoured (a
        RabbitMQ queue declared without ``x-max-priority``)."""


@runtime_checkable
class FencesLeases(Protocol):
    """A kombu channel (of a transport plugin) whose broker lends each delivered message for a
    time, and that can tell which of the messages this process holds it lost: the lease could
    not be renewed in time (the process stood still, a paused VM, or the broker refused or could
    not be reached for longer than the lease) and the broker gave the message to a consumer again.

    Test for it with ``isinstance(message.channel, FencesLeases)``. The worker asks before it
    hands a message to the pool, and before it acknowledges one: a message whose lease was lost
    is not started (the broker's copy runs where it is delivered) and a running one is not
    acknowledged on the broker; the worker acknowledges or rejects such a message through the
    channel as usual, and the channel writes nothing to the broker for it. A copy of a task it
    ran or is running that comes back to it is dropped. A channel may take a copy for the message
    it still holds under the same delivery tag (dropping the copy: the lease is this process's
    again, no longer lost); a message the worker stopped as it started is rejected with requeue,
    which then puts it back on its queue. Without it, a worker that stood still past its leases
    runs what it holds as if nothing happened.
    """

    def lost_leases(self) -> frozenset[Any] | None:
        """The delivery tags of the held messages whose lease this process lost. Cheap while the
        leases were renewed in time; when they may have lapsed (by the monotonic clock), asks the
        broker first (one round trip for every held message). None when that cannot be told now
        (the broker unreachable or refusing) while the leases may have lapsed."""


@runtime_checkable
class RewritesUrls(Protocol):
    """A transport serving a URL scheme that kombu would read as another transport's: kombu takes
    the part of a scheme before ``+`` as the name of a kombu transport of its own, whatever
    transport it is given (``sqla+postgresql://`` would be kombu's SQLAlchemy transport).

    Test for it with ``isinstance(transport, RewritesUrls)``. The worker and the app then hand
    kombu ``kombu_url(url)`` for each broker URL instead of the URL itself (the user's URL stays
    what is shown and chosen by). Without it, kombu is given the URL as it is.
    """

    def kombu_url(self, url: str) -> str:
        """The URL to give ``kombu.Connection`` for the broker URL ``url`` (of this transport's
        schemes), one kombu reads as this transport's."""


@runtime_checkable
class ParksMessages(Protocol):
    """A kombu channel (of a transport plugin) that keeps each message it delivered until it is
    acknowledged, as kombu's virtual transports do, and can keep one the worker holds for a long
    time (waiting for its ETA) in the worker's compact form instead.

    Test for it with ``isinstance(message.channel, ParksMessages)``. Without it the channel keeps
    the whole message, and a held task costs the worker that much more memory.
    """

    def park_message(self, delivery_tag: Any, envelope: bytes) -> None:
        """Keep the delivered message ``delivery_tag`` as ``envelope`` from now on: its kombu
        envelope (the ``_raw`` of kombu's virtual message) packed with
        :func:`worker_core.protocol.packing.pack`, which :func:`~worker_core.protocol.packing.unpack`
        turns back into it whenever the channel needs the message (to put a copy back). The
        worker acknowledges or rejects it by its tag as before."""


# ---------------------------------------------------------------------------------------------
# Transport: leader election (leases with fencing tokens) and records kept on the broker
# ---------------------------------------------------------------------------------------------


@attrs.frozen
class LeaseState:
    """Who holds a lease, as the broker says (:meth:`Lease.current`)."""

    #: the holder's name (:attr:`Lease.holder`); None when the broker says only that someone
    #: holds it (RabbitMQ tells a waiting holder nothing more)
    holder: str | None
    #: the holder's fencing token, when known
    token: int | None = None
    #: seconds before the lease lapses unless renewed, when the broker keeps a deadline
    expires_in: float | None = None


@runtime_checkable
class Lease(Protocol):
    """One named lease on a broker: at most one holder at a time, each holding it under a
    fencing token larger than every earlier holder's. What a worker elects a leader with (one
    scheduler sends the periodic tasks, one exporter reads the queues' lengths).

    Made by :meth:`ElectsLeaders.lease` on a connection of its own, and used from one thread
    only (the connection is not shared). Every method may raise the transport's connection
    errors (``kombu.Connection.connection_errors``) when the broker cannot be reached: the
    caller then counts the lease as held only until the deadline it last confirmed (see
    :attr:`ttl`), and tries again.

    **The contract.**

    - :meth:`acquire` gives the lease to one caller at a time: while one holds it (it renews
      within :attr:`ttl` of its last renewal), every other ``acquire`` returns None.
    - Each holding has a **fencing token**: an integer larger than the token of every earlier
      holding of this lease on this broker, so a store can refuse what an older holder asks
      after a newer one took over (:class:`SendsOnce` does so on the broker itself).
    - A holder that stops renewing (killed, paused, cut off from the broker) loses the lease at
      most :attr:`bound` seconds after its last successful renewal, and a caller that keeps
      calling ``acquire(wait)`` holds it within ``wait`` seconds after that.
    - A holder that knows it is done calls :meth:`release`: the next caller holds it at once.
    - A holder must not act as one once ``ttl`` seconds passed since it last called
      :meth:`acquire` or :meth:`renew` successfully (counted from before the call), unless a
      renewal confirmed it since: its lease may have lapsed on the broker meanwhile.

    **Using it** (what :class:`worker_core.election.Election` does on a thread of its own)::

        lease = transport.lease("queue-lengths", worker.hostname, ttl=3.0)
        while running:
            if lease.token is None:
                if lease.acquire(wait=0.5) is None:
                    continue              # another holds it; acquire waited a while
            elif not lease.renew():
                continue                  # lost it: back to acquiring
            do_the_leaders_work(lease.token)   # briefly: renew again within ttl / 3
        lease.close()                     # releases it if held

    The contract suite in :mod:`worker_core.testing.lease_contract` checks all of this against
    a real broker.
    """

    #: the lease's name: every holder of one name on one broker competes for the same lease
    name: str
    #: this holder's name as others see it: the ``holder`` given to :meth:`ElectsLeaders.lease`
    #: plus a suffix that makes it unique to this object (two processes given one name never
    #: mistake one another's lease for their own)
    holder: str
    #: seconds a holding lasts without a renewal
    ttl: float

    @property
    def bound(self) -> float:
        """Seconds after the holder's last successful renewal by which the lease is free again
        if the holder is lost: ``ttl`` where the broker keeps the deadline (Redis, the embedded
        store), the broker's heartbeat timeout where the lease lives with a connection
        (RabbitMQ: about ``ttl``, see its transport)."""

    @property
    def token(self) -> int | None:
        """This holder's fencing token while it holds the lease (as far as it knows), else None."""

    def acquire(self, wait: float = 0.0) -> int | None:
        """Take the lease if it is free, waiting up to ``wait`` seconds for it to come free;
        return the fencing token, or None when another holds it. Called while this object holds
        the lease, it renews it and returns the same token."""

    def renew(self) -> bool:
        """Extend this holding by ``ttl`` from now; False when the lease was lost (it lapsed,
        or another holds it): :attr:`token` is None then."""

    def release(self) -> None:
        """Give the lease up at once, so another caller holds it without waiting for the
        deadline; nothing happens when this object does not hold it."""

    def current(self) -> LeaseState | None:
        """Who holds the lease now, for ``inspect`` and metrics; None when nobody does."""

    def close(self) -> None:
        """Release the lease if held and close the lease's connection."""


@runtime_checkable
class ElectsLeaders(Protocol):
    """A transport whose broker can hold leases (:class:`Lease`): the way a fleet of workers
    elects one of them to do a job once (the scheduler of periodic tasks, an exporter), with a
    fencing token per holding and a stated bound on the takeover after the holder is lost.

    Test for it with ``isinstance(transport, ElectsLeaders)``; the transport is the object the
    transport slot's class builds (``Transport(url, settings)``). Without it, a plugin that
    needs one leader must be told to run in one process only. Redis keeps a lease as a key with
    a deadline (``SET NX PX``) and a counter for its tokens, the embedded transport as a row of
    its file (one machine), PostgreSQL as a row locked by each use (its deadline on the server's
    clock), RabbitMQ as a message of a single-active-consumer queue held
    unacknowledged by its holder (the lease follows the holder's connection: its bound is the
    connection's heartbeat timeout).
    """

    def lease(self, name: str, holder: str, *, ttl: float) -> Lease:
        """A lease named ``name`` (letters, digits, ``.``, ``-``, ``_``) for ``holder`` (a name
        for people: the node name), lasting ``ttl`` seconds without renewal, on a connection of
        its own opened when first used. Raise ``ConfigurationError`` for a name or ttl it
        cannot take."""


@runtime_checkable
class SendsOnce(Protocol):
    """A :class:`Lease` under which a message is sent at most once per key, in one step with
    the check that its holder still holds the lease: what makes a paused or cut-off leader
    harmless once another took over, and a tick of a periodic task go out exactly once.

    Test for it on the lease: ``isinstance(lease, SendsOnce)``. The broker does the three
    things atomically or none: it checks that this holder still holds the lease under its
    token, that ``key`` was never sent (it keeps keys ``keep`` seconds), and it takes the
    message and records ``record``. So a holder killed mid-send leaves either a sent message
    with its record or neither; and an old holder that resumes after a takeover is refused.

    The records kept with the lease (:meth:`records`) are the holder's state (the last tick
    sent per periodic task), written only under the lease.
    """

    def send_once(self, key: str, publish: Callable[[Any], None], *, record: tuple[str, str] | None = None,
                  keep: float) -> bool:
        """Call ``publish(producer)`` with a ``kombu.Producer`` on the lease's connection;
        the one message it publishes is sent only if ``key`` was never sent under this lease
        (kept ``keep`` seconds) and this object still holds the lease, together with setting
        ``record`` (``(field, value)``) among the lease's records. Return True when sent, False
        when ``key`` was sent already (nothing sent, the record unchanged). Raise
        :class:`~worker_core.exceptions.LeaseLost` when the lease is no longer held (nothing
        sent), ``ValueError`` when ``publish`` published no message or more than one."""

    def records(self) -> dict[str, str] | None:
        """The records kept with the lease; None when this broker lets only the holder read
        them and this object does not hold the lease (RabbitMQ)."""

    def write_records(self, changes: Mapping[str, str | None]) -> None:
        """Set (or, for None, delete) records under the lease; raise
        :class:`~worker_core.exceptions.LeaseLost` when it is not held (nothing written)."""


@runtime_checkable
class RecordTable(Protocol):
    """A small named table of text records on the broker (:meth:`KeepsRecords.record_table`),
    which any process may read and write: entries of a schedule changed at run time, say.
    Each write is atomic; :meth:`version` lets a reader poll for changes cheaply."""

    def read(self) -> dict[str, str]:
        """Every record, by key."""

    def version(self) -> int:
        """A number that changes whenever a record is written or deleted (0 for a table never
        written)."""

    def put(self, key: str, value: str) -> None:
        """Write a record, replacing what the key held."""

    def delete(self, key: str) -> bool:
        """Delete a record; False when there was none."""

    def close(self) -> None:
        """Close the table's connection (it opens again when used)."""


@runtime_checkable
class KeepsRecords(Protocol):
    """A transport whose broker keeps small tables of records for any process to read and write
    (Redis: a hash and a version counter; PostgreSQL and the embedded transport: a table).

    Test for it with ``isinstance(transport, KeepsRecords)``. Without it (RabbitMQ keeps
    messages, not records), what would live there must live elsewhere, and a command that
    needs it says so.
    """

    def record_table(self, name: str) -> RecordTable:
        """The table ``name`` (letters, digits, ``.``, ``-``, ``_``), on a connection of its own
        opened when first used."""


# ---------------------------------------------------------------------------------------------
# Event loop
# ---------------------------------------------------------------------------------------------


class LoopContext(Protocol):
    """What the consumer offers the event loop that drives it (the loop only reads these)."""

    @property
    def connection(self) -> Any:
        """The kombu connection being consumed from."""

    @property
    def transport(self) -> Transport:
        """The transport plugin object the connection was made with: ask it what it can do
        (for example ``isinstance(context.transport, BuffersDeliveries)``)."""

    @property
    def hub(self) -> Hub | None:
        """kombu's hub under the async loop, else None."""

    @property
    def timer(self) -> Any:
        """kombu's timer (``kombu.asynchronous.timer.Timer``), shared with the hub when there is one."""

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

    def __init__(self) -> None:
        """Take no arguments: everything comes with the :class:`LoopContext` given to :meth:`run`."""

    def run(self, context: LoopContext) -> None:
        """Loop until ``context.should_run()`` is false. A lost connection propagates as the
        transport's connection error, so the consumer can reconnect."""


# ---------------------------------------------------------------------------------------------
# Autoscaler
# ---------------------------------------------------------------------------------------------


@runtime_checkable
class Autoscaler(Protocol):
    """Grows and shrinks the pool between a minimum and a maximum with demand.

    The entry point names a class instantiated as ``Autoscaler(pool, max, min, *, demand,
    on_max_change, hub, backlog)`` (see :meth:`__init__`).
    """

    def __init__(
        self,
        pool: Pool,
        max_concurrency: int,
        min_concurrency: int = 0,
        *,
        demand: Callable[[], int],
        on_max_change: Callable[[int], None] | None = None,
        hub: Hub | None = None,
        backlog: Callable[[], int] | None = None,
    ) -> None:
        """``demand()`` returns how many requests are reserved (waiting or running),
        ``on_max_change(diff)`` moves the prefetch count when :meth:`update` changes the maximum,
        ``hub`` is None under the sync loop, and ``backlog()`` counts the messages still waiting
        in the broker on the worker's queues (a call to the broker: use it at most every second
        or so)."""

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


#: ``factory(pool, max, min, *, demand, on_max_change, hub, backlog) -> Autoscaler``: see
#: :meth:`Autoscaler.__init__`.
AutoscalerFactory = Callable[..., Autoscaler]


# ---------------------------------------------------------------------------------------------
# Failover strategy
# ---------------------------------------------------------------------------------------------


@runtime_checkable
class FailoverStrategy(Protocol):
    """Chooses which of several broker URLs to try next.

    The entry point names a class instantiated as ``Strategy(urls)``.
    """

    def __init__(self, urls: Sequence[str]) -> None:
        """Raise ``ConfigurationError`` when ``urls`` is empty."""

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

    The entry point (named after the URL scheme; with ``+``, as for transports) names a class
    instantiated as ``Backend(url, settings)``. The app builds one per process (a forked child
    builds its own on first use), but an instance made before a ``fork`` must work in the child
    too: there it opens connections of its own and leaves the parent's alone, so the parent's
    instance keeps working whatever the child does, :meth:`close` included.

    **Where it runs.** :meth:`store_result` is called

    - in the process and thread that ran the task: a prefork child, one of several pool threads
      at once (the threads pool), or the worker's main thread (solo);
    - in the worker's main process for what it decides itself: a task revoked or expired before
      it ran (REVOKED), a message it refused (FAILURE with ``NotRegistered``, ``DecodeError``,
      ...), a task stopped by its hard time limit or a lost process;
    - in clients, never: they only read, wait, subscribe and forget.

    So every method must be safe to call from several threads at once.

    **Format.** The stored meta is ``{"status", "result", "traceback", "children", "date_done",
    "task_id"}`` plus ``group_id``/``parent_id`` when the request has them and, with the
    ``result_extended`` setting, ``name``, ``args``, ``kwargs``, ``worker``, ``retries`` and
    ``queue`` (:func:`worker_core.results.meta.make_meta` builds it). It is serialized as Celery
    serializes it: with the ``result_serializer`` setting (kombu's JSON by default, so
    datetimes, UUIDs, Decimals and bytes round-trip; also msgpack, yaml, pickle, or any
    serializer registered with kombu), or the serializer ``store_result`` is given (a task's own
    ``result_serializer``), so a Celery client with the same ``result_serializer`` reads it;
    reads accept the formats ``result_accept_content`` (else ``accept_content``) allows, and JSON.
    :class:`worker_core.results.codec.ResultCodec` does both. ``result`` arrives already encoded:
    a plain value, or for FAILURE, RETRY and REVOKED the exception as ``{"exc_type",
    "exc_message", "exc_module"}`` (:func:`worker_core.results.meta.encode_exception`), whatever
    the serializer.

    **Waiting.** :meth:`wait_for` must raise :class:`worker_core.exceptions.ResultTimeout` (a
    ``TimeoutError``) once ``timeout`` passes, saying which task and its last state.

    **Optional capabilities**: :class:`SuccessIsFinal`, :class:`DiscardsResults`,
    :class:`SavesGroups`, :class:`JoinsChords`, :class:`RepliesToSender`,
    :class:`BackendCountsDeliveries`.

    The contract suite in :mod:`worker_core.testing.result_backend_contract` checks all of this.
    """

    def __init__(self, url: str, settings: Settings) -> None:
        """Check the URL and the ``result_*`` settings without connecting; raise
        ``ConfigurationError`` naming what is wrong."""

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
        """Save the task's meta (see **Format**), replacing what was stored for ``task_id``.

        ``state`` is one of Celery's states (STARTED, RETRY, SUCCESS, FAILURE, REVOKED, ...) or
        a state of the task's own (``update_state(state="PROGRESS")``).
        ``request`` is ``None`` (a revoke), ``{"task": name}`` (a refused message, with its
        ``reply_to`` and ``correlation_id`` properties when it has them) or, for a task that
        ran, its message fields by name: ``task``, ``id``, ``args``, ``kwargs``, ``retries``,
        ``eta``, ``expires``, ``timelimit``, ``root_id``, ``parent_id``, ``group``,
        ``group_index``, ``origin``, ``hostname``, ``reply_to``, ``correlation_id``,
        ``delivery_info``, ``ignore_result``, ``shadow`` and ``headers``
        (:data:`worker_core.app.context.MESSAGE_FIELDS`). ``serializer`` is the task's own
        ``result_serializer``; it is passed only when the task has one, and None means the
        ``result_serializer`` setting. Raise ``ResultError`` when it cannot be stored.
        """

    def get_task_meta(self, task_id: str) -> Mapping[str, Any]:
        """The stored meta, or ``{"status": "PENDING", "result": None, ...}`` when there is none."""

    def wait_for(
        self, task_id: str, timeout: float | None = None, interval: float = 0.5
    ) -> Mapping[str, Any]:
        """Block until the task is ready (SUCCESS, FAILURE or REVOKED) and return its meta; raise
        ``ResultTimeout`` after ``timeout`` seconds. ``interval`` bounds the pause between two
        reads for backends that poll."""

    def on_task_call(self, task_id: str) -> None:
        """Called by the client just before it publishes the task (to subscribe early, so a
        result stored at once cannot be missed)."""

    def forget(self, task_id: str) -> None:
        """Delete a stored result; reading it then gives PENDING."""

    def close(self) -> None:
        """Release connections; the backend may be used again afterwards (it reconnects)."""


@runtime_checkable
class SuccessIsFinal(Protocol):
    """A result backend on which a stored SUCCESS is never replaced, as in Celery: a duplicate
    run of a task (redelivered under at-least-once delivery) cannot turn it into a FAILURE.

    Declared with ``success_is_final = True`` (``False`` means the same as leaving it out); test
    for it with ``isinstance(backend, SuccessIsFinal) and backend.success_is_final``. The result
    backend contract suite checks the promise; without it, the last store wins.
    """

    success_is_final: ClassVar[bool]


@runtime_checkable
class DiscardsResults(Protocol):
    """A result backend that keeps nothing (``disabled``): :meth:`ResultBackend.store_result`
    accepts every call and stores nothing, and :meth:`~ResultBackend.get_task_meta` and
    :meth:`~ResultBackend.wait_for` raise ``BackendDisabled`` saying how to configure one.

    Declared with ``discards_results = True``; test for it with ``isinstance(backend,
    DiscardsResults) and backend.discards_results``. The worker need not store anything for such
    a backend, and the contract suite checks this promise instead of the round trips.
    """

    discards_results: ClassVar[bool]


@runtime_checkable
class SavesGroups(Protocol):
    """A result backend that keeps a group's result (its id and its tasks' ids) for later, as
    Celery's ``GroupResult.save()``/``restore()``/``delete()`` do.

    ``result`` is Celery's result tuple of the group, as plain lists:
    ``[[group_id, parent], [child, ...]]``, where each child is ``[[task_id, parent], None]`` for
    a task (``parent`` the same form, or None) or a group's tuple for a group. Stored as Celery
    stores it, ``{"result": result}`` in kombu JSON (Redis: ``celery-taskset-meta-<group_id>``,
    kept ``result_expires`` and published on a channel of the same name), so a Celery client
    restores what this one saved and the reverse.

    Without it, ``GroupResult.save()`` and ``GroupResult.restore()`` raise ``ConfigurationError``
    naming the backend and what to configure. The contract suite checks it when offered.
    """

    def save_group(self, group_id: str, result: Any) -> None:
        """Store ``result`` (the group's tuple, above) under ``group_id``, replacing what was
        there. Raise ``ResultError`` when it cannot be stored."""

    def restore_group(self, group_id: str) -> Any | None:
        """The tuple saved under ``group_id`` (lists, as JSON gives them back), or None when
        nothing is saved there."""

    def delete_group(self, group_id: str) -> None:
        """Delete what is saved under ``group_id``; an unknown id is no error."""


@runtime_checkable
class BackendCountsDeliveries(Protocol):
    """A result backend that keeps counters: the poison cap counts there when the transport does
    not (:class:`CountsDeliveries`), so ``worker_redelivery_limit`` holds for every pool on a
    RabbitMQ classic queue too (a quorum queue counts on the broker).

    Called in the worker's main process just before a message the broker delivered again goes to
    the pool. Test for it with ``isinstance(backend, BackendCountsDeliveries)``.
    """

    def count_delivery(self, key: str, expires: float) -> int:
        """Add one to the counter ``key`` (0 when it does not exist) and return the new value,
        atomically across processes and hosts; the counter is forgotten ``expires`` seconds after
        its last count. Raise on any failure, at once (no retries: the worker waits on it)."""


@attrs.frozen
class ChordCount:
    """What :meth:`JoinsChords.count_chord_part` found once it recorded a header task's result."""

    #: header results recorded so far; -1 when the chord was completed already (nothing recorded)
    ready: int
    #: results the body waits for (the size set by the client plus those ``add_to_chord`` added),
    #: None while no size is known (not set yet, or dropped after the chord failed)
    expected: int | None
    #: set when this call completed the chord and so claimed sending its body: the token to give
    #: :meth:`JoinsChords.finish_chord`; None for every other call
    claim: str | None = None


@runtime_checkable
class JoinsChords(Protocol):
    """A result backend that joins a chord's header natively, as Celery's Redis backend does:
    header results are counted as they are stored, and the worker storing the last one sends the
    body. Without it, a chord is joined by Celery's ``celery.chord_unlock`` task, which polls the
    header's results every ``result_chord_retry_interval`` seconds.

    **Client side**, when a chord is sent, in this order: :meth:`apply_chord` once the header's
    tasks have their ids, then, just before the header's last task is sent,
    :meth:`set_chord_size` with the number of results the body waits for (as Celery's client
    does, so a header task that finishes early cannot see a complete chord).

    **Worker side**, in the process that ran a header task, after its result is stored:
    :meth:`count_chord_part`; the one call that completes the chord gets a claim, reads the
    results with :meth:`chord_parts`, sends the body (or fails it with ``ChordError``) and
    calls :meth:`finish_chord`. A task joining a running chord (``add_to_chord``, ``replace``)
    calls :meth:`add_to_chord` first.

    **At least once.** A header task delivered again (a worker killed before acknowledging it)
    is counted once: its part is recorded once per task id and ``group_index``. The claim is
    taken atomically with the count, so two workers storing the last parts at once cannot both
    send the body, and it lapses after ``claim_seconds`` so that a worker killed between the
    claim and the send leaves the body to the next copy of a header task; after
    :meth:`finish_chord`, late copies change nothing.

    On Redis these are Celery's own keys and steps (``<group key>.s`` the size, ``.t`` what was
    added, ``.j`` the results as ``[1, task_id, state, result]`` in a sorted set scored by
    ``group_index``, or a list with the transport option ``result_chord_ordered=False``, ``.d``
    the parts recorded, ``.c`` the claim, then ``done``), so Celery clients and workers and this
    worker count the same chords. The contract suite checks all of it when offered.
    """

    def apply_chord(self, group_id: str, header: Any) -> None:
        """Prepare the join of the chord whose header is the group ``group_id``; ``header`` is
        its result tuple (see :class:`SavesGroups`). A backend that joins the results it
        counted as they came in keeps nothing here, except for a header holding groups of its
        own, whose shape it must keep to give the body nested lists (saved as a group, which
        :class:`SavesGroups`'s ``restore_group`` gives back)."""

    def set_chord_size(self, group_id: str, size: int) -> None:
        """Record that the chord of header ``group_id`` waits for ``size`` results, starting a
        new count (sending a frozen chord again reuses its group id)."""

    def add_to_chord(self, group_id: str, count: int = 1) -> None:
        """The running chord of header ``group_id`` waits for ``count`` more results (a task
        added to it while it runs)."""

    def count_chord_part(self, group_id: str, task_id: str, group_index: int | None, state: str,
                         result: Any, *, claim_seconds: float) -> ChordCount:
        """Record the result of header task ``task_id`` (at ``group_index``; None sorts last):
        its ``state`` and its ``result``, encoded as :meth:`ResultBackend.store_result` gets
        it. Keep the chord's state ``result_chord_expires`` seconds from now (``result_expires``
        when unset). When the results recorded reach the size plus what was added, and no claim
        is held, claim sending the body for ``claim_seconds`` and return the claim."""

    def chord_parts(self, group_id: str) -> list[tuple[str, str, Any]]:
        """The recorded results of the header as ``(task_id, state, result)``, ordered by
        ``group_index`` (in the order they were recorded when the backend is told not to
        order them)."""

    def finish_chord(self, group_id: str, claim: str, *, sent: bool) -> bool:
        """After the body was sent (``sent``): if ``claim`` is still held, delete the chord's
        state and remember for a while that it is done, so later copies of header tasks change
        nothing. After the chord failed (not ``sent``): drop its size, so a later copy of a
        header task does not fail it again. Returns False when the claim was lost."""


@runtime_checkable
class RepliesToSender(Protocol):
    """A result backend that keeps nothing itself but sends each state of a task as a message to
    the client that sent the task, on the queue the task's message names in ``reply_to``, as
    Celery's ``rpc://`` backend does: one client reads its own results.

    **Client side.** Each thread of each process is one client: :meth:`reply_to` names its
    reply queue, and the app puts that name in the ``reply_to`` of every task message it sends
    (as ``thread_oid``, which Celery's client puts there). :meth:`~ResultBackend.on_task_call`
    declares the queue before a task is sent, so no state is lost (not for a task sent by a task
    a worker runs: nobody reads a worker's queue, and Celery's prefork children declare none);
    what arrives for tasks not yet asked about is kept until they are.
    :meth:`~ResultBackend.get_task_meta` and :meth:`~ResultBackend.wait_for` read only this
    thread's queue: a task another client (a thread, a process) sent reads PENDING here, and
    waiting for it ends in ``ResultTimeout``. :meth:`~ResultBackend.forget` drops what this
    client received (nothing is stored anywhere else). States arrive when the broker delivers
    them, so a read just after a store may still see the state before it.

    **Worker side.** :meth:`~ResultBackend.store_result` publishes to the ``reply_to`` of the
    ``request`` it is given, with its ``correlation_id``; a request without one (a revoke with
    no message, a task sent by a client that does not ask for replies) sends nothing. So the
    worker passes a refused message's ``reply_to`` and ``correlation_id`` with its task name,
    and does not look up or store states of tasks it has no message for.

    **Canvas.** Such a backend cannot save groups, and a chord is refused before anything is
    sent, as in Celery: the header's results go to the client, so no worker can join them.

    The contract suite checks these backends with each result sent to the reading client's
    queue, waiting for states to arrive, and for what only the sending client can read.
    """

    def reply_to(self) -> str:
        """The name of the queue the calling thread receives its results on (the same name for
        the thread's whole life in this process; another one in a forked child)."""


# ---------------------------------------------------------------------------------------------
# App loader
# ---------------------------------------------------------------------------------------------


@runtime_checkable
class AppLoader(Protocol):
    """Runs the app of another framework that ``-A`` names (a ``celery.Celery`` app, say), so a
    project keeps its code and this worker runs it.

    Asked only when ``-A`` names no :class:`~worker_core.App`: the core imports the module
    ``-A`` names first (so a module that fails to import is reported as such), then asks each
    installed loader in turn, by name, whether the spec names an app it adapts. The entry point
    (group ``worker.app_loaders``, named after the framework) names a class whose class methods
    are called; it is never instantiated.

    The app a loader returns is an :class:`~worker_core.App` (its settings translated, its tasks
    listed in ``tasks`` with the options the worker reads: ``acks_late``, time limits, ...), and
    usually a :class:`ForeignApp` too, so its tasks run through the framework's own machinery.
    """

    #: what this loader adapts, in words, for messages: ``"a celery.Celery app"``
    adapts: ClassVar[str]

    @classmethod
    def load(cls, spec: str) -> App | None:
        """The app ``spec`` (``module``, ``module.sub`` or ``module:attribute``, as ``-A`` takes
        it) names, adapted, or None when it names nothing this loader adapts. Raise
        ``ConfigurationError`` when it names such an app that cannot run here, saying why."""


@runtime_checkable
class ForeignApp(Protocol):
    """An app an :class:`AppLoader` adapted, whose tasks run through its framework's machinery.

    Read once per consumer start, never per message: without it, every message becomes a
    :class:`~worker_core.request.Request` run by :func:`worker_core.execution.execute`.
    """

    #: what the consumer makes of each decoded message: a subclass of
    #: :class:`~worker_core.request.Request` (same constructor) whose ``execute_using_pool`` hands
    #: the pool the framework's executor (which returns a :class:`~worker_core.results.Outcome`),
    #: and whose ``store(outcome)`` records the states the worker decides itself (revoked, lost
    #: process, time limit) through the framework's result backend
    request_class: ClassVar[type[Any]]

    def worker_defaults(self, defaults: WorkerOptions) -> WorkerOptions:
        """The worker options this app's own configuration gives, before the command line
        (which wins): ``defaults`` are those the translated settings give; change what the
        framework's configuration says beyond them (the queues to consume, ...)."""


@runtime_checkable
class ListsConfiguration(Protocol):
    """An adapted app whose framework keeps a configuration of its own (a Celery app's
    ``app.conf``): ``inspect conf`` and ``inspect report`` list that configuration, as the
    framework's own worker would, instead of this project's settings alone."""

    def configuration(self, with_defaults: bool) -> Mapping[str, Any]:
        """The configuration as the framework's worker lists it: the values set (every one
        ``with_defaults``), the settings of this worker that the framework lacks, and where the
        worker runs with another value than the framework's configuration says (a command-line
        option, a ``WORKER_*`` variable), the worker's; JSON-able, secrets hidden."""


# ---------------------------------------------------------------------------------------------
# Which Protocols belong to which slot
# ---------------------------------------------------------------------------------------------

#: The required interface of each slot (the keys of :data:`worker_core.plugins.SLOT_GROUPS`).
REQUIRED: Mapping[str, type] = {
    "pool": Pool,
    "transport": Transport,
    "loop": EventLoop,
    "autoscaler": Autoscaler,
    "failover": FailoverStrategy,
    "result_backend": ResultBackend,
    "app_loader": AppLoader,
}

#: The optional capabilities each slot's implementations may offer.
CAPABILITIES: Mapping[str, tuple[type, ...]] = {
    "pool": (FixedConcurrency, WithdrawsQueuedJobs, SharesOneQueue, WithdrawsOneJob, StopsOneJob,
             RestartsProcesses),
    "transport": (AcksSurviveReconnect, LeasesMessages, OffersResultBackend, CountsDeliveries,
                  FansOutEvents, BuffersDeliveries, AdoptsQueues, DelaysOnBroker, RewritesUrls,
                  ElectsLeaders, KeepsRecords, ReportsRefusals, TellsTime,
                  ExplainsConnectFailures, OrdersByPriority),
    "loop": (),
    "autoscaler": (),
    "failover": (),
    "result_backend": (SuccessIsFinal, DiscardsResults, SavesGroups, JoinsChords, RepliesToSender,
                       BackendCountsDeliveries),
    "app_loader": (),
}
