"""``workerctl inspect`` and ``workerctl control``: remote commands over the broker."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import click

from ..control.access import all_commands
from ..control.client import broadcast
from ..control.command import ArgumentError
from ..control.command import ControlCommand as Command
from ..control.commands import BUILTIN_COMMANDS, signal_number
from ..exceptions import WorkerError
from ..options import did_you_mean, parse_autoscale
from ..plugins.manager import PluginManager
from ..rates import parse_rate
from .common import client_app, fail

__all__ = ["control", "inspect"]


def _show(replies: Sequence[dict[str, Any]], as_json: bool) -> None:
    if not replies:
        raise click.ClickException("No nodes replied within time constraint.")
    if as_json:
        merged: dict[str, Any] = {}
        for reply in replies:
            merged.update(reply)
        click.echo(json.dumps(merged, indent=2, default=str))
        return
    for reply in replies:
        for node, answer in reply.items():
            failed = isinstance(answer, dict) and "error" in answer
            click.echo(f"->  {node}: {'ERROR' if failed else 'OK'}")
            if isinstance(answer, dict) and set(answer) <= {"ok", "error"}:
                click.echo(f"        {answer.get('error') or answer.get('ok')}")
            else:
                for line in json.dumps(answer, indent=2, default=str).splitlines():
                    click.echo(f"        {line}")
    count = sum(len(reply) for reply in replies)
    click.echo(f"\n{count} node{'s' if count != 1 else ''} online.")


def _run(app_spec: str | None, broker: str | None, command: str, arguments: dict[str, Any],
         destination: tuple[str, ...], timeout: float, as_json: bool) -> None:
    names = [n.strip() for item in destination for n in item.split(",") if n.strip()]
    try:
        replies = broadcast(client_app(app_spec, broker), command, arguments, names or None, timeout)
    except WorkerError as exc:
        raise fail(exc) from None
    _show(replies, as_json)


def _common(func: Any) -> Any:
    for decorator in reversed([
        click.option("-A", "--app", "app_spec", help="App whose broker settings to use."),
        click.option("-b", "--broker", help="Broker URL (default: the app's, else embedded://)."),
        click.option("-d", "--destination", multiple=True,
                     help="Node name(s), comma-separated (default: all)."),
        click.option("-t", "--timeout", type=click.FloatRange(min=0, min_open=True), default=1.0,
                     show_default=True,
                     help="Seconds to wait for replies."),
        click.option("-j", "--json", "as_json", is_flag=True, help="Print the replies as one JSON object."),
    ]):
        func = decorator(func)
    return func


def _spec(kind: str, command: str) -> Command:
    """The command named ``command`` (``-`` or ``_`` between words): a built-in one, else one a
    plugin installed here declares."""
    name = command.replace("-", "_")
    commands: Mapping[str, Command] = BUILTIN_COMMANDS
    if name not in commands:
        try:
            commands = all_commands(PluginManager())
        except WorkerError as exc:
            raise fail(exc) from None
    spec = commands.get(name)
    if spec is None:
        known = sorted(known for known, spec in commands.items() if spec.kind == kind and not spec.hidden)
        raise click.UsageError(
            f"no {kind} command {command!r}.{did_you_mean(name, known)} The {kind} commands are: "
            f"{', '.join(known)} (a plugin's command is known here once its plugin is installed)")
    if spec.kind != kind:
        how = "changes the worker" if spec.kind == "control" else "reads the worker's state"
        raise click.UsageError(f"{spec.name} {how}: send it with workerctl {spec.kind} {spec.name}")
    return spec


def _arguments(spec: Command, words: tuple[str, ...]) -> dict[str, Any]:
    try:
        return spec.parse(words)
    except ArgumentError as exc:
        raise click.BadParameter(exc.why, param_hint=exc.argument) from None
    except ValueError as exc:
        example = _EXAMPLES.get(spec.name)
        hint = f"; for example: {spec.name} {example}" if example else ""
        raise click.UsageError(f"{exc}{hint}") from None


_EXAMPLES = {
    "revoke": "d9078da5-9915-40a0-bfa1-392c7bde42ed",
    "terminate": "KILL d9078da5-9915-40a0-bfa1-392c7bde42ed",
    "query_task": "d9078da5-9915-40a0-bfa1-392c7bde42ed",
    "revoke_by_stamped_headers": "mtask_id=d9078da5-9915-40a0-bfa1-392c7bde42ed",
    "autoscale": "10 3",
    "time_limit": "proj.tasks.report 60 120",
    "rate_limit": "proj.tasks.send_mail 10/m",
    "add_consumer": "emails",
    "cancel_consumer": "emails",
}


def _listing(kind: str) -> str:
    """The commands of ``kind`` for ``--help``: each with its arguments and what it does."""
    specs = sorted((spec for spec in BUILTIN_COMMANDS.values() if spec.kind == kind and not spec.hidden),
                   key=lambda spec: spec.name)
    lines = [f"{spec.name} {spec.usage}".rstrip() + f": {spec.help}" for spec in specs]
    return "\n\n".join(lines)


@click.command(help="Ask workers about their state with COMMAND [ARGUMENTS]... (a plugin's inspect "
                    "commands too, once its plugin is installed here):\n\n" + _listing("inspect"))
@click.argument("command")
@click.argument("arguments", nargs=-1)
@_common
def inspect(command: str, arguments: tuple[str, ...], app_spec: str | None, broker: str | None,
            destination: tuple[str, ...], timeout: float, as_json: bool) -> None:
    spec = _spec("inspect", command)
    _run(app_spec, broker, spec.name, _arguments(spec, arguments), destination, timeout, as_json)


@click.command(help="Change workers with COMMAND [ARGUMENTS]... (also with - between words: "
                    "rate-limit; a plugin's control commands too, once its plugin is installed "
                    "here):\n\n" + _listing("control"))
@click.argument("command")
@click.argument("arguments", nargs=-1)
@_common
def control(command: str, arguments: tuple[str, ...], app_spec: str | None, broker: str | None,
            destination: tuple[str, ...], timeout: float, as_json: bool) -> None:
    spec = _spec("control", command)
    name = spec.name
    values = _arguments(spec, arguments)
    if name == "autoscale":
        try:
            parse_autoscale(f"{values['max']},{values.get('min', 0)}")
        except WorkerError as exc:
            raise fail(exc) from None
    if name == "rate_limit":
        try:
            parse_rate(values["rate_limit"])
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="RATE") from None
    if name == "terminate":
        try:
            signal_number(values["signal"])
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="SIGNAL") from None
    if name in ("pool_grow", "pool_shrink") and values.get("n", 1) < 1:
        raise click.BadParameter(f"must be a whole number, 1 or more (got {values['n']})", param_hint="N")
    _run(app_spec, broker, name, values, destination, timeout, as_json)
