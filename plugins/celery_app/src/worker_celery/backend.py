"""The result backend of a Celery app, as this worker's result backend slot (``celery://SPEC``,
SPEC being what ``-A`` named): every state the worker stores goes through the app's own backend
(Redis, a database, RPC, S3, ... whatever it configured), in its own format."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from worker_core.exceptions import ConfigurationError, ResultError, ResultTimeout

if TYPE_CHECKING:
    from celery import Celery

    from worker_core.app.settings import Settings

__all__ = ["CeleryResultBackend"]

#: states whose result is an exception (Celery's, the same as the core's)
_EXCEPTION_STATES = frozenset({"FAILURE", "RETRY", "REVOKED"})


class CeleryResultBackend:
    """Stores and reads results through the backend of the Celery app ``celery://SPEC`` names.

    The app is the one the ``celery`` app loader adapted for that spec (looked up, not imported
    again); its backend makes its own connections in each process, as under ``celery worker``.
    """

    def __init__(self, url: str, settings: Settings) -> None:
        from .loader import adapted

        spec = url.partition("://")[2]
        app = adapted(spec)
        if app is None:
            raise ConfigurationError(
                f"result backend {url!r} names the Celery app {spec!r}, which was not loaded with -A "
                f"{spec}; this backend serves only the Celery app the worker runs (set result_backend in "
                f"the Celery app's own configuration)"
            )
        self.url = url
        self.celery: Celery = app

    @property
    def backend(self) -> Any:
        """The Celery app's backend in this process."""
        return self.celery.backend

    def store_result(self, task_id: str, result: Any, state: str, traceback: str | None = None,
                     request: Mapping[str, Any] | None = None) -> None:
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
        meta: Mapping[str, Any] = self.backend.get_task_meta(task_id)
        return meta

    def wait_for(
        self, task_id: str, timeout: float | None = None, interval: float = 0.5
    ) -> Mapping[str, Any]:
        try:
            meta: Mapping[str, Any] = self.backend.wait_for(task_id, timeout=timeout, interval=interval)
        except TimeoutError:
            state = self.get_task_meta(task_id).get("status")
            raise ResultTimeout(
                f"task {task_id} was not ready after {timeout}s (its state: {state})"
            ) from None
        return meta

    def on_task_call(self, task_id: str) -> None:
        self.backend.on_task_call(None, task_id)

    def forget(self, task_id: str) -> None:
        self.backend.forget(task_id)

    def close(self) -> None:
        self.backend.process_cleanup()
