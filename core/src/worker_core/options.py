"""The worker's options: one frozen object, parsed and validated once before anything starts.

Public (see :mod:`worker_core`): :class:`WorkerOptions`, :class:`OptionSpec` for a plugin's own
options, and :func:`did_you_mean` for the "Did you mean ...?" of an error message."""

from __future__ import annotations

import difflib
import math
import os
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs

from .exceptions import ConfigurationError
from .nodenames import default_nodename, host_format
from .revoked import RevokedIds

__all__ = [
    "LOGLEVELS",
    "SCHEDULING",
    "Autoscale",
    "OptionSpec",
    "WorkerOptions",
    "did_you_mean",
    "parse_autoscale",
    "parse_brokers",
    "parse_hostname",
    "parse_queues",
    "scheme_of",
]

LOGLEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
SCHEDULING = ("fair", "fcfs")


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """Return ``" Did you mean 'x'?"`` for the closest choice, or an empty string."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" Did you mean {close[0]!r}?" if close else ""


@attrs.frozen
class Autoscale:
    """Bounds for the autoscaler: ``--autoscale MAX[,MIN]``."""

    max: int
    min: int = 0

    def __str__(self) -> str:
        return f"{self.max},{self.min}"


@attrs.frozen
class OptionSpec:
    """An option a plugin adds to ``workerctl worker`` (and to ``workerctl steps``), also read
    from the ``WORKER_<NAME>`` variable and the ``worker_plugin_options`` setting (the
    ``worker_options`` hook says in which order).

    :ivar name: the key under which the parsed value appears in ``WorkerOptions.extra``;
        upper-cased after ``WORKER_``, the name of its variable.
    :ivar flags: command-line spellings, for example ``("--heartbeat-interval",)``.
    :ivar convert: turns the option's text (from the command line, the variable or the
        setting) into the value; raise ``ValueError`` with a helpful message for a bad value.
    :ivar default: the value when the option is given nowhere.
    :ivar help: one line for ``--help``.
    :ivar is_flag: a boolean switch that takes no value.
    """

    name: str
    flags: tuple[str, ...]
    convert: Callable[[str], Any] = str
    default: Any = None
    help: str = ""
    is_flag: bool = False


def _state_file(path: str | None) -> None:
    if path is None:
        return
    if not isinstance(path, str) or not path.strip():
        raise ConfigurationError(f"--statedb must be a file path (got {path!r})")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ConfigurationError(f"--statedb {path!r}: the directory {folder} does not exist; create it or "
                                 "give another path")
    if os.path.isdir(path):
        raise ConfigurationError(f"--statedb {path!r} is a directory; give a file path in it")
    try:
        RevokedIds().load(path)
    except ValueError as exc:
        raise ConfigurationError(f"--statedb: {exc}; give another path, or remove the file to start "
                                 "with no revoked ids") from None


def _positive(name: str, *, allow_zero: bool = False) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    def check(_inst: Any, _attr: attrs.Attribute[Any], value: Any) -> None:
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigurationError(
                f"{name} must be a number (got {value!r} that is a {type(value).__name__})"
            )
        if not math.isfinite(value):
            raise ConfigurationError(f"{name} must be a finite number (got {value!r}); leave it out for none")
        if value < 0 or (value == 0 and not allow_zero):
            bound = "0 or more" if allow_zero else "greater than 0"
            raise ConfigurationError(f"{name} must be {bound} (got {value!r})")

    return check


def _one_of(name: str, choices: Sequence[str]) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    def check(_inst: Any, _attr: attrs.Attribute[Any], value: Any) -> None:
        if value not in choices:
            raise ConfigurationError(
                f"{name} must be one of {', '.join(choices)} (got {value!r})."
                f"{did_you_mean(str(value), choices)}"
            )

    return check


def _names(name: str) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    def check(_inst: Any, _attr: attrs.Attribute[Any], value: tuple[str, ...]) -> None:
        for item in value:
            if not isinstance(item, str) or not item or item != item.strip():
                raise ConfigurationError(f"{name} must be non-empty names without spaces (got {item!r})")

    return check


def _default_hostname() -> str:
    return f"celery@{socket.gethostname()}"  # Celery's: monitors and scripts address nodes by it


def _node_name(_inst: Any, _attr: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, str) or not value.strip() or value != value.strip():
        raise ConfigurationError(
            f"--hostname must be a node name without surrounding spaces, for example worker1@%h "
            f"(got {value!r})"
        )


@attrs.frozen(kw_only=True)
class WorkerOptions:
    """Everything the worker was told: command line over settings over defaults.

    Plugin-declared options (see :class:`OptionSpec`) are in :attr:`extra`.
    """

    app: str | None = None
    pool: str | None = None
    concurrency: int | None = attrs.field(default=None, validator=_positive("--concurrency"))
    loop: str = "auto"
    brokers: tuple[str, ...] = ()
    failover: str = "round-robin"
    queues: tuple[str, ...] = attrs.field(default=("celery",), validator=_names("--queues"))
    prefetch_multiplier: int = attrs.field(default=4, validator=_positive("--prefetch-multiplier"))
    autoscale: Autoscale | None = None
    autoscaler: str = "default"
    loglevel: str = attrs.field(default="WARNING", validator=_one_of("--loglevel", LOGLEVELS))
    hostname: str = attrs.field(factory=_default_hostname, validator=_node_name)
    time_limit: float | None = attrs.field(default=None, validator=_positive("--time-limit"))
    soft_time_limit: float | None = attrs.field(default=None, validator=_positive("--soft-time-limit"))
    max_tasks_per_child: int | None = attrs.field(default=None, validator=_positive("--max-tasks-per-child"))
    max_memory_per_child: int | None = attrs.field(
        default=None, validator=_positive("--max-memory-per-child")
    )
    scheduling: str = attrs.field(default="fair", validator=_one_of("-O", SCHEDULING))
    statedb: str | None = attrs.field(default=None, validator=lambda _i, _a, value: _state_file(value))
    #: ``--logfile`` as given (its ``%`` placeholders not yet expanded: a prefork child expands
    #: ``%i`` to its own index)
    logfile: str | None = None
    #: ``--pidfile``, expanded for the node
    pidfile: str | None = None
    #: ``--purge``: delete the messages waiting in the consumed queues once, at start
    purge: bool = False
    #: answer remote-control commands (``worker_enable_remote_control``); off leaves out the Control step
    remote_control: bool = True
    blocked_plugins: tuple[str, ...] = ()
    extra: Mapping[str, Any] = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        if not self.queues:
            raise ConfigurationError("--queues must name at least one queue (got an empty list)")
        if (
            self.time_limit is not None
            and self.soft_time_limit is not None
            and self.soft_time_limit >= self.time_limit
        ):
            raise ConfigurationError(
                f"--soft-time-limit ({self.soft_time_limit:g}s) must be shorter than --time-limit "
                f"({self.time_limit:g}s): the soft limit warns the task before the hard limit kills it"
            )

    @property
    def max_concurrency(self) -> int | None:
        """The largest pool size this worker may reach (the autoscaler's max when autoscaling)."""
        return self.autoscale.max if self.autoscale else self.concurrency

    def replace(self, **changes: Any) -> WorkerOptions:
        return attrs.evolve(self, **changes)


# -- parsers for command-line text -------------------------------------------------------------


def parse_autoscale(text: str) -> Autoscale:
    """Parse ``MAX[,MIN]`` as ``--autoscale`` takes it."""
    max_text, _, min_text = str(text).partition(",")
    try:
        high = int(max_text)
        low = int(min_text) if min_text.strip() else 0
    except ValueError:
        raise ConfigurationError(
            f"--autoscale must be MAX[,MIN] with whole numbers, for example 10,3 (got {text!r})"
        ) from None
    if high < 1:
        raise ConfigurationError(f"--autoscale MAX must be at least 1 (got {text!r})")
    if low < 0:
        raise ConfigurationError(f"--autoscale MIN must be 0 or more (got {text!r})")
    if low > high:
        raise ConfigurationError(
            f"--autoscale takes MAX first, then MIN, and MIN may not exceed MAX (got {text!r}; "
            f"did you mean {low},{high}?)"
        )
    return Autoscale(max=high, min=low)


def parse_queues(values: str | Iterable[str]) -> tuple[str, ...]:
    """Parse ``-Q a,b`` (and repeated ``-Q``) into queue names, keeping order, dropping repeats."""
    items = [values] if isinstance(values, str) else list(values)
    names: list[str] = []
    for item in items:
        for name in str(item).split(","):
            name = name.strip()
            if not name:
                raise ConfigurationError(
                    f"--queues must be comma-separated queue names, for example -Q emails,reports "
                    f"(got {item!r} with an empty name)"
                )
            if name not in names:
                names.append(name)
    return tuple(names)


def parse_hostname(text: str, host: str | None = None) -> str:
    """The node name ``-n text`` gives, as Celery reads it: ``w1@%h`` is ``w1@<this host>``, a
    name without ``@`` is a host (``-n w1`` is ``celery@w1``); ``%h`` (this host's name), ``%n``
    (its first label), ``%d`` (its domain), ``%i`` (0), ``%I`` (nothing) and ``%%`` are expanded
    (see :mod:`worker_core.nodenames`)."""
    return host_format(default_nodename(text), host)


def parse_brokers(values: str | Iterable[str]) -> tuple[str, ...]:
    """Parse broker URLs given as ``;``-separated text and/or repeated ``-b``."""
    items = [values] if isinstance(values, str) else list(values)
    urls: list[str] = []
    for item in items:
        for url in str(item).split(";"):
            url = url.strip()
            if not url:
                continue
            if "://" not in url:
                raise ConfigurationError(
                    f"broker URL {url!r} has no scheme; write it as scheme://host, for example "
                    f"redis://127.0.0.1:6379/0 or amqp://guest:guest@127.0.0.1:5672//"
                )
            urls.append(url)
    return tuple(urls)


def scheme_of(url: str) -> str:
    """A URL's scheme, lower-cased: ``redis`` for ``redis://...``, ``db+postgresql`` for
    ``db+postgresql://...`` (the plugin manager serves a scheme with ``+`` by the entry point
    named after all of it, else after its part before ``+``)."""
    return url.partition("://")[0].lower()
