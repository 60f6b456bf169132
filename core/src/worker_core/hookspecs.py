"""Every hook a plugin can implement, with when it is called, its arguments and its result.

A plugin is a module (or object) named by an entry point in the ``worker.plugins`` group whose
functions are marked with :data:`hookimpl`. Implement only the hooks you need, with only the
arguments you need (pluggy passes arguments by name).

Failure policy: *contribution* and *validation* hooks propagate errors (the command stops with a
message naming the plugin); *observer* hooks (lifecycle and task events) are isolated per plugin:
an error is logged with the plugin's name and the other plugins still run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from .bootsteps.step import Step
    from .options import OptionSpec, WorkerOptions

PROJECT = "worker"

#: Marks a hook specification (used only in this module). pluggy never calls a specification, so
#: the ones that declare a return value have only a docstring (hence ``type: ignore[empty-body]``).
hookspec = pluggy.HookspecMarker(PROJECT)

#: Marks a hook implementation in a plugin: ``@hookimpl def worker_bootsteps(blueprint): ...``
hookimpl = pluggy.HookimplMarker(PROJECT)


# ---------------------------------------------------------------------------------------------
# Contribution: bootsteps and options
# ---------------------------------------------------------------------------------------------


@hookspec
def worker_bootsteps(blueprint: str) -> Sequence[Step[Any]]:  # type: ignore[empty-body]
    """Contribute bootsteps to a blueprint.

    Called once per blueprint when the worker (or ``workerctl steps``) resolves the graph, before
    anything starts.

    :param blueprint: ``"worker"`` for the worker-level blueprint (Timer, Hub, Pool, Autoscaler,
        Consumer) or ``"consumer"`` for the consumer-level blueprint (Connection, Control, Tasks,
        event loop), which is restarted after every lost connection.
    :return: the steps this plugin adds to that blueprint (an empty sequence for none). Steps name
        the steps they need in ``requires`` (hard) or ``after`` (ordering only); the names may
        belong to any plugin and are checked before anything starts.
    """


@hookspec
def worker_options() -> Sequence[OptionSpec]:  # type: ignore[empty-body]
    """Declare options of this plugin.

    Called when ``workerctl worker`` or ``workerctl steps`` builds its command line, so the
    options appear in ``--help``. Each option's value is the first of:

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

    :return: option specifications. Their values are in ``WorkerOptions.extra`` under each
        option's name.
    """


@hookspec
def worker_validate_options(options: WorkerOptions) -> None:
    """Check the fully parsed options before anything starts.

    Called after the command line, settings and environment are merged, before the bootstep
    graph is resolved.

    :param options: the parsed, frozen worker options.
    :raise ConfigurationError: with a message naming the option, the value received and the fix.
    """


# ---------------------------------------------------------------------------------------------
# Lifecycle (observers)
# ---------------------------------------------------------------------------------------------


@hookspec
def worker_init(worker: Any) -> None:
    """The worker object exists and its options are final; no step has started yet."""


@hookspec
def worker_ready(worker: Any) -> None:
    """Every step has started and the consumer is taking messages."""


@hookspec
def worker_shutdown(worker: Any, how: str) -> None:
    """The worker is stopping.

    :param how: ``"warm"`` (running tasks finish) or ``"cold"`` (running tasks are abandoned and
        their messages given back to the broker when they are not acknowledged yet).
    """


@hookspec
def worker_process_init(pid: int) -> None:
    """A pool process or thread was started and is about to take jobs.

    Called inside the new child process (prefork) or once per thread (threads pool). Use it to
    open per-process resources such as database connections.
    """


# ---------------------------------------------------------------------------------------------
# Task events (observers), in the order they happen to one message
# ---------------------------------------------------------------------------------------------


@hookspec
def task_received(request: Any) -> None:
    """A task message was decoded and accepted for this worker (it may wait for its ETA)."""


@hookspec
def task_started(request: Any, pid: int) -> None:
    """An executor picked the task up; ``pid`` is the process that runs it."""


@hookspec
def task_succeeded(request: Any, runtime: float, result: str | None) -> None:
    """The task returned normally after ``runtime`` seconds; ``result`` is the repr of what it
    returned, when the worker logs it (level INFO) or sends task events, else None."""


@hookspec
def task_failed(request: Any, exc_type: str, exc_message: str, runtime: float, exception: str,
                traceback: str) -> None:
    """The task raised, timed out, or lost its process; ``exception`` is the exception's repr,
    ``traceback`` the task's own (empty when it did not raise)."""


@hookspec
def task_retried(request: Any, reason: str) -> None:
    """The task asked to be retried; a new message was published."""


@hookspec
def task_rejected(request: Any, reason: str, requeue: bool) -> None:
    """A message was rejected: malformed, unknown task, refused content, or ``Reject`` raised.

    ``request`` is ``None`` when the message could not be decoded far enough to build one.
    """


@hookspec
def task_revoked(request: Any, reason: str) -> None:
    """The task will not run: it expired before it started, or was revoked."""


# ---------------------------------------------------------------------------------------------
# What slots need from their neighbours
# ---------------------------------------------------------------------------------------------


@hookspec
def worker_control_commands() -> Mapping[str, Any]:  # type: ignore[empty-body]
    """Contribute remote-control commands (``workerctl control NAME``).

    :return: a mapping of command name to a callable ``handler(worker, **arguments) -> reply``.
        Names must not collide with another plugin's; a collision is an error naming both.
    """
