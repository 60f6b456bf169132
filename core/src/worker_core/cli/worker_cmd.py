"""``workerctl worker``: run a worker."""

from __future__ import annotations

import logging
import signal
import sys
from typing import Any

import click

from ..control.access import check_allow_list
from ..exceptions import WorkerError, WorkerTerminate
from ..plan import make_plan
from . import collector
from .common import (
    PluginCommand,
    check_endpoints,
    fail,
    options_from_params,
    plugin_values,
    prepare_app,
    use_broker,
    warn_failures,
    with_worker_options,
)

__all__ = ["worker"]

logger = logging.getLogger("worker")


@click.command(cls=PluginCommand)
@with_worker_options
@click.pass_context
def worker(ctx: click.Context, /, **params: Any) -> None:
    """Start a worker for the app given with -A.

    SIGTERM or Ctrl-C stops it warmly (running tasks finish, messages not started go back to the
    broker); a second one, or SIGQUIT, stops it cold.
    """
    from ..worker.banner import banner
    from ..worker.logs import setup_logging
    from ..worker.worker import Worker

    manager = ctx.obj
    command = ctx.command
    assert isinstance(command, PluginCommand)
    if not params.get("app"):
        raise fail(WorkerError("workerctl worker needs the app: -A module or -A module:attribute"))
    try:
        app, defaults = prepare_app(params["app"], {name.lower() for name in command.plugin_options},
                                        manager)
        app.use_plugins(manager)  # one set of hooks: the installed plugins' and the app's
        values = plugin_values(command, params, manager, app.settings)
        options = options_from_params(params, manager, plugin_values=values, defaults=defaults)
        if params.get("brokers"):
            use_broker(app, ";".join(options.brokers))
        plan = make_plan(options, manager, broker_urls=app.broker_urls,
                         result_url=app.settings.result_backend)
        check_endpoints(manager, app.settings, plan.selection)
        if plan.options.remote_control:
            check_allow_list(manager, app.settings.worker_remote_control_allow)
    except WorkerError as exc:
        raise fail(exc) from None
    setup_logging(plan.options.loglevel, secrets=_secrets(app, plan))
    warn_failures(manager)
    click.echo(banner(app, plan, manager, params["app"]))
    running = Worker(app, plan, manager)
    running.before_consuming.append(collector.resume)
    _install_signals(running)
    try:
        running.start()
    except WorkerTerminate:
        pass  # cold shutdown abandoned a task running inline; its message goes back unacknowledged
    except WorkerError as exc:
        logger.critical("worker stopped: %s", exc)
        sys.exit(1)
    except Exception:
        logger.critical("worker stopped by an unexpected error", exc_info=True)
        sys.exit(1)


def _secrets(app: Any, plan: Any) -> frozenset[str]:
    """The passwords and keys in the app's settings, the plugins' options and the brokers given
    on the command line."""
    from ..app.settings import Settings
    from ..redaction import secrets_of

    values = {name: getattr(app.settings, name) for name in Settings.names()}
    selection = plan.selection
    return secrets_of({**values, **plan.options.extra, "brokers": selection.broker_urls,
                       "result_url": selection.result_url})


def _install_signals(running: Any) -> None:
    def warm(signum: int, frame: Any) -> None:
        running.request_stop()

    def cold(signum: int, frame: Any) -> None:
        running.request_stop(cold=True)

    signal.signal(signal.SIGTERM, warm)
    signal.signal(signal.SIGINT, warm)
    if hasattr(signal, "SIGQUIT"):
        signal.signal(signal.SIGQUIT, cold)
