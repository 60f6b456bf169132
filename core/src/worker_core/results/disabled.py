"""The disabled result backend: stores nothing, and says how to configure one when asked for results."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

from ..exceptions import BackendDisabled

if TYPE_CHECKING:
    from ..app.settings import Settings
    from ..slots import DiscardsResults, ResultBackend

__all__ = ["DisabledBackend"]


class DisabledBackend:
    """What the app uses when no result backend is configured: writes vanish, reads explain."""

    discards_results: ClassVar[bool] = True

    def __init__(self, url: str = "disabled", settings: Settings | None = None) -> None:
        self.url = url

    def __repr__(self) -> str:
        return "<DisabledBackend>"

    def store_result(
        self,
        task_id: str,
        result: Any,
        state: str,
        traceback: str | None = None,
        request: Mapping[str, Any] | None = None,
        *,
        serializer: str | None = None,
    ) -> None:
        """Results are not kept."""

    def get_task_meta(self, task_id: str) -> Mapping[str, Any]:
        self._refuse(task_id)

    def wait_for(
        self, task_id: str, timeout: float | None = None, interval: float = 0.5
    ) -> Mapping[str, Any]:
        self._refuse(task_id)

    def on_task_call(self, task_id: str) -> None:
        """Nothing to prepare."""

    def forget(self, task_id: str) -> None:
        """Nothing was stored."""

    def close(self) -> None:
        """Nothing to release."""

    def _refuse(self, task_id: str) -> NoReturn:
        raise BackendDisabled(
            f"cannot get the result of task {task_id}: no result backend is configured. Set one with "
            f"App(..., backend='redis://localhost:6379/0'), the result_backend setting, or the "
            f"WORKER_RESULT_BACKEND environment variable; the embedded transport keeps results in its "
            f"own file by default"
        )


if TYPE_CHECKING:
    # mypy proves the class satisfies its slot's Protocol and the capabilities it offers.
    _BACKEND: type[ResultBackend] = DisabledBackend
    _DISCARDS: type[DiscardsResults] = DisabledBackend
