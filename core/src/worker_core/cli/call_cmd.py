"""``workerctl call``: send a task by name, print its id, and optionally wait for the result."""

from __future__ import annotations

import json
from typing import Any

import click
from kombu.utils.json import dumps

from ..exceptions import ResultTimeout, WorkerError
from ..redaction import redact_url
from ..results.meta import PENDING
from .common import client_app, fail

__all__ = ["DEFAULT_WAIT", "call"]

#: seconds ``--wait`` waits without ``--timeout``: long enough for a real task, short enough that
#: a call with no worker behind it ends with an error instead of hanging a script
DEFAULT_WAIT = 60.0


def _json(value: str, what: str, kind: type) -> Any:
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        example = "[2, 3]" if kind is list else '{"x": 1}'
        raise click.BadParameter(f"must be JSON ({exc}); for example {example}", param_hint=what) from None
    if not isinstance(parsed, kind):
        raise click.BadParameter(f"must be a JSON {'array' if kind is list else 'object'} (got {value!r})",
                                 param_hint=what)
    return parsed


@click.command()
@click.argument("task_name")
@click.option("-A", "--app", "app_spec", help="Tasks module whose settings (broker, backend) to use.")
@click.option("-b", "--broker", help="Broker URL (default: the app's, else embedded://).")
@click.option("--args", "args_json", default="[]", help="Positional arguments as a JSON array.")
@click.option("--kwargs", "kwargs_json", default="{}", help="Keyword arguments as a JSON object.")
@click.option("--countdown", type=float, help="Run no sooner than this many seconds from now.")
@click.option("--expires", type=click.FloatRange(min=0, min_open=True),
              help="Discard the task if it has not started within this many seconds.")
@click.option("--queue", "-Q", help="Queue to send to (default: the app's routing, else celery).")
@click.option("--priority", type=click.IntRange(0, 255),
              help="Message priority, 0 to 255 (where the queue has priorities).")
@click.option("--wait", is_flag=True, help="Wait for the result and print it.")
@click.option("--timeout", type=click.FloatRange(min=0), metavar="SECONDS",
              help=f"With --wait: give up after this many seconds (default {DEFAULT_WAIT:g}; "
                   f"0 waits for ever).")
def call(task_name: str, app_spec: str | None, broker: str | None, args_json: str, kwargs_json: str,
         countdown: float | None, expires: float | None, queue: str | None, priority: int | None,
         wait: bool, timeout: float | None) -> None:
    """Send TASK_NAME to a worker and print the task id (and with --wait, its result as JSON)."""
    args = _json(args_json, "--args", list)
    kwargs = _json(kwargs_json, "--kwargs", dict)
    if queue is not None and (not queue or queue != queue.strip()):
        raise click.BadParameter(f"must be a queue name (got {queue!r})", param_hint="--queue")
    if timeout is not None and not wait:
        raise click.UsageError(f"--timeout applies only with --wait (got --timeout {timeout:g} without "
                               f"--wait); add --wait to wait for the result")
    try:
        app = client_app(app_spec, broker)
        result = app.send_task(task_name, args, kwargs, countdown=countdown, expires=expires,
                               queue=queue, priority=priority)
    except WorkerError as exc:
        raise fail(exc) from None
    except (TypeError, ValueError) as exc:
        raise click.UsageError(str(exc)) from None
    except Exception as exc:  # the broker did not take it (kombu's OperationalError, OSError)
        raise click.ClickException(f"could not send {task_name}: {type(exc).__name__}: {exc}") from None
    click.echo(result.id)
    if not wait:
        return
    limit = DEFAULT_WAIT if timeout is None else timeout
    try:
        value = result.get(timeout=limit or None)
    except ResultTimeout:
        raise click.ClickException(_not_finished(app, task_name, result, queue, limit)) from None
    except WorkerError as exc:
        raise fail(exc) from None
    except Exception as exc:
        raise click.ClickException(
            f"task {task_name}[{result.id}] failed: {type(exc).__name__}: {exc}"
        ) from None
    click.echo(dumps(value))


def _not_finished(app: Any, task_name: str, result: Any, queue: str | None, seconds: float) -> str:
    """Why ``--wait`` gave up, and what to check: most often no worker consumes that queue."""
    try:
        state = result.state
    except Exception:  # the backend failed after the wait: the timeout is still the news
        state = "unknown"
    brokers = ";".join(redact_url(url) for url in app.broker_urls)
    if state == PENDING:
        destination = app.route(task_name, queue)
        target = (f"queue {destination.queue.name!r}" if destination.queue is not None else
                  f"a queue bound to {destination.exchange!r} by {destination.routing_key!r}")
        hint = f"is a worker running on {brokers} and consuming {target}?"
    else:
        hint = "a worker has it but did not finish it yet."
    return (f"no worker finished task {task_name}[{result.id}] within {seconds:g}s (state: {state}): "
            f"{hint} Wait longer with --timeout SECONDS, or --timeout 0 to wait for ever")
