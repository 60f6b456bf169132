"""The worker: typed slots for its components, the worker blueprint, and warm/cold shutdown."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import execution
from ..app.builtins import register_builtin_tasks
from ..bootsteps import Blueprint
from ..clock import LogicalClock
from ..consumer.backlog import Backlog
from ..control.access import all_commands
from ..control.stamps import RevokedStamps
from ..exceptions import ConfigurationError
from ..health.state import Health
from ..pools.solo import interrupt_inline_job
from ..revoked import RevokedIds
from ..stash import Stash
from ..statedb import State, read_state, write_state

if TYPE_CHECKING:
    from kombu.asynchronous import Hub
    from kombu.asynchronous.timer import Timer

    from ..app.base import App
    from ..consumer.backlog import Backlog
    from ..consumer.consumer import Consumer
    from ..plan import Plan
    from ..plugins.manager import PluginManager
    from ..slots import Autoscaler, Pool

__all__ = ["Worker"]

logger = logging.getLogger("worker")

def _warn_about_unsafe_content(accept_content: tuple[str, ...]) -> None:
    if {"pickle", "application/x-python-serialize"} & set(accept_content):
        logger.warning(
            "accept_content includes pickle: a pickled message runs whatever code its sender put in "
            "it, in this worker's processes, as soon as it is decoded. Anyone who can publish to the "
            "broker can then run code here. Accept pickle only when every producer is trusted and the "
            "broker is locked down; json (the default) carries data only."
        )


class Worker:
    """Runs the worker blueprint for one app and one plan.

    Steps fill the declared slots below as they start (no other attributes are added); a plugin
    keeps its own state in :attr:`stash`, under a key of its own.
    """

    def __init__(self, app: App, plan: Plan, plugins: PluginManager) -> None:
        self.app = app
        self.plan = plan
        self.options = plan.options
        self.plugins = plugins
        self.hostname = self.options.hostname
        self.pid = os.getpid()
        self.timer: Timer | None = None
        self.hub: Hub | None = None
        self.pool: Pool | None = None
        self.autoscaler: Autoscaler | None = None
        self.consumer: Consumer | None = None
        #: called for every task message the consumer reserves (the autoscaler checks demand)
        self.on_task_message: list[Callable[[], None]] = []
        #: called once, just before the consumer first asks the broker for tasks (no task has
        #: run yet)
        self.before_consuming: list[Callable[[], None]] = []
        self._backlog: Backlog | None = None
        #: ids of revoked tasks (remote ``revoke``): kept across lost connections
        self.revoked = RevokedIds()
        #: the logical clock (Lamport's, as Celery's ``app.clock``): forwarded by every event sent
        #: and every remote-control request received; ``--statedb`` keeps its value
        self.clock = LogicalClock()
        #: stamps revoked by remote ``revoke_by_stamped_headers``: a message stamped with one is discarded
        self.revoked_stamps = RevokedStamps()
        #: the queues consumed now: ``-Q``, then ``add_consumer``/``cancel_consumer``
        self.queues: list[str] = list(self.options.queues)
        self.stopping = False
        self.terminating = False
        self.ready = False
        self.started_at = time.monotonic()
        self.blueprint: Blueprint[Worker] = Blueprint(plan.graph("worker"))
        #: plugins' state, each under a key of its own (:class:`~worker_core.stash.StashKey`)
        self.stash = Stash()
        #: liveness and readiness, as the probes read them (:mod:`worker_core.health`)
        self.health = Health(self)
        #: the process's exit status once the worker has stopped (a part that stops it on purpose,
        #: such as the stall watchdog, sets it)
        self.exit_status = 0
        # The hooks someone implements, kept current by the plugin manager as plugins come and go:
        # a hook nobody implements costs a set lookup on the per-task path.
        self._implemented = plugins.hooks.implemented

    # -- running -----------------------------------------------------------------------------

    def start(self) -> None:
        """Start every step; returns once the worker has stopped (warm or cold)."""
        register_builtin_tasks(self.app)  # before the pool's processes fork: they run them too
        execution.install(self.app, self.plugins.hooks)
        _warn_about_unsafe_content(self.app.settings.accept_content)
        if self.options.statedb:
            self.load_state()
        self.notify("worker_init", worker=self)
        try:
            self.blueprint.start(self)
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        how = "cold" if self.terminating else "warm"
        started = bool(self.blueprint.started)
        if started:
            self.notify("worker_shutdown", worker=self, how=how)
        if self.terminating:
            self.blueprint.terminate(self)
        else:
            self.blueprint.stop(self)
        self.save_state()
        if started:
            self.notify("worker_stopped", worker=self, how=how)

    def load_state(self) -> None:
        """Take the revoked ids and the logical clock ``--statedb`` kept (at start)."""
        path = self.options.statedb
        assert path is not None
        try:
            state = read_state(path)
        except ValueError as exc:  # the options checked it; it changed since
            raise ConfigurationError(f"--statedb: {exc}") from None
        loaded = self.revoked.restore(state.revoked)
        self.clock.adjust(state.clock)
        logger.info("Loaded %d revoked task id(s) and the logical clock (%d) from %s", loaded, state.clock,
                    path)

    def save_state(self) -> None:
        """Write the revoked ids and the logical clock to ``--statedb``, if given (after each
        revoke and at shutdown)."""
        if not self.options.statedb:
            return
        try:
            write_state(self.options.statedb, State(self.revoked.state(), self.clock.value))
        except OSError as exc:
            logger.error("Could not save the state (revoked task ids, logical clock) to %s: %s",
                         self.options.statedb, exc)

    def request_stop(self, *, cold: bool = False) -> None:
        """Ask the worker to stop (safe from a signal handler): warm first, cold when asked
        again or with ``cold=True``."""
        if not self.stopping and not cold:
            logger.warning("worker: Warm shutdown (MainProcess)")
            self.notify("worker_shutting_down", worker=self, how="warm")
        if (cold or self.stopping) and not self.terminating:
            logger.warning("worker: Cold shutdown (MainProcess)")
            self.notify("worker_shutting_down", worker=self, how="cold")
            self.terminating = True
        self.stopping = True
        consumer = self.consumer
        if consumer is not None:
            consumer.inbox.wake()
        if self.terminating:
            interrupt_inline_job()

    def on_ready(self) -> None:
        self.ready = True
        logger.info("%s ready.", self.hostname)
        self.notify("worker_ready", worker=self)

    # -- what the autoscaler needs ---------------------------------------------------------------

    def demand(self) -> int:
        """Requests reserved by the consumer: waiting for the pool or running."""
        return len(self.consumer.reservations.reserved) if self.consumer is not None else 0

    def backlog(self) -> int:
        """Messages waiting in the broker on this worker's queues (not yet reserved by anyone)."""
        if self._backlog is None:
            self._backlog = Backlog(self.plugins, self.app.settings, self.options, self.queues)
        return self._backlog.depth()

    def on_max_concurrency_change(self, difference: int) -> None:
        if self.consumer is not None:
            self.consumer.inbox.call(self.consumer.tasks.change_max_prefetch, difference)

    # -- hooks -------------------------------------------------------------------------------

    def notify(self, hook: str, **kwargs: Any) -> None:
        """Call an observer hook (see :mod:`worker_core.hookspecs`), if anyone implements it."""
        if hook in self._implemented:
            self.plugins.hooks.caller(hook)(**kwargs)

    def implements(self, hook: str) -> bool:
        """Whether a registered plugin implements ``hook`` now."""
        return hook in self._implemented

    # -- remote control --------------------------------------------------------------------------

    def control_commands(self) -> dict[str, Any]:
        """The built-in commands plus those plugins contribute (a name clash is an error)."""
        return all_commands(self.plugins)

    # -- health --------------------------------------------------------------------------------

    def broker_state(self) -> dict[str, Any]:
        """Whether the broker refuses work (full, read-only, busy, blocking the connection: see
        :class:`~worker_core.slots.ReportsRefusals`): ``refusing``, what it refuses and why, or
        None while it takes work; ``refusing_for``, seconds it has (None); ``refusals``, how many
        times it started; ``refused_seconds``, how long it refused in all. Readiness says
        ``broker-blocked`` while it refuses. Thread-safe."""
        consumer = self.consumer
        if consumer is None:
            return {"refusing": None, "refusing_for": None, "refusals": 0, "refused_seconds": 0.0}
        return consumer.broker_state.info()

    # -- introspection -----------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "hostname": self.hostname,
            "pid": self.pid,
            "uptime": round(time.monotonic() - self.started_at, 3),
            "pool": dict(self.pool.info()) if self.pool is not None else None,
            "autoscaler": dict(self.autoscaler.info()) if self.autoscaler is not None else None,
        }
        if self.consumer is not None:
            info.update(self.consumer.info())
        return info
