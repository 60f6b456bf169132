"""``AsyncResult``: a handle on a sent task's state and return value."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..results.meta import FAILURE, PROPAGATE_STATES, READY_STATES, SUCCESS, decode_result

if TYPE_CHECKING:
    from .base import App

__all__ = ["AsyncResult"]


class AsyncResult:
    """The state and result of one task, read from the app's result backend."""

    def __init__(self, id: str, app: App) -> None:
        self.id = id
        self.app = app
        self._ready_meta: Mapping[str, Any] | None = None

    @property
    def task_id(self) -> str:
        return self.id

    def _meta(self) -> Mapping[str, Any]:
        if self._ready_meta is not None:
            return self._ready_meta
        meta: Mapping[str, Any] = self.app.backend.get_task_meta(self.id)
        if meta.get("status") in READY_STATES:
            self._ready_meta = meta
        return meta

    def get(self, timeout: float | None = None, propagate: bool = True, interval: float = 0.5) -> Any:
        """Wait for the task to finish and return its value.

        :param timeout: seconds to wait; ``ResultTimeout`` after that.
        :param propagate: re-raise the task's exception (as its own type) if it failed.
        """
        if self._ready_meta is None:
            meta = self.app.backend.wait_for(self.id, timeout=timeout, interval=interval)
            self._ready_meta = meta
        meta = self._ready_meta
        value = decode_result(meta)
        if propagate and meta.get("status") in PROPAGATE_STATES and isinstance(value, BaseException):
            raise value
        return value

    wait = get

    def revoke(self, terminate: bool = False, signal: str | int | None = None) -> None:
        """Ask every worker to discard this task, and with ``terminate`` to kill the process
        running it (``signal``, TERM by default); like Celery's, it does not wait for replies."""
        from ..control.client import broadcast

        broadcast(self.app, "revoke", {"task_id": self.id, "terminate": terminate, "signal": signal},
                  reply=False)

    @property
    def state(self) -> str:
        return str(self._meta().get("status"))

    status = state

    @property
    def result(self) -> Any:
        """The return value, or the exception for a failed task (without raising it)."""
        return decode_result(self._meta())

    info = result

    @property
    def traceback(self) -> str | None:
        return self._meta().get("traceback")

    @property
    def date_done(self) -> str | None:
        return self._meta().get("date_done")

    def ready(self) -> bool:
        return self.state in READY_STATES

    def successful(self) -> bool:
        return self.state == SUCCESS

    def failed(self) -> bool:
        return self.state == FAILURE

    def forget(self) -> None:
        self._ready_meta = None
        self.app.backend.forget(self.id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AsyncResult) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        return f"<AsyncResult: {self.id}>"
