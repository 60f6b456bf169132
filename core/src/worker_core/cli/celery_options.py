"""Celery's worker options that plugins bring (``-B`` comes with the beat plugin, ``-E`` with
the events plugin), and the one line each gets when nothing installed brings it, so that no
option of ``celery worker`` is ever "No such option"; and the values with no meaning here
(``-P eventlet`` without such a pool), refused with what to use instead.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import click
from click.core import ParameterSource

from ..exceptions import ConfigurationError
from ..options import Autoscale, parse_autoscale, parse_queues

if TYPE_CHECKING:
    from ..plugins.manager import PluginManager

__all__ = ["CELERY_ONLY_POOLS", "FROM_PLUGINS", "SCHEDULING_NAMES", "FromPlugin", "auto_concurrency",
           "check_disable_prefetch", "check_pool", "check_start_method", "exclude_queues",
           "parse_concurrency", "parse_worker_autoscale", "placeholders"]

#: Celery's names for the scheduling (``-O default`` is fair since Celery 4)
SCHEDULING_NAMES = {"default": "fair"}


@attrs.frozen
class FromPlugin:
    """A Celery option a plugin declares (through ``worker_options``)."""

    flags: tuple[str, ...]
    #: what it does, for the error: "-B/--beat runs the periodic-task scheduler in the worker"
    does: str
    #: the hooks plugin that declares it
    plugin: str
    #: where that plugin comes from: a path in this repository, or "worker-core" for a built-in
    source: str
    takes_value: bool = False

    def missing(self, manager: PluginManager) -> str:
        """Why the option is not there, and the fix."""
        flags = "/".join(self.flags)
        if self.plugin in manager.blocked:
            return (f"{flags} {self.does}, which the {self.plugin} plugin adds; it is blocked by "
                    f"{manager.blocked_by(self.plugin)}: remove that")
        for status in manager.statuses():
            entry = status.entry
            if entry.kind == "hooks" and entry.name == self.plugin and status.status != "loaded":
                return (f"{flags} {self.does}, which the {self.plugin} plugin adds; it {status.status}: "
                        f"{status.reason}")
        if self.source == "worker-core":
            return (f"{flags} {self.does}, which worker-core's {self.plugin} plugin adds, and it is not "
                    f"registered: pip install --force-reinstall ./core")
        return f"{flags} {self.does}, which the {self.plugin} plugin adds: pip install {self.source}"


#: Celery's worker options that come from plugins
FROM_PLUGINS: tuple[FromPlugin, ...] = (
    FromPlugin(("-B", "--beat"), "runs the periodic-task scheduler in the worker", "beat", "./plugins/beat"),
    FromPlugin(("-s", "--schedule-filename", "--schedule"), "names the periodic-task scheduler's file",
               "beat", "./plugins/beat", takes_value=True),
    FromPlugin(("--scheduler",), "chooses the periodic-task scheduler", "beat", "./plugins/beat",
               takes_value=True),
    FromPlugin(("-E", "--task-events", "--events"), "sends task events", "events", "worker-core"),
    FromPlugin(("--without-heartbeat",), "turns worker heartbeat events off", "events", "worker-core"),
    FromPlugin(("--heartbeat-interval",), "sets the seconds between worker heartbeat events", "events",
               "worker-core", takes_value=True),
)


def placeholders(taken: Iterable[str], manager: PluginManager,
                 table: Iterable[FromPlugin] = FROM_PLUGINS) -> list[click.Option]:
    """An option for each entry of ``table`` none of whose flags is ``taken`` (no plugin declared
    it): parsed as Celery parses it, and refused in one line when given."""
    taken = set(taken)
    options = []
    for entry in table:
        if taken & set(entry.flags):
            continue

        def refuse(ctx: click.Context, param: click.Parameter, value: Any, entry: FromPlugin = entry) -> None:
            if param.name is not None and ctx.get_parameter_source(param.name) is ParameterSource.COMMANDLINE:
                error = click.ClickException(entry.missing(manager))  # one line, no usage text
                error.exit_code = 2  # type: ignore[misc]
                raise error

        name = "celery_" + entry.flags[-1].lstrip("-").replace("-", "_")
        where = entry.source if entry.source != "worker-core" else f"worker-core's {entry.plugin} plugin"
        options.append(click.Option([*entry.flags, name], is_flag=not entry.takes_value, default=None,
                                    expose_value=False, callback=refuse,
                                    help=f"Needs the {entry.plugin} plugin ({where}), not loaded."))
    return options


#: pools Celery has that no plugin here provides unless one is installed, and what to use instead
CELERY_ONLY_POOLS: Mapping[str, str] = {
    "eventlet": "greenlets need eventlet's monkey-patching, which this worker does not do",
    "gevent": "greenlets need gevent's monkey-patching, which this worker does not do",
    "custom": "Celery's CELERY_CUSTOM_WORKER_POOL is not read: pools are plugins, chosen by name",
}

#: Celery's other names for pools here
POOL_ALIASES: Mapping[str, str] = {"processes": "prefork"}


def check_pool(name: str, manager: PluginManager) -> str:
    """The pool ``-P name`` chooses: Celery's aliases resolved; a Celery pool that no installed
    plugin provides refused with what to use instead."""
    name = POOL_ALIASES.get(name, name)
    installed = manager.names("pool")
    if name in CELERY_ONLY_POOLS and name not in installed:
        others = [pool for pool in ("threads", "asyncio") if pool in installed]
        instead = (f"use -P {' or -P '.join(others)} for tasks that wait on I/O" if others
                   else "install ./plugins/pool_threads and use -P threads for tasks that wait on I/O")
        raise ConfigurationError(
            f"-P {name}: {CELERY_ONLY_POOLS[name]}; {instead}, or -P prefork "
            f"(installed pools: {', '.join(installed)})"
        )
    return name


def check_start_method(method: str | None) -> None:
    """``--pool-start-method``: fork is what the prefork pool does; spawn is refused."""
    if method == "spawn":
        raise ConfigurationError(
            "--pool-start-method spawn: the prefork pool forks its children (fork, the default); for "
            "tasks whose libraries cannot be forked, use -P threads or one worker per process (-P solo)"
        )


def check_disable_prefetch(given: bool | None) -> None:
    if given:
        raise ConfigurationError(
            "--disable-prefetch: not available; for a worker that holds only the tasks it runs, use "
            "--prefetch-multiplier 1 with acks_late tasks (task_acks_late=True): each process then holds "
            "the one message it runs"
        )


# -- values read as celery worker reads them ----------------------------------------------------


def parse_worker_autoscale(text: str) -> Autoscale:
    """Parse ``--autoscale`` as ``celery worker`` does: two numbers in either order (the larger
    is MAX), or MAX alone."""
    parts = str(text).split(",")
    if len(parts) == 2:
        try:
            numbers = sorted((int(parts[0]), int(parts[1])), reverse=True)
        except ValueError:
            pass
        else:
            text = f"{numbers[0]},{numbers[1]}"
    return parse_autoscale(text)


def auto_concurrency() -> int:
    """``-c auto``: the CPUs this process may run on (its affinity), fewer when its cgroup's CPU
    quota allows fewer, at least 1."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max", encoding="ascii") as file:
            quota, period = [*file.read().split(), "100000"][:2]
        if quota != "max":
            cpus = min(cpus, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cpus)


def parse_concurrency(value: str | int) -> int | None:
    """``-c N`` or ``-c auto``; 0 (or nothing) leaves the default (the app's
    ``worker_concurrency``, else the CPU count), as in Celery."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        text = str(value).strip()
        if text.lower() == "auto":
            return auto_concurrency()
        try:
            number = int(text)
        except ValueError:
            raise ConfigurationError(
                f"--concurrency must be a whole number or auto (got {value!r}), for example -c 8"
            ) from None
    if number < 0:
        raise ConfigurationError(f"--concurrency must be 0 or more, or auto (got {number})")
    return number or None


def exclude_queues(queues: Sequence[str], excluded: str | Iterable[str]) -> tuple[str, ...]:
    """``queues`` without those ``-X`` names; refused when none is left."""
    names = parse_queues(excluded)
    left = tuple(queue for queue in queues if queue not in names)
    if not left:
        raise ConfigurationError(
            f"--exclude-queues {','.join(names)} leaves no queue to consume (of {', '.join(queues)}); "
            f"name the queues to consume with -Q"
        )
    return left
