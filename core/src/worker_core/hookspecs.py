"""Every hook a plugin can implement: when it is called, in which process and thread, with what,
and what its result means.

A plugin is a module (or object) whose functions are marked with :data:`hookimpl`, named by an
entry point in the ``worker.plugins`` group, or registered by app code with
``app.register_hooks(obj)`` (or one function at a time with ``@app.hook``), as Celery users
connect signals in their tasks module. Implement only the hooks you need, with only the
arguments you need: pluggy passes arguments by name.

Hooks are called through pluggy's hook caller, so ``tryfirst``, ``trylast``, ``wrapper=True``
(and the old ``hookwrapper=True``) and ``firstresult`` mean what pluggy documents: wrappers run
around the others, then ``tryfirst`` implementations, the plain ones (the last registered
first), then ``trylast`` ones.

Failure policy, by kind of hook:

- *contribution* and *validation* hooks (steps, options, commands, checks): an error stops the
  command with a message naming the plugin and the hook;
- *observer* hooks (the lifecycle, task and publish events): each plain implementation is
  isolated: one that raises is logged with its plugin's and the hook's name, the others still
  run and so does the worker. Wrappers are not isolated: they run around the others and answer
  for what they do.

Processes and threads: the **main process** is the one ``workerctl worker`` started; its
**loop thread** runs the event loop (the broker, acknowledgements, remote control). Tasks run in
an **executor**: a prefork child process, a pool thread, or the loop thread itself with the solo
pool. A **client** is any process that sends tasks (the app's ``delay``/``apply_async``/
``send_task``, ``workerctl call``, a task that retries or sends another).

One module by design: every hook is specified in one place a plugin author reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

import attrs
import pluggy

if TYPE_CHECKING:
    from .app.context import TaskContext
    from .app.task import Task
    from .bootsteps.step import Step
    from .options import OptionSpec, WorkerOptions
    from .request import Request
    from .worker.worker import Worker

__all__ = ["CONTRIBUTION_HOOKS", "OBSERVER_HOOKS", "PROJECT", "Gauge", "hookimpl", "hookspec"]

PROJECT = "worker"

#: Marks a hook specification (used only in this module). pluggy never calls a specification, so
#: the ones that declare a return value have only a docstring (hence ``type: ignore[empty-body]``).
hookspec = pluggy.HookspecMarker(PROJECT)

#: Marks a hook implementation: ``@hookimpl def worker_bootsteps(blueprint): ...``, with pluggy's
#: options (``@hookimpl(tryfirst=True)``, ``@hookimpl(wrapper=True)``).
hookimpl = pluggy.HookimplMarker(PROJECT)


@attrs.frozen
class Gauge:
    """One value a plugin adds to the worker's metrics (:func:`worker_gauges`):
    ``Gauge("worker_beat_leader", "1 while this worker sends the periodic tasks.", 1.0)``."""

    #: the metric's name (Prometheus's rules: letters, digits and ``_``)
    name: str
    #: one line saying what it measures
    help: str
    value: float
    #: label names and values (``hostname`` is added for the worker)
    labels: Mapping[str, str] = attrs.field(factory=dict)


# ---------------------------------------------------------------------------------------------
# Contribution and validation (errors stop the command)
# ---------------------------------------------------------------------------------------------


@hookspec
def worker_bootsteps(blueprint: str) -> Sequence[Step[Any]]:  # type: ignore[empty-body]
    """Contribute bootsteps to a blueprint.

    Called once per blueprint when the worker (or ``workerctl steps``) resolves the graph, before
    anything starts, in the main process.

    :param blueprint: ``"worker"`` for the worker-level blueprint (Timer, Hub, Pool, Autoscaler,
        Consumer) or ``"consumer"`` for the consumer-level blueprint (Connection, Failback,
        Events, Heart, Tasks, Control, event loop), which is restarted after every lost connection.
    :return: the steps this plugin adds to that blueprint (an empty sequence for none). Steps name
        the steps they need in ``requires`` (hard) or ``after`` (ordering only); the names may
        belong to any plugin and are checked before anything starts.

    Not first-result: every plugin's result is gathered, with the plugin that returned it.
    """


@hookspec
def worker_options() -> Sequence[OptionSpec]:  # type: ignore[empty-body]
    """Declare this plugin's options.

    Called when ``workerctl worker`` or ``workerctl steps`` builds its command line, in the
    ``workerctl`` process, so the options appear in ``--help``. Each option's value is the first
    of:

    1. its flag on the command line: ``--liveness-file /tmp/alive``;
    2. the variable ``WORKER_<NAME>``, the option's name upper-cased:
       ``WORKER_LIVENESS_FILE=/tmp/alive`` (a flag option takes 1/0, true/false, yes/no or
       on/off; an empty variable gives the default);
    3. the setting ``worker_plugin_options``, a mapping of option name to value:
       ``app.conf.worker_plugin_options = {"liveness_file": "/tmp/alive"}``, or the variable
       ``WORKER_WORKER_PLUGIN_OPTIONS`` holding a JSON object (a flag option takes True or
       False, any other text or a number, handed to ``convert`` as its text);
    4. the option's ``default``.

    A value from a variable or the setting goes through the option's ``convert`` as command-line
    text does; a ``ValueError`` (or ``TypeError``) it raises stops the worker before anything
    starts, with a line naming the variable or the setting, the value (hidden when the option's
    name says it is a secret) and the option. A name in ``worker_plugin_options`` that no loaded
    plugin declares stops it too, listing the declared names. An option named after a setting
    (whose variable would be that setting's) is refused.

    :return: option specifications. Each option's value ends up in ``WorkerOptions.extra`` under
        its name.

    Not first-result: every plugin's result is gathered, with the plugin that returned it.
    """


@hookspec
def worker_validate_options(options: WorkerOptions) -> None:
    """Check the fully parsed options before anything starts.

    Called in the main process after the command line, settings and environment are merged,
    before the bootstep graph is resolved (``workerctl steps`` too).

    :param options: the parsed, frozen worker options.
    :raise ConfigurationError: with a message naming the option, the value received and the fix.

    Not first-result: every implementation is called; raising stops the command.
    """


@hookspec
def worker_control_commands() -> Mapping[str, Any]:  # type: ignore[empty-body]
    """Contribute remote-control commands (``workerctl inspect NAME`` / ``workerctl control NAME``,
    Celery's ``app.control.inspect()._request(NAME)`` / ``app.control.broadcast(NAME)``).

    Called in the main process before the worker starts (the allow-list is checked against
    them), when the Control step starts, and by ``workerctl inspect``/``control`` to parse a
    command that is not built in; the handlers run in the loop thread.

    :return: a list of :class:`worker_core.ControlCommand` (name, handler, kind ``inspect`` or
        ``control``, typed arguments, help), or a mapping of command name to a callable
        ``handler(worker, **arguments) -> reply`` (a ``control`` command without arguments on the
        command line). Names must not collide with another plugin's, a built-in command's or
        ``inspect``/``control``; a collision is an error naming both.

    Not first-result: every plugin's result is gathered, with the plugin that returned it.
    """


@hookspec
def workerctl_commands() -> Mapping[str, Any]:  # type: ignore[empty-body]
    """Contribute commands to ``workerctl`` (``workerctl beat``, say), as ``click`` commands.

    Called in the ``workerctl`` process when a command that is not built in is asked for, and
    for ``workerctl --help`` (so keep the module that defines the commands light, or import the
    rest inside them). The command's own arguments ``-p no:NAME`` and ``WORKER_DISABLE_PLUGINS``
    block plugins as for ``workerctl worker``.

    :return: a mapping of command name to a ``click.Command``. A name taken by a built-in
        command or another plugin's is an error naming both.

    Not first-result: every plugin's result is gathered, with the plugin that returned it.
    """


@hookspec
def worker_gauges(worker: Worker) -> Sequence[Gauge]:  # type: ignore[empty-body]
    """Contribute gauges to the worker's metrics (``worker-metrics-prometheus`` serves them with
    its own, each with a ``hostname`` label added).

    Called in the main process, in the metrics server's thread, each time the metrics are read
    (a Prometheus scrape): read what the plugin keeps, briefly, without waiting on the broker.
    An implementation that raises is logged and its gauges are left out of that reading.

    :param worker: the running worker
    :return: :class:`Gauge` values; gauges of one name share their help and label names.

    Not first-result: every plugin's result is gathered, with the plugin that returned it.
    """


# ---------------------------------------------------------------------------------------------
# Lifecycle (observers)
# ---------------------------------------------------------------------------------------------


@hookspec
def worker_init(worker: Worker) -> None:
    """The worker object exists and its options are final; no step has started yet.

    Main process, main thread.

    :param worker: the :class:`~worker_core.worker.worker.Worker` (``options``, ``app``, ``stash``,
        ``plugins``)

    Not first-result: every implementation is called; what it returns is ignored.
    """


@hookspec
def worker_ready(worker: Worker) -> None:
    """Every step has started and the consumer takes messages. Main process, loop thread.

    :param worker: the running worker (its ``pool`` and ``consumer`` are set)

    Not first-result: every implementation is called; what it returns is ignored.
    """


@hookspec
def worker_shutting_down(worker: Worker, how: str) -> None:
    """A stop was asked for (SIGTERM, Ctrl-C, SIGQUIT, a remote ``shutdown``): the worker stops
    consuming now and, warm, waits for its running tasks. Called once per kind of stop asked
    (``"warm"``, then ``"cold"`` if a cold stop follows). Main process, in the thread that asked:
    the main thread's signal handler, or the loop thread for a remote command; keep it short.

    :param worker: the worker
    :param how: ``"warm"`` or ``"cold"``

    Not first-result: every implementation is called; what it returns is ignored.
    """


@hookspec
def heartbeat_sent(worker: Worker, event: str) -> None:
    """A worker event went to the monitors: ``worker-online``, each ``worker-heartbeat`` (every
    ``--heartbeat-interval`` seconds) and ``worker-offline``, as Celery's ``heartbeat_sent``.
    Main process, loop thread.

    :param worker: the worker
    :param event: the event's type

    Not first-result: every implementation is called; what it returns is ignored.
    """


@hookspec
def broker_refused(worker: Worker, reason: str) -> None:
    """The broker started refusing work on a connection that still works: full (Redis out of
    memory), read-only, busy, or blocking the connection (a RabbitMQ memory or disk alarm). The
    worker takes no new task until :func:`broker_accepted`; a readiness probe should say "not
    ready" meanwhile (:meth:`Worker.broker_state <worker_core.worker.worker.Worker.broker_state>`
    tells the same at any time). Called once per episode. Main process, loop thread.

    :param worker: the worker
    :param reason: what the broker refuses and why, in words (``"Redis refuses work: out of
        memory (used memory > maxmemory)"``)

    Not first-result: every implementation is called; what it returns is ignored.
    """


@hookspec
def broker_accepted(worker: Worker, reason: str, seconds: float) -> None:
    """The broker takes work again after :func:`broker_refused`. Main process, loop thread.

    :param worker: the worker
    :param reason: what :func:`broker_refused` said
    :param seconds: how long the refusal lasted

    Not first-result: every implementation is called; what it returns is ignored.
    """


@hookspec
def worker_shutdown(worker: Worker, how: str) -> None:
    """The worker is stopping; its steps stop next. Main process, main thread.

    :param how: ``"warm"`` (running tasks finish) or ``"cold"`` (running tasks are abandoned and
        their messages given back to the broker when they are not acknowledged yet).

    Not first-result: every implementation is called; what it returns is ignored.
    """


@hookspec
def worker_stopped(worker: Worker, how: str) -> None:
    """Every step has stopped: the consumer, the pool (its processes have ended) and the timer;
    the worker's process exits next. Main process, main thread. Called only when
    :func:`worker_shutdown` was (the worker had started).

    :param worker: the worker (its steps stopped)
    :param how: ``"warm"`` or ``"cold"``, as for :func:`worker_shutdown`

    Not first-result: every implementation is called; what it returns is ignored.
    """


@hookspec
def worker_process_init(pid: int) -> None:
    """An executor is about to take its first job: open per-process resources here (database
    connections, tracer providers).

    Called inside each new prefork child (after the fork, before its first job), in each new
    thread of the threads pool (in that thread), and once in the main process when the solo
    pool starts.

    :param pid: the process the executor lives in.

    Not first-result: every implementation is called; what it returns is ignored.
    """


@hookspec
def worker_process_shutdown(pid: int, exitcode: int) -> None:
    """An executor takes no more jobs: close what :func:`worker_process_init` opened.

    Called inside each prefork child as it exits (recycled after ``--max-tasks-per-child`` or
    ``--max-memory-per-child``, shrunk, or the pool stopping), in each thread of the threads pool
    as it ends, and in the main process when the solo pool stops. Not called for a process that
    was killed (by a signal, a hard time limit or ``terminate``).

    :param exitcode: the exit status the process ends with (0 for a thread or the solo pool).

    Not first-result: every implementation is called; what it returns is ignored.
    """


# ---------------------------------------------------------------------------------------------
# Task events in the worker (observers, main process, loop thread), in the order they happen
# ---------------------------------------------------------------------------------------------


@hookspec
def task_received(request: Request) -> None:
    """A task message was decoded and accepted for this worker (it may wait for its ETA).

    Main process, loop thread.

    :param request: the :class:`~worker_core.request.Request`: ``id``, ``name``, ``envelope`` (the decoded
        message), ``message``

    Not first-result: every implementation is called; what it returns is ignored.
    """


@hookspec
def task_started(request: Request, pid: int) -> None:
    """An executor picked the task up; ``pid`` is the process that runs it.

    Main process, loop thread.

    :param request: the :class:`~worker_core.request.Request`: ``id``, ``name``, ``envelope`` (the decoded
        message), ``message``
    :param pid: the process the executor runs in

    Not first-result: every implementation is called; what it returns is ignored.
    """


@hookspec
def task_succeeded(request: Request, runtime: float, result: str | None) -> None:
    """The task returned normally after ``runtime`` seconds; ``result`` is the repr of what it
    returned (while someone implements this hook or the worker logs at INFO), else None.

    Main process, loop thread.

    :param request: the :class:`~worker_core.request.Request`: ``id``, ``name``, ``envelope`` (the decoded
        message), ``message``
    :param runtime: seconds the task ran
    :param result: the repr of its return value, or None

    Not first-result: every implementation is called; what it returns is ignored.
    """


@hookspec
def task_failed(request: Request, exception: BaseException, exc_type: str, exc_message: str, runtime: float,
                traceback: str) -> None:
    """The task raised, timed out, or lost its process.

    Main process, loop thread.

    :param request: the :class:`~worker_core.request.Request`: ``id``, ``name``, ``envelope`` (the decoded
        message), ``message``
    :param exception: the exception itself: what the task raised (sent over from the pool's
        process; one that cannot make the trip arrives as an
        :class:`~worker_core.exceptions.UnpicklableError` standing in for it, with its class's
        name, its message and its repr), or the ``TimeLimitExceeded``/``WorkerLostError`` the
        worker decided
    :param exc_type: the class name of the exception (of the one a stand-in stands for)
    :param exc_message: its message, ``str(exception)``
    :param runtime: seconds the task ran (0 when its process died)
    :param traceback: the task's formatted traceback, or ``""`` (it did not raise where it ran)

    Not first-result: every implementation is called; what it returns is ignored.
    """


@hookspec
def task_retried(request: Request, reason: str) -> None:
    """The task asked to be retried; a new message was published.

    Main process, loop thread.

    :param request: the :class:`~worker_core.request.Request`: ``id``, ``name``, ``envelope`` (the decoded
        message), ``message``
    :param reason: why, as text

    Not first-result: every implementation is called; what it returns is ignored.
    """


@hookspec
def task_rejected(request: Request | None, reason: str, requeue: bool) -> None:
    """A message was rejected: malformed, unknown task, refused content, or ``Reject`` raised.

    ``request`` is ``None`` when the message could not be decoded far enough to build one.

    Main process, loop thread.

    :param request: the :class:`~worker_core.request.Request`: ``id``, ``name``, ``envelope`` (the decoded
        message), ``message``, or None
    :param reason: why, as the rejection line says it
    :param requeue: whether the message goes back to the queue

    Not first-result: every implementation is called; what it returns is ignored.
    """


@hookspec
def task_revoked(request: Request, reason: str) -> None:
    """The task will not run: it expired before it started, or was revoked.

    Main process, loop thread.

    :param request: the :class:`~worker_core.request.Request`: ``id``, ``name``, ``envelope`` (the decoded
        message), ``message``
    :param reason: ``"expired"``, ``"revoked"`` or ``"terminated"``

    Not first-result: every implementation is called; what it returns is ignored.
    """


# ---------------------------------------------------------------------------------------------
# Where the task runs (observers, in the executor's process and thread), with Celery's names
# ---------------------------------------------------------------------------------------------


@hookspec
def task_prerun(task_id: str, task: Task, args: Sequence[Any], kwargs: Mapping[str, Any],
                request: TaskContext) -> None:
    """The task is about to run, in the executor that runs it (``task.request`` is set).

    :param task_id: the task's id
    :param task: the app's :class:`~worker_core.app.task.Task` (``task.name``, ``task.request``)
    :param args: its positional arguments
    :param kwargs: its keyword arguments
    :param request: the task's :class:`~worker_core.app.context.TaskContext` (what ``self.request`` holds)

    Not first-result: every implementation is called; what it returns is ignored.
    """


@hookspec
def task_postrun(task_id: str, task: Task, args: Sequence[Any], kwargs: Mapping[str, Any],
                 retval: Any, state: str, request: TaskContext) -> None:
    """The task has run, whatever its outcome, in the executor that ran it.

    :param retval: what it returned, or the exception it raised.
    :param state: ``SUCCESS``, ``FAILURE``, ``RETRY``, ``IGNORED`` or ``REJECTED``.

    :param task_id: the task's id
    :param task: the app's :class:`~worker_core.app.task.Task` (``task.name``, ``task.request``)
    :param args: its positional arguments
    :param kwargs: its keyword arguments
    :param request: the task's :class:`~worker_core.app.context.TaskContext` (what ``self.request`` holds)

    Not first-result: every implementation is called; what it returns is ignored.
    """


@hookspec
def task_success(task: Task, task_id: str, result: Any, request: TaskContext) -> None:
    """The task returned ``result``, in the executor that ran it, once its result is stored and
    its ``on_success`` handler ran (Celery's order); not when the result could not be stored or
    what follows the task could not be sent: the task fails then, with ``task_failure``.

    :param task: the app's :class:`~worker_core.app.task.Task` (``task.name``, ``task.request``)
    :param task_id: the task's id
    :param result: what it returned
    :param request: the task's :class:`~worker_core.app.context.TaskContext` (what ``self.request`` holds)

    Not first-result: every implementation is called; what it returns is ignored.
    """


@hookspec
def task_failure(task: Task, task_id: str, exception: BaseException, args: Sequence[Any],
                 kwargs: Mapping[str, Any], traceback: TracebackType | None,
                 request: TaskContext) -> None:
    """The task raised ``exception`` (the exception object, and its traceback object), or returned
    and its result could not be stored or what follows it could not be sent, in the executor that
    ran it, once FAILURE is stored and its ``on_failure`` handler ran (Celery's order). Time
    limits and lost processes are reported in the main process (:func:`task_failed`): the
    executor is gone then.

    :param task: the app's :class:`~worker_core.app.task.Task` (``task.name``, ``task.request``)
    :param task_id: the task's id
    :param exception: the exception it raised
    :param args: its positional arguments
    :param kwargs: its keyword arguments
    :param traceback: the exception's traceback object
    :param request: the task's :class:`~worker_core.app.context.TaskContext` (what ``self.request`` holds)

    Not first-result: every implementation is called; what it returns is ignored.
    """


@hookspec
def task_retry(task: Task, task_id: str, request: TaskContext, reason: BaseException,
               traceback: TracebackType | None) -> None:
    """The task asked to be retried (a new message was sent), in the executor that ran it.

    :param reason: the exception that caused the retry (``exc=``), or the ``Retry`` itself.

    :param task: the app's :class:`~worker_core.app.task.Task` (``task.name``, ``task.request``)
    :param task_id: the task's id
    :param request: the task's :class:`~worker_core.app.context.TaskContext` (what ``self.request`` holds)
    :param traceback: the reason's traceback object, or None

    Not first-result: every implementation is called; what it returns is ignored.
    """


# ---------------------------------------------------------------------------------------------
# Sending tasks (observers, in the client process and thread that sends)
# ---------------------------------------------------------------------------------------------


@hookspec
def before_task_publish(name: str, body: Any, exchange: str, routing_key: str, headers: dict[str, Any],
                        properties: dict[str, Any], declare: list[Any],
                        retry_policy: Mapping[str, Any]) -> None:
    """A task message is about to be published. ``headers`` and ``properties`` may be changed in
    place (to carry a trace context, say); what they hold then is what is sent.

    In the client process and thread that publishes (a worker's executor, for a retry).

    :param name: the task's name
    :param body: ``(args, kwargs, embed)``, not yet serialized
    :param exchange: the exchange (``""``: the default)
    :param routing_key: the routing key (the queue's name on the default exchange)
    :param headers: the protocol v2 headers (``id``, ``task``, ...): may be changed
    :param properties: the message properties (``correlation_id``, ``reply_to``, ``priority``, ...): may
        be changed
    :param declare: the entities declared before publishing
    :param retry_policy: how a failed publish is retried

    Not first-result: every implementation is called; what it returns is ignored.
    """


@hookspec
def after_task_publish(name: str, body: Any, exchange: str, routing_key: str,
                       headers: Mapping[str, Any]) -> None:
    """A task message was handed to the broker (``headers["id"]`` is the task's id).

    In the client process and thread that publishes (a worker's executor, for a retry).

    :param name: the task's name
    :param body: ``(args, kwargs, embed)``
    :param exchange: the exchange
    :param routing_key: the routing key (the queue's name on the default exchange)
    :param headers: the headers sent

    Not first-result: every implementation is called; what it returns is ignored.
    """


#: hooks whose implementations are isolated from one another (see the module's docstring)
OBSERVER_HOOKS = frozenset({
    "worker_init", "worker_ready", "worker_shutting_down", "heartbeat_sent", "broker_refused",
    "broker_accepted", "worker_shutdown",
    "worker_stopped", "worker_process_init", "worker_process_shutdown",
    "task_received", "task_started", "task_succeeded", "task_failed", "task_retried", "task_rejected",
    "task_revoked", "task_prerun", "task_postrun", "task_success", "task_failure", "task_retry",
    "before_task_publish", "after_task_publish",
})
#: hooks whose results are gathered with the plugin that returned each
CONTRIBUTION_HOOKS = frozenset({
    "worker_bootsteps", "worker_options", "worker_validate_options", "worker_control_commands",
    "workerctl_commands", "worker_gauges",
})
