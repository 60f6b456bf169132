"""The ``health`` plugin of worker-core: its options, and the Health step that serves the
worker's :class:`~.state.Health` to probes.

- ``--health-listen [HOST:]PORT``: ``/livez``, ``/readyz`` and ``/startupz`` over HTTP (the
  metrics listener answers them too, when it is on);
- ``--health-file PATH``: the state file ``workerctl health`` reads (the exec probe);
- systemd's ``sd_notify`` when ``NOTIFY_SOCKET`` is set (a ``Type=notify`` unit);
- ``--stall-timeout SECONDS`` (and ``--stall-exit``): the stall watchdog;
- ``--liveness-timeout SECONDS``: how long the main loop may make no progress and still be live;
- ``--http-certfile``/``--http-keyfile``/``--http-client-cafile``, ``--http-user``/
  ``--http-password``: TLS and basic authentication for every HTTP listener of the worker.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from typing import TYPE_CHECKING, Any

from ..bootsteps import Condition, Step
from ..exceptions import ConfigurationError
from ..hookspecs import hookimpl
from ..options import OptionSpec
from ..stash import StashKey
from . import statefile
from .addresses import parse_listen
from .notify import Notifier
from .probes import PROBE_PATHS, probe_app
from .security import ListenerSecurity
from .state import DEFAULT_LIVENESS_TIMEOUT, DRAINING

if TYPE_CHECKING:
    from ..options import WorkerOptions
    from ..worker.worker import Worker
    from .listener import Listener
    from .state import Health
    from .watchdog import StallWatchdog

__all__ = ["HEALTH_SERVICE", "HealthService", "HealthStep", "listener_security"]

logger = logging.getLogger("worker.health")

#: seconds between rewrites of the state file (it is rewritten at once when readiness changes)
WRITE_EVERY = 1.0


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"must be a number of seconds (got {text!r})") from None
    if not value > 0 or not math.isfinite(value):
        raise ValueError(f"must be a number of seconds above 0 (got {text!r})")
    return value


@hookimpl
def worker_options() -> list[OptionSpec]:
    return [
        OptionSpec("health_listen", ("--health-listen",), convert=parse_listen,
                   help="Answer the probes /livez, /readyz and /startupz over HTTP on this [HOST:]PORT "
                        "(the metrics listener answers them too)."),
        OptionSpec("health_file", ("--health-file",),
                   help="Keep the worker's health in this file, for exec probes: workerctl health "
                        "live|ready|started --file PATH."),
        OptionSpec("liveness_timeout", ("--liveness-timeout",), convert=_seconds,
                   default=DEFAULT_LIVENESS_TIMEOUT,
                   help=f"Seconds the main loop may make no progress and the worker still be live "
                        f"(default {DEFAULT_LIVENESS_TIMEOUT:g})."),
        OptionSpec("stall_timeout", ("--stall-timeout",), convert=_seconds,
                   help="Not ready when messages wait, the consumer has room, and it took none for this "
                        "many seconds (off by default)."),
        OptionSpec("stall_exit", ("--stall-exit",), is_flag=True,
                   help="With --stall-timeout: stop (exit status 1) when the consumer stalls, so the "
                        "orchestrator replaces the worker."),
        OptionSpec("http_certfile", ("--http-certfile",),
                   help="Serve the worker's HTTP listeners (metrics, probes) over TLS with this PEM "
                        "certificate."),
        OptionSpec("http_keyfile", ("--http-keyfile",),
                   help="The private key of --http-certfile (when it is not in that file)."),
        OptionSpec("http_client_cafile", ("--http-client-cafile",),
                   help="With --http-certfile: require client certificates signed by this CA."),
        OptionSpec("http_user", ("--http-user",),
                   help="Ask for basic authentication with this user name on every path but the "
                        "probes'."),
        OptionSpec("http_password", ("--http-password",),
                   help="The password of --http-user (better in WORKER_HTTP_PASSWORD)."),
    ]


@hookimpl
def worker_validate_options(options: WorkerOptions) -> None:
    extra = options.extra
    if extra.get("stall_exit") and not extra.get("stall_timeout"):
        raise ConfigurationError("--stall-exit needs --stall-timeout SECONDS (how long a consumer may take "
                                 "nothing while messages wait)")
    path = extra.get("health_file")
    if path is not None:
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise ConfigurationError(f"--health-file {path!r}: the directory {folder} does not exist; "
                                     f"create it or give another path")
        if os.path.isdir(path):
            raise ConfigurationError(f"--health-file {path!r} is a directory; give a file path in it")
    listener_security(options)


def listener_security(options: WorkerOptions) -> ListenerSecurity:
    """How the worker's HTTP listeners protect themselves, from the ``--http-*`` options.

    :raise ConfigurationError: options that do not go together.
    """
    extra = options.extra
    certfile, keyfile, cafile = extra.get("http_certfile"), extra.get("http_keyfile"), extra.get(
        "http_client_cafile")
    user, password = extra.get("http_user"), extra.get("http_password")
    if keyfile is not None and certfile is None:
        raise ConfigurationError("--http-keyfile needs --http-certfile (the certificate it is the key of)")
    if cafile is not None and certfile is None:
        raise ConfigurationError("--http-client-cafile needs --http-certfile: client certificates are "
                                 "checked over TLS only")
    if (user is None) != (password is None):
        given, missing = ("--http-user", "--http-password") if password is None else (
            "--http-password", "--http-user")
        raise ConfigurationError(f"{given} needs {missing} too (basic authentication takes both)")
    if user is not None and ":" in user:
        raise ConfigurationError(f"--http-user must not contain ':' (got {user!r})")
    return ListenerSecurity(certfile=certfile, keyfile=keyfile, client_cafile=cafile, username=user,
                            password=password)


def _wanted(options: WorkerOptions) -> bool:
    extra = options.extra
    return bool(extra.get("health_listen") or extra.get("health_file") or extra.get("stall_timeout")
                or os.environ.get("NOTIFY_SOCKET"))


@hookimpl
def worker_bootsteps(blueprint: str) -> list[Step[Any]]:
    return [HealthStep()] if blueprint == "worker" else []


@hookimpl
def worker_init(worker: Worker) -> None:
    worker.health.liveness_timeout = float(worker.options.extra.get("liveness_timeout")
                                           or DEFAULT_LIVENESS_TIMEOUT)


@hookimpl
def worker_ready(worker: Worker) -> None:
    worker.health.changed()


@hookimpl
def worker_shutdown(worker: Worker, how: str) -> None:
    service = worker.stash.get(HEALTH_SERVICE, None)
    if service is not None and service.watchdog is not None and service.watchdog.exiting:
        service.watchdog.exit_unless_stopped()


@hookimpl
def worker_shutting_down(worker: Worker, how: str) -> None:
    # called from the signal handler: no lock taken (the state file follows within a second)
    worker.health.hold(DRAINING, notify=False)
    service = worker.stash.get(HEALTH_SERVICE, None)
    if service is not None and how == "warm":
        service.notifier.send("STOPPING=1", "STATUS=draining")


class HealthService:
    """What the Health step runs: the state file's writer and systemd's notifications (one
    thread), the probe listener, the stall watchdog."""

    def __init__(self, worker: Worker) -> None:
        extra = worker.options.extra
        self.health: Health = worker.health
        self.path: str | None = extra.get("health_file")
        self.notifier = Notifier()
        self.listener: Listener | None = None
        self.watchdog: StallWatchdog | None = None
        self._timer_entry: Any = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ready_sent = False
        self._status: str | None = None

    def start(self, worker: Worker) -> None:
        extra = worker.options.extra
        listen = extra.get("health_listen")
        if listen is not None:
            from .listener import serve

            host, port = listen
            self.listener = serve(host, port, probe_app(self.health), listener_security(worker.options))
            logger.info("Health probes on %s (%s)", self.listener.url, ", ".join(PROBE_PATHS))
        timeout = extra.get("stall_timeout")
        if timeout:
            from .watchdog import StallWatchdog

            self.watchdog = StallWatchdog(worker, timeout, exit_on_stall=bool(extra.get("stall_exit")))
            assert worker.timer is not None  # the Timer step started first
            self._timer_entry = worker.timer.call_repeatedly(self.watchdog.every, self.watchdog.check)
        if self.path is not None or self.notifier.enabled:
            self.health.on_change(self._wake.set)
            self._write()
            self._thread = threading.Thread(target=self._run, name="worker-health", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        every = WRITE_EVERY
        if self.notifier.watchdog_interval is not None:
            every = min(every, self.notifier.watchdog_interval)
        while not self._stop.is_set():
            self._wake.wait(every)
            self._wake.clear()
            if self._stop.is_set():
                break
            self._write()

    def _write(self) -> None:
        health = self.health
        state = health.snapshot()
        if self.path is not None:
            try:
                statefile.write(self.path, state)
            except OSError as exc:
                logger.warning("Cannot write the health file %s: %s", self.path, exc)
        notifier = self.notifier
        if notifier.enabled:
            lines = []
            if state["started"] and not self._ready_sent:
                self._ready_sent = True
                lines.append("READY=1")
            status = str(state["reason"])
            if status != self._status:
                self._status = status
                lines.append(f"STATUS={status}")
            if notifier.watchdog_interval is not None and health.live().ok:
                lines.append("WATCHDOG=1")
            if lines:
                notifier.send(*lines)

    def stop(self) -> None:
        if self._timer_entry is not None:
            self._timer_entry.cancel()
            self._timer_entry = None
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.listener is not None:
            self.listener.close()
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            self._wake.set()
            thread.join(5)
        if self.path is not None:
            statefile.remove(self.path)
        self.notifier.close()


#: the Health step's service, while it runs
HEALTH_SERVICE = StashKey[HealthService]()


class HealthStep(Step["Worker"]):
    """Serves the worker's health: the probe listener, the state file, systemd's notifications,
    the stall watchdog."""

    name = "Health"
    requires = ("Timer",)
    condition = Condition("--health-listen, --health-file or --stall-timeout is given, or NOTIFY_SOCKET "
                          "is set", _wanted)

    def describe(self, options: WorkerOptions) -> str:
        extra = options.extra
        parts = []
        if extra.get("health_listen"):
            host, port = extra["health_listen"]
            parts.append(f"probes on {host}:{port}")
        if extra.get("health_file"):
            parts.append(f"state file {extra['health_file']}")
        if extra.get("stall_timeout"):
            parts.append(f"stall watchdog {extra['stall_timeout']:g}s" + (", exits" if extra.get("stall_exit")
                                                                          else ""))
        if os.environ.get("NOTIFY_SOCKET"):
            parts.append("systemd notifications")
        return "; ".join(parts) or "serve the worker's health to probes"

    def start(self, worker: Worker) -> None:
        service = HealthService(worker)
        worker.stash[HEALTH_SERVICE] = service
        try:
            service.start(worker)
        except BaseException:
            del worker.stash[HEALTH_SERVICE]
            service.stop()
            raise

    def stop(self, worker: Worker) -> None:
        service = worker.stash.get(HEALTH_SERVICE, None)
        if service is not None:
            del worker.stash[HEALTH_SERVICE]
            service.stop()
