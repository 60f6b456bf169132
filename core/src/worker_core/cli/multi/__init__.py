"""``workerctl multi``: start, stop and restart several detached workers, as ``celery multi``
does (the same node names, options, pid and log files), so Celery's systemd and init.d
examples work with the program's name changed.

Internal to worker-core.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import click

from ... import __version__
from ...exceptions import WorkerError
from ..celery_options import FROM_PLUGINS
from ..common import fail
from ..worker_cmd import worker
from .nodes import nodes_from, parse_args
from .tool import COMMANDS, USAGE, Tool

__all__ = ["multi"]

#: options ``multi`` keeps for itself (removed before the nodes' options are read)
RESERVED = {"--nosplash": "nosplash", "--quiet": "quiet", "-q": "quiet", "--verbose": "verbose",
            "--no-color": "no_color"}
#: what each node runs after the executable
PROGRAM = ("-m", "worker_core", "worker", "--detach")


def _worker_options() -> tuple[set[str], set[str]]:
    """(the worker's options that take no value, its long options that take one)."""
    flags: set[str] = set()
    valued: set[str] = set()
    for param in worker.params:
        if isinstance(param, click.Option):
            (flags if param.is_flag else valued).update(param.opts)
    for entry in FROM_PLUGINS:
        (valued if entry.takes_value else flags).update(entry.flags)
    return flags, {flag for flag in valued if flag.startswith("--")}


def _from_group(ctx: click.Context) -> list[str]:
    """The global options given before ``multi`` (``workerctl -A proj multi start w1``), as the
    nodes' options, where ``celery multi`` moves them."""
    parent = ctx.parent
    values = parent.params if parent is not None else {}
    words: list[str] = []
    if values.get("app"):
        words += ["-A", values["app"]]
    for url in values.get("brokers") or ():
        words += ["-b", url]
    for name in ("result_backend", "loader", "config", "workdir"):
        if values.get(name):
            words.append(f"--{name.replace('_', '-')}={values[name]}")
    if values.get("no_color"):
        words.append("--no-color")
    return words


@click.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True,
                                 "help_option_names": []},
               add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def multi(ctx: click.Context, /, args: Sequence[str]) -> None:
    """Start, stop and restart several detached workers: `workerctl multi help`."""
    words = list(args)
    switches: dict[str, bool] = {}
    for flag, name in RESERVED.items():
        while flag in words:
            words.remove(flag)
            switches[name] = True
    parent = ctx.parent
    quiet = switches.get("quiet", False) or bool(parent is not None and parent.params.get("quiet"))
    tool = Tool(quiet=quiet, verbose=switches.get("verbose", False))
    if not words or words[0] in ("help", "-h", "--help") or words[0].startswith("-"):
        tool.say(USAGE.format(prog="workerctl multi"))
        if words and words[0] not in ("help", "-h", "--help"):
            raise fail(WorkerError(f"multi: name the command first (got {words[0]!r}); see above"))
        return
    command, rest = words[0], words[1:]
    if not switches.get("nosplash") and command in COMMANDS and command not in ("names", "show"):
        tool.note(f"workerctl multi v{__version__}")
    try:
        code = _dispatch(tool, command, rest + _from_group(ctx))
    except WorkerError as exc:
        raise fail(exc) from None
    sys.exit(code)


def _dispatch(tool: Tool, command: str, words: list[str]) -> int:
    flags, valued = _worker_options()
    if command == "expand":
        if not words:
            raise WorkerError("multi expand: give a template, for example: "
                              "workerctl multi expand %n.pid w1 w2")
        nodes = list(nodes_from(parse_args(words[1:], flags, valued), PROGRAM))
        tool.say("\n".join(node.expand(words[0]) for node in nodes))
        return 0
    if command == "get":
        if not words:
            raise WorkerError("multi get: give a node name, for example: workerctl multi get w1@host w1 w2")
        nodes = list(nodes_from(parse_args(words[1:], flags, valued), PROGRAM))
        found = [node for node in nodes if node.name == words[0]]
        if not found:
            return 1
        tool.say(" ".join(found[0].argv))
        return 0
    if command not in COMMANDS:
        known = ", ".join([*COMMANDS[:3], *COMMANDS[4:], "get", "expand", "help"])
        raise WorkerError(f"multi: no command {command!r}; the commands are {known}")
    parsed = parse_args(words, flags, valued)
    nodes = list(nodes_from(parsed, PROGRAM))
    import signal

    signum = parsed.signal or int(signal.SIGTERM)
    method: Any = getattr(tool, "stopwait" if command == "stop_verify" else command)
    return int(method(nodes, signum))
