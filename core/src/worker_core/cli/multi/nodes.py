"""The nodes a ``multi`` command line names, as ``celery multi`` expands them.

- Names: ``w1 w2`` (``w1@<host>``), ``w1@%h``, or one number ``3`` (``celery1`` to ``celery3``,
  ``--range-prefix`` changes ``celery``); ``-n``/``--hostname`` and ``--suffix`` give the host,
  ``--prefix`` a prefix of the names.
- Options are every worker's, except those for one node: ``-c:w1 4``, ``--queues:w2=emails``,
  by index (``-c:1 4``), list (``-c:1,2``) or range of indexes (``-c:1-3``, with a number of
  nodes).
- Each node runs ``<executable> -m worker_core worker --detach -n NODE --pidfile=...
  --logfile=...``; the pid and log files default to ``/var/run/celery/%n.pid`` and
  ``/var/log/celery/%n%I.log`` (their directories are created), and in every option ``%n`` is
  the node's name, ``%h`` the whole node name, ``%d`` its host (``%i``/``%I`` are left to the
  worker).
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import sys
from collections.abc import Collection, Iterator, Mapping, Sequence

import attrs

from ...exceptions import ConfigurationError
from ...nodenames import host_format, node_format, nodesplit
from ..daemon import Pidfile

__all__ = ["Node", "ParsedArgs", "nodes_from", "parse_args"]

DEFAULT_PIDFILE = "/var/run/celery/%n.pid"
DEFAULT_LOGFILE = "/var/log/celery/%n%I.log"
#: options of the program rather than of ``worker`` (they go before the command)
PROGRAM_OPTIONS = frozenset({"-A", "--app", "-b", "--broker", "--result-backend", "--loader", "--config",
                             "--workdir", "-C", "--no-color"})
#: options of ``multi`` itself
MULTI_OPTIONS = ("--cmd", "--append", "--prefix", "--suffix", "--range-prefix", "--hostname", "-n")


@attrs.define
class ParsedArgs:
    """A ``multi`` command line: node names, options (for all nodes and per node), what follows
    ``--``, and the signal named (``-KILL``, ``-9``)."""

    names: list[str] = attrs.field(factory=list)
    options: dict[str, str | None] = attrs.field(factory=dict)
    namespaces: dict[str, dict[str, str | None]] = attrs.field(factory=dict)
    passthrough: list[str] = attrs.field(factory=list)
    signal: int | None = None


def _signal_of(arg: str) -> int | None:
    """``-9``, ``-KILL`` or ``-SIGKILL``: the signal; None for anything else."""
    text = arg[1:]
    if text.isdigit():
        return int(text)
    name = text.upper()
    name = name if name.startswith("SIG") else f"SIG{name}"
    number = getattr(signal.Signals, name, None) if name.isalnum() else None
    return int(number) if number is not None else None


def parse_args(args: Sequence[str], flags: Collection[str], valued: Collection[str]) -> ParsedArgs:
    """Read a ``multi`` command line. ``flags`` are the options that take no value, ``valued``
    the long ones that take one (``--pidfile /x`` as well as ``--pidfile=/x``); any other short
    option takes the next word unless it starts with ``-`` (as ``celery multi`` reads them), any
    other long one a value only as ``--name=value``."""
    valued = {*valued, *MULTI_OPTIONS}
    parsed = ParsedArgs()
    words = [arg for arg in args if arg]
    position = 0
    while position < len(words):
        arg = words[position]
        position += 1
        if arg == "--":
            parsed.passthrough = words[position:]
            break
        if not arg.startswith("-") or arg == "-":
            parsed.names.append(arg)
            continue
        number = _signal_of(arg)
        if number is not None and ":" not in arg:
            parsed.signal = number
            continue
        name, has_value, text = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        value: str | None = text
        base = name.partition(":")[0]
        if not has_value and base not in flags and position < len(words) and (
                not words[position].startswith("-") or words[position] == "-"):
            if base.startswith("--") and base not in valued:
                value = None  # a long option nobody declared takes a value only as --name=value
            else:
                value = words[position]
                position += 1
        elif not has_value:
            value = None
        if ":" in name:
            name, _, namespace = name.partition(":")
            parsed.namespaces.setdefault(namespace, {})[name] = value
        else:
            parsed.options[name] = value
    return parsed


@attrs.frozen
class Node:
    """One worker ``multi`` manages."""

    name: str
    options: Mapping[str, str | None]
    program: tuple[str, ...]
    passthrough: tuple[str, ...] = ()
    append: str = ""

    @property
    def shortname(self) -> str:
        return self.name.partition("@")[0]

    def expand(self, text: str) -> str:
        """``%n`` the node's name, ``%h`` the whole node name, ``%d`` its host, ``%i``/``%I``
        left for the worker (``multi expand`` prints these)."""
        shortname, host = nodesplit(self.name)
        return node_format(text, self.name, what="multi", h=self.name, d=host, N=shortname or "",
                           i="%i", I="%I")

    @property
    def executable(self) -> str:
        return self.options.get("--executable") or sys.executable

    @property
    def argv(self) -> list[str]:
        """The worker's command line after the executable."""
        program = [self.expand(word) for word in self.program]
        at = program.index("worker_core") + 1 if "worker_core" in program else 0
        before: list[str] = []
        after: list[str] = []
        for option, value in self.options.items():
            if value is not None:
                value = self.expand(value)
                if option in ("--pidfile", "--logfile", "-f", "--workdir"):
                    value = os.path.expanduser(value)
            words = [option] if value is None else ([f"{option}={value}"] if option.startswith("--")
                                                      else [option, value])
            (before if option in PROGRAM_OPTIONS else after).extend(words)
        argv = program[:at] + before + program[at:] + after + list(self.passthrough)
        if self.append:
            argv.extend(shlex.split(self.expand(self.append)))
        return argv

    @property
    def pidfile(self) -> str:
        path = self.options.get("--pidfile") or DEFAULT_PIDFILE
        return os.path.expanduser(node_format(self.expand(path), self.name, what="--pidfile"))

    @property
    def logfile(self) -> str:
        return os.path.expanduser(self.expand(self.options.get("--logfile") or DEFAULT_LOGFILE))

    def pid(self) -> int | None:
        """The pid in the node's pid file, if it holds one."""
        try:
            return Pidfile(self.pidfile).read_pid()
        except ValueError:
            return None

    def send(self, signum: int) -> bool:
        """Send ``signum`` to the node's process; False when it is gone."""
        pid = self.pid()
        if not pid:
            return False
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            return False  # gone, or the pid now belongs to someone else's process
        return True

    def alive(self) -> bool:
        return self.send(0)


def _node_name(name: str, prefix: str, suffix: str) -> tuple[str, str]:
    """(the namespace the node's own options are under, the node name)."""
    if "@" in name:
        nodename = host_format(name, what="multi")
        return nodename.partition("@")[0], nodename
    return name, host_format(f"{prefix}{name}@{suffix}", what="multi")


def _spread(parsed: ParsedArgs, names: list[str], ranges: bool) -> None:
    """Per-node options by list (``-c:1,2``) or range (``-c:1-3``, only with a number of nodes)
    given to each, then by index (``-c:1``) given to that node's name."""
    for namespace, values in list(parsed.namespaces.items()):
        if "," in namespace or (ranges and "-" in namespace):
            del parsed.namespaces[namespace]
            for part in namespace.split(","):
                if ranges and "-" in part:
                    start, _, stop = part.partition("-")
                    try:
                        members = [str(n) for n in range(int(start), int(stop) + 1)]
                    except ValueError:
                        raise ConfigurationError(
                            f"multi: bad range {part!r} in an option (use -c:1-3)") from None
                else:
                    members = [part]
                for member in members:
                    parsed.namespaces.setdefault(member, {}).update(values)
    for namespace, values in list(parsed.namespaces.items()):
        if namespace.isdigit():
            index = int(namespace) - 1
            if index < 0:
                raise ConfigurationError(f"multi: node indexes start at 1 (got -...:{namespace})")
            if index < len(names):
                parsed.namespaces.setdefault(names[index], {}).update(values)
            elif not ranges:
                raise ConfigurationError(f"multi: no node at index {namespace} (there are {len(names)})")


def nodes_from(parsed: ParsedArgs, program: Sequence[str]) -> Iterator[Node]:
    """The nodes of a parsed command line; ``program`` is the node's command after the
    executable (``-m worker_core worker --detach``)."""
    options = dict(parsed.options)
    command = options.pop("--cmd", None)
    if command:
        program = [("worker_core" if word == "celery" else word) for word in shlex.split(command)]
    append = options.pop("--append", None) or ""
    host = options.pop("--hostname", None) or options.pop("-n", None) or socket.gethostname()
    options.pop("-n", None)
    prefix = options.pop("--prefix", None) or ""
    suffix = options.pop("--suffix", None) or host
    suffix = "" if suffix in ('""', "''") else suffix
    range_prefix = options.pop("--range-prefix", None) or "celery"
    names = list(parsed.names)
    ranges = len(names) == 1 and names[0].isdigit()
    if ranges:
        names, prefix = [str(n) for n in range(1, int(names[0]) + 1)], range_prefix
    if not names:
        raise ConfigurationError("multi: name the nodes, for example: workerctl multi start w1 w2 (or 3)")
    _spread(parsed, names, ranges)
    for name in names:
        namespace, nodename = _node_name(name, prefix, suffix)
        own = parsed.namespaces.get(nodename, parsed.namespaces.get(namespace, {}))
        merged = {**options, **own}
        for short, long in (("-p", "--pidfile"), ("-f", "--logfile")):
            if short in merged and not str(merged[short] or "").startswith("no:"):
                merged.setdefault(long, merged.pop(short))
        merged["-n"] = nodename
        merged.setdefault("--pidfile", DEFAULT_PIDFILE)
        merged.setdefault("--logfile", DEFAULT_LOGFILE)
        merged.setdefault("--executable", sys.executable)
        yield Node(nodename, merged, tuple(program), tuple(parsed.passthrough), append)


def make_directories(node: Node) -> None:
    """Create the directories of the node's pid and log files (as ``celery multi`` does)."""
    for path in (node.pidfile, node.logfile):
        folder = os.path.dirname(path)
        if folder and "%" not in folder and not os.path.exists(folder):
            os.makedirs(folder, exist_ok=True)
