"""``workerctl worker``: run a worker, in the foreground or detached (``-D``)."""

from __future__ import annotations

import logging
import signal
import sys
from typing import Any

import click

from ..app.settings import Settings
from ..control.access import check_allow_list
from ..exceptions import WorkerError, WorkerTerminate
from ..nodenames import node_format
from ..redaction import secrets_of
from ..worker.banner import banner
from ..worker.logs import setup_logging
from ..worker.worker import Worker
from . import collector
from .common import PluginCommand, warn_failures, with_worker_options
from .daemon import Pidfile, detach, drop_privileges, parse_umask, without_detach
from .preparation import prepared, report_failure

__all__ = ["worker"]

logger = logging.getLogger("worker")


@click.command(cls=PluginCommand)
@with_worker_options
@click.pass_context
def worker(ctx: click.Context, /, **params: Any) -> None:
    """Start a worker for the app given with -A.

    SIGTERM or Ctrl-C stops it warmly (running tasks finish, messages not started go back to the
    broker); a second one, or SIGQUIT, stops it cold. Every option of Celery's `celery worker`
    is taken with Celery's meaning (see docs/migrating-from-celery.md).
    """
    manager = ctx.obj
    if not params.get("app"):
        raise report_failure(WorkerError("workerctl worker needs the app: -A module or -A module:attribute"),
                             params)
    app, plan = prepared(ctx, params)
    options = plan.options
    pidfile = None
    try:
        if plan.options.remote_control:
            check_allow_list(manager, app.settings.worker_remote_control_allow)
        logfile = (node_format(options.logfile, options.hostname, what="--logfile") if options.logfile
                   else None)
        umask = parse_umask(params.get("umask"))
        if options.pidfile:
            pidfile = Pidfile(options.pidfile)
            pidfile.check()
        drop_privileges(params.get("uid"), params.get("gid"))
        if params.get("detach"):
            detach(without_detach(sys.argv[1:]), executable=params.get("executable"), logfile=logfile,
                   umask=umask)
        if pidfile is not None:
            pidfile.acquire()
        setup_logging(plan.options.loglevel, secrets=_secrets(app, plan), logfile=logfile)
    except WorkerError as exc:
        raise report_failure(exc, params) from None
    try:
        _run(app, plan, manager, params)
    finally:
        if pidfile is not None:
            pidfile.release()


def _run(app: Any, plan: Any, manager: Any, params: dict[str, Any]) -> None:
    warn_failures(manager)
    if not params.get("quiet"):
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
    if running.exit_status:
        sys.exit(running.exit_status)


def _secrets(app: Any, plan: Any) -> frozenset[str]:
    """The passwords and keys in the app's settings, the plugins' options and the brokers given
    on the command line."""
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
