"""``workerctl dead-letters``: list, show, requeue and purge the messages the workers would have
discarded (``worker_dead_letter_queue``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from ..app import deadletters
from ..app.broker import connection_for
from ..exceptions import ConfigurationError
from .common import client_app, fail

__all__ = ["dead_letters"]


@contextmanager
def _opened(app_spec: str | None, broker: str | None, queue: str | None) -> Iterator[tuple[Any, str]]:
    app = client_app(app_spec, broker)
    name = queue or app.settings.worker_dead_letter_queue
    if not name:
        raise fail(
            ConfigurationError(
                "worker_dead_letter_queue is None, so the workers keep no dead letters: name the queue with "
                "--queue, or set worker_dead_letter_queue"
            )
        )
    with connection_for(app.plugins, app.broker_urls[0], app.settings) as connection:
        yield connection, name


def _common(func: Any) -> Any:
    for decorator in reversed(
        [
            click.option("-A", "--app", "app_spec", help="App whose broker settings to use."),
            click.option("-b", "--broker", help="Broker URL (default: the app's, else embedded://)."),
            click.option("-q", "--queue", help="The dead-letter queue (default: worker_dead_letter_queue)."),
        ]
    ):
        func = decorator(func)
    return func


def _summary(letter: deadletters.DeadLetter) -> str:
    named = f"{letter.task or '?'}[{letter.task_id or '?'}]"
    route = f"{letter.exchange or '(default exchange)'}/{letter.routing_key}"
    return f"{named}  {letter.time}  {letter.worker}  via {route}\n    {letter.reason}"


@click.group("dead-letters")
def dead_letters() -> None:
    """The messages workers would have discarded (undecodable, unknown task, refused content, over
    the redelivery limit, rejected), each with the reason, the worker and the time."""


@dead_letters.command("list")
@_common
@click.option(
    "-n",
    "--limit",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Show at most this many.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def list_(app_spec: str | None, broker: str | None, queue: str | None, limit: int, as_json: bool) -> None:
    """List the dead letters, oldest first (they stay in the queue)."""
    with _opened(app_spec, broker, queue) as (connection, name):
        letters = deadletters.browse(connection, name, limit)
    for letter in letters:
        if as_json:
            click.echo(
                json.dumps(
                    {
                        "id": letter.task_id,
                        "task": letter.task,
                        "reason": letter.reason,
                        "worker": letter.worker,
                        "time": letter.time,
                        "exchange": letter.exchange,
                        "routing_key": letter.routing_key,
                    }
                )
            )
        else:
            click.echo(_summary(letter))
    if not as_json:
        click.echo(f"\n{len(letters)} dead letter{'s' if len(letters) != 1 else ''} in {name!r}.")


@dead_letters.command()
@_common
@click.argument("task_id")
def show(app_spec: str | None, broker: str | None, queue: str | None, task_id: str) -> None:
    """Show one dead letter in full: its headers and body."""
    with _opened(app_spec, broker, queue) as (connection, name):
        letters = [letter for letter in deadletters.browse(connection, name) if letter.task_id == task_id]
    if not letters:
        raise click.ClickException(f"no dead letter of task id {task_id!r} in {name!r}")
    letter = letters[0]
    body = letter.body.decode("utf-8", "replace") if isinstance(letter.body, bytes) else letter.body
    click.echo(
        json.dumps(
            {
                "id": letter.task_id,
                "task": letter.task,
                "reason": letter.reason,
                "worker": letter.worker,
                "time": letter.time,
                "exchange": letter.exchange,
                "routing_key": letter.routing_key,
                "content_type": letter.content_type,
                "headers": dict(letter.headers),
                "body": body,
            },
            indent=2,
            default=repr,
        )
    )


@dead_letters.command("requeue")
@_common
@click.argument("task_ids", nargs=-1)
@click.option("--all", "every", is_flag=True, help="Requeue every dead letter.")
def requeue_(
    app_spec: str | None, broker: str | None, queue: str | None, task_ids: tuple[str, ...], every: bool
) -> None:
    """Send dead letters (by task id, or --all) back the way they came."""
    if not task_ids and not every:
        raise click.UsageError("requeue takes task ids, or --all for every dead letter")
    with _opened(app_spec, broker, queue) as (connection, name):
        sent = deadletters.requeue(connection, name, set(task_ids))
    for letter in sent:
        click.echo(
            f"requeued {letter.task or '?'}[{letter.task_id or '?'}] to "
            f"{letter.exchange or '(default exchange)'}/{letter.routing_key}"
        )
    missing = sorted(set(task_ids) - {letter.task_id for letter in sent if letter.task_id})
    if missing:
        raise click.ClickException(f"no dead letter of task id {', '.join(missing)} in {name!r}")
    click.echo(f"{len(sent)} requeued.")


@dead_letters.command("purge")
@_common
@click.argument("task_ids", nargs=-1)
@click.option("--all", "every", is_flag=True, help="Delete every dead letter.")
def purge_(
    app_spec: str | None, broker: str | None, queue: str | None, task_ids: tuple[str, ...], every: bool
) -> None:
    """Delete dead letters (by task id, or --all) for good."""
    if not task_ids and not every:
        raise click.UsageError("purge takes task ids, or --all for every dead letter")
    with _opened(app_spec, broker, queue) as (connection, name):
        deleted = deadletters.purge(connection, name, set(task_ids))
    click.echo(f"{deleted} deleted from {name!r}.")
