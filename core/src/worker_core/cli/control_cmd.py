"""``workerctl inspect`` and ``workerctl control``: remote commands over the broker."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import click

from ..control.commands import BUILTIN_COMMANDS, signal_number
from ..exceptions import WorkerError
from ..options import parse_autoscale
from ..rates import parse_rate
from .common import client_app, fail

__all__ = ["control", "inspect"]

INSPECT = sorted(name for name, c in BUILTIN_COMMANDS.items() if c.kind == "inspect")
CONTROL = sorted(name.replace("_", "-") for name, c in BUILTIN_COMMANDS.items() if c.kind == "control")


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
    from ..control.client import broadcast

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
        click.option("--json", "as_json", is_flag=True, help="Print the replies as one JSON object."),
    ]):
        func = decorator(func)
    return func


def _arguments(command: str, words: tuple[str, ...]) -> dict[str, Any]:
    """The command's arguments from the words after its name: whole numbers, except the text
    ones; a variadic argument takes the rest, as a list."""
    spec = BUILTIN_COMMANDS[command.replace("-", "_")]
    words_wanted = [a.upper() for a in spec.args] + ([f"{spec.variadic.upper()}..."] if spec.variadic else [])
    usage = " ".join(words_wanted)
    if len(words) > len(spec.args) and not spec.variadic:
        raise click.UsageError(f"{command} takes {len(spec.args)} argument(s): {usage or 'none'}")
    if spec.variadic and len(words) <= len(spec.args):
        example = _EXAMPLES.get(spec.name, usage)
        raise click.UsageError(f"{command} takes {usage}, for example: {command} {example}")
    values: dict[str, Any] = {}
    for key, text in zip(spec.args, words, strict=False):
        if key in spec.text_args:
            values[key] = text
            continue
        if key in spec.float_args:
            try:
                values[key] = float(text)
            except ValueError:
                raise click.BadParameter(f"must be a number (got {text!r})", param_hint=key.upper()) from None
            continue
        try:
            values[key] = int(text)
        except ValueError:
            raise click.BadParameter(
                f"must be a whole number (got {text!r})", param_hint=key.upper()
            ) from None
    if spec.variadic:
        values[spec.variadic] = list(words[len(spec.args):])
    return values


_EXAMPLES = {
    "revoke": "d9078da5-9915-40a0-bfa1-392c7bde42ed",
    "terminate": "KILL d9078da5-9915-40a0-bfa1-392c7bde42ed",
    "query_task": "d9078da5-9915-40a0-bfa1-392c7bde42ed",
}


@click.command()
@click.argument("command", type=click.Choice(INSPECT))
@click.argument("arguments", nargs=-1)
@_common
def inspect(command: str, arguments: tuple[str, ...], app_spec: str | None, broker: str | None,
            destination: tuple[str, ...], timeout: float, as_json: bool) -> None:
    """Ask workers about their state: ping, stats, active, reserved, scheduled, registered,
    active_queues, revoked, conf, query_task ID..."""
    _run(app_spec, broker, command, _arguments(command, arguments), destination, timeout, as_json)


@click.command()
@click.argument("command", type=click.Choice(CONTROL + [c.replace("-", "_") for c in CONTROL]))
@click.argument("arguments", nargs=-1)
@_common
def control(command: str, arguments: tuple[str, ...], app_spec: str | None, broker: str | None,
            destination: tuple[str, ...], timeout: float, as_json: bool) -> None:
    """Change workers: autoscale MAX MIN, pool-grow N, pool-shrink N, rate-limit TASK RATE,
    time-limit TASK SOFT [HARD], add-consumer QUEUE, cancel-consumer QUEUE, revoke ID...,
    terminate SIGNAL ID..., enable-events, disable-events, heartbeat, shutdown."""
    name = command.replace("-", "_")
    values = _arguments(command, arguments)
    if name == "autoscale" and "max" not in values:
        raise click.UsageError("autoscale takes MAX and optionally MIN, for example: control autoscale 10 3")
    if name == "autoscale":
        try:
            parse_autoscale(f"{values['max']},{values.get('min', 0)}")
        except WorkerError as exc:
            raise fail(exc) from None
    if name in ("add_consumer", "cancel_consumer") and "queue" not in values:
        raise click.UsageError(f"{command} takes a QUEUE, for example: control {command} emails")
    if name == "time_limit" and len(values) < 2:
        raise click.UsageError("time-limit takes TASK_NAME SOFT [HARD] in seconds, for example: control "
                               "time-limit proj.tasks.report 60 120")
    if name == "rate_limit":
        if len(values) < 2:
            raise click.UsageError("rate-limit takes TASK_NAME and RATE, for example: control rate-limit "
                                   "proj.tasks.send_mail 10/m (0 lifts the limit)")
        try:
            parse_rate(values["rate_limit"])
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="RATE") from None
    if name == "terminate":
        try:
            signal_number(values["signal"])
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="SIGNAL") from None
    if values.get("n", 1) < 1:
        raise click.BadParameter(f"must be a whole number, 1 or more (got {values['n']})", param_hint="N")
    _run(app_spec, broker, name, values, destination, timeout, as_json)
