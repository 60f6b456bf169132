"""Driving a pool as the worker does, for tests: directly (sync loop) or on a kombu hub running
in its own thread (async loop), and recording every callback of a job.

Under a hub, every pool method is called in the hub's thread (``runner.call``), as the pool
protocol requires.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..slots import Pool, PoolFactory, PoolOptions

__all__ = ["JobProbe", "PoolRunner"]


class JobProbe:
    """Every callback one job received, in order, whichever thread delivered it."""

    def __init__(self, label: str = "job") -> None:
        self.label = label
        self.events: list[tuple[str, Any]] = []
        self.done = threading.Event()
        self.accepted = threading.Event()
        self.accept_thread: int | None = None
        #: Whether the accept callback ran inside ``apply_async`` in the submitting thread:
        #: the pool runs jobs inline (solo).
        self.inline = False
        #: What ``apply_async`` returned (a handle for ``withdraw_job``, or None).
        self.handle: Any = None
        self._applying: int | None = None
        self._lock = threading.Lock()

    # -- callbacks ----------------------------------------------------------------------------

    def on_accept(self, pid: int, time_accepted: float) -> None:
        me = threading.get_ident()
        with self._lock:
            self.events.append(("accept", (pid, time_accepted)))
            self.accept_thread = me
            self.inline = self._applying == me
        self.accepted.set()

    def on_result(self, value: Any) -> None:
        with self._lock:
            self.events.append(("result", value))
        self.done.set()

    def on_error(self, exc: BaseException) -> None:
        with self._lock:
            self.events.append(("error", exc))
        self.done.set()

    def on_timeout(self, soft: bool, seconds: float) -> None:
        with self._lock:
            self.events.append(("timeout", (soft, seconds)))

    def callbacks(self) -> dict[str, Any]:
        return {"callback": self.on_result, "error_callback": self.on_error,
                "accept_callback": self.on_accept, "timeout_callback": self.on_timeout}

    # -- reading ------------------------------------------------------------------------------

    def kinds(self) -> list[str]:
        with self._lock:
            return [kind for kind, _ in self.events]

    def outcomes(self) -> list[tuple[str, Any]]:
        with self._lock:
            return [(kind, value) for kind, value in self.events if kind in ("result", "error")]

    @property
    def result(self) -> Any:
        outcomes = self.outcomes()
        if [kind for kind, _ in outcomes] != ["result"]:
            raise AssertionError(f"{self.label}: expected one result, got {self.events!r}")
        return outcomes[0][1]

    @property
    def error(self) -> BaseException:
        outcomes = self.outcomes()
        if [kind for kind, _ in outcomes] != ["error"]:
            raise AssertionError(f"{self.label}: expected one error, got {self.events!r}")
        value: BaseException = outcomes[0][1]
        return value

    @property
    def pid(self) -> int:
        for kind, value in self.events:
            if kind == "accept":
                return int(value[0])
        raise AssertionError(f"{self.label}: never accepted; events {self.events!r}")

    def timeouts(self) -> list[tuple[bool, float]]:
        with self._lock:
            return [value for kind, value in self.events if kind == "timeout"]

    def wait(self, timeout: float = 10.0) -> JobProbe:
        if not self.done.wait(timeout):
            raise AssertionError(f"{self.label}: no outcome within {timeout}s; events so far {self.events!r}")
        return self

    def wait_accepted(self, timeout: float = 10.0) -> JobProbe:
        if not self.accepted.wait(timeout):
            raise AssertionError(
                f"{self.label}: not accepted within {timeout}s; events so far {self.events!r}")
        return self


def _ignore() -> None:
    return None


class PoolRunner:
    """Starts a pool like the worker's Pool step does, and always releases it.

    ``with PoolRunner(MyPool, PoolOptions(concurrency=2), hub=True) as runner: ...``
    """

    def __init__(self, factory: PoolFactory, options: PoolOptions, *, hub: bool = False) -> None:
        self.factory = factory
        self.options = options
        self.uses_hub = hub
        self.hub: Any = None
        self.hub_error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._pool: Pool | None = None
        self._idle_fds: tuple[int, ...] = ()
        self.finished = False

    @property
    def pool(self) -> Pool:
        if self._pool is None:
            raise AssertionError("the runner has not created its pool yet; use it as a context manager")
        return self._pool

    # -- life ---------------------------------------------------------------------------------

    def __enter__(self) -> PoolRunner:
        try:
            self.open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def open(self, *, start: bool = True) -> None:
        if self.uses_hub:
            from kombu.asynchronous import Hub

            self.hub = Hub()
            # The worker's hub always watches the broker connection; without any fd kombu's loop
            # naps 0.1s per turn instead of polling (and waking on call_soon). An idle pipe
            # stands in for the connection.
            self._idle_fds = os.pipe()
            self.hub.add_reader(self._idle_fds[0], _ignore)
            self._thread = threading.Thread(target=self._run_hub, name="contract-hub", daemon=True)
            self._thread.start()
        self._pool = self.call(self.factory, self.options)
        if start:
            self.start()

    def start(self) -> None:
        self.call(self.pool.start)
        if self.uses_hub:
            self.call(self.pool.register_with_event_loop, self.hub)

    def _run_hub(self) -> None:
        try:
            self.hub.run_forever()
        except BaseException as exc:  # surfaced by close()
            self.hub_error = exc

    def close(self) -> None:
        """Terminate the pool if it was not stopped, then stop the hub's thread."""
        try:
            if self._pool is not None and not self.finished:
                self.terminate()
        finally:
            if self._thread is not None:
                self.hub.stop()
                self._thread.join(10.0)
                self.hub.close()
                self._thread = None
            for fd in self._idle_fds:
                os.close(fd)
            self._idle_fds = ()
        if self.hub_error is not None:
            error, self.hub_error = self.hub_error, None
            raise AssertionError(f"the hub's loop failed: {error!r}") from error

    def stop(self, timeout: float = 60.0) -> None:
        self.call(self.pool.stop, timeout=timeout)
        self.finished = True

    def terminate(self, timeout: float = 60.0) -> None:
        self.call(self.pool.terminate, timeout=timeout)
        self.finished = True

    # -- calling into the pool ----------------------------------------------------------------

    def call(self, function: Callable[..., Any], *args: Any, timeout: float = 60.0, **kwargs: Any) -> Any:
        """Call ``function`` where the worker would: in the hub's thread under a hub."""
        if self._thread is None or threading.get_ident() == self._thread.ident:
            return function(*args, **kwargs)
        box: dict[str, Any] = {}
        returned = threading.Event()

        def run() -> None:
            try:
                box["value"] = function(*args, **kwargs)
            except BaseException as exc:
                box["error"] = exc
            finally:
                returned.set()

        self.hub.call_soon(run)
        if not returned.wait(timeout):
            raise AssertionError(f"{function!r} did not return within {timeout}s in the hub's thread")
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def submit(self, target: Callable[..., Any], args: Sequence[Any] = (),
               kwargs: Mapping[str, Any] | None = None, *, label: str | None = None,
               **options: Any) -> JobProbe:
        """``apply_async`` with a fresh :class:`JobProbe` for every callback."""
        probe = JobProbe(label or str(getattr(target, "__name__", "job")))

        def apply() -> None:
            probe._applying = threading.get_ident()
            try:
                probe.handle = self.pool.apply_async(target, args, kwargs, **probe.callbacks(), **options)
            finally:
                probe._applying = None

        self.call(apply)
        return probe
