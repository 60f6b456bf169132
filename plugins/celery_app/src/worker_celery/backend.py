"""The result backend of a Celery app, as this worker's result backend slot (``celery://SPEC``,
SPEC being what ``-A`` named): every state the worker stores goes through the app's own backend
(Redis, a database, RPC, S3, ... whatever it configured), in its own format."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from worker_core.exceptions import ConfigurationError, ResultError, ResultTimeout
from worker_core.results import encode_exception

if TYPE_CHECKING:
    from celery import Celery

    from worker_core import Settings

__all__ = ["CeleryResultBackend"]

#: states whose result is an exception (Celery's, the same as the core's)
_EXCEPTION_STATES = frozenset({"FAILURE", "RETRY", "REVOKED"})
#: states after which nothing changes
_READY_STATES = frozenset({"SUCCESS", "FAILURE", "REVOKED"})


class CeleryResultBackend:
    """Stores and reads results through the backend of the Celery app ``celery://SPEC`` names.

    The app is the one the ``celery`` app loader adapted for that spec (looked up, or loaded in
    a process that has not loaded it); its backend makes its own connections in each process, as
    under ``celery worker``.
    """

    def __init__(self, url: str, settings: Settings) -> None:
        from .loader import CeleryLoader, adapted

        spec = url.partition("://")[2]
        app = adapted(spec)
        if app is None:  # another process (spawned): the URL names the app, load it here too
            loaded = CeleryLoader.load(spec) if spec else None
            if loaded is None:
                raise ConfigurationError(
                    f"result backend {url!r} names no Celery app (expected celery://SPEC, SPEC as -A "
                    f"takes it); this backend serves the Celery app the worker runs: set result_backend "
                    f"in the Celery app's own configuration"
                )
            app = loaded.celery
        self.url = url
        self.celery: Celery = app

    @property
    def backend(self) -> Any:
        """The Celery app's backend in this process."""
        return self.celery.backend

    def store_result(self, task_id: str, result: Any, state: str, traceback: str | None = None,
                     request: Mapping[str, Any] | None = None, serializer: str | None = None) -> None:
        """Store through the Celery app's backend, in its own ``result_serializer``: the states
        the worker decides itself (a Celery task's own serializer is its tracer's business,
        and the worker passes none for a Celery app's tasks)."""
        from celery.app.task import Context

        backend = self.backend
        if state in _EXCEPTION_STATES and isinstance(result, Mapping) and "exc_type" in result:
            result = backend.exception_to_python(dict(result))
        try:
            backend.store_result(task_id, result, state, traceback, request=Context(dict(request or {})))
        except Exception as exc:
            raise ResultError(f"the Celery app's backend could not store {state} for task {task_id}: "
                              f"{type(exc).__name__}: {exc}") from exc

    def get_task_meta(self, task_id: str) -> Mapping[str, Any]:
        """The stored meta as Celery's format has it (an exception as its ``exc_type``,
        ``exc_message`` and ``exc_module``, whatever the app's serializer made of it)."""
        meta = dict(self.backend.get_task_meta(task_id))
        meta.setdefault("task_id", task_id)
        result = meta.get("result")
        if meta.get("status") in _EXCEPTION_STATES and isinstance(result, BaseException):
            meta["result"] = encode_exception(result)
        return meta

    def wait_for(
        self, task_id: str, timeout: float | None = None, interval: float = 0.5
    ) -> Mapping[str, Any]:
        """Read the meta every ``interval`` seconds until the task is ready (every Celery backend
        can be read; not every one can be waited on)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            meta = self.get_task_meta(task_id)
            if meta.get("status") in _READY_STATES:
                return meta
            if deadline is not None and time.monotonic() >= deadline:
                raise ResultTimeout(
                    f"task {task_id} was not ready after {timeout}s (its state: {meta.get('status')})"
                )
            pause = interval if deadline is None else min(interval, max(deadline - time.monotonic(), 0))
            time.sleep(pause)

    def on_task_call(self, task_id: str) -> None:
        self.backend.on_task_call(None, task_id)

    def forget(self, task_id: str) -> None:
        self.backend.forget(task_id)

    def close(self) -> None:
        self.backend.process_cleanup()
