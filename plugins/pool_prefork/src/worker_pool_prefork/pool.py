"""The prefork pool (being written): child processes forked after the app is imported."""

from __future__ import annotations

from typing import Any, ClassVar

from worker_core.exceptions import NotImplementedYet


class PreforkPool:
    """Runs each job in a forked child process."""

    is_process_pool: ClassVar[bool] = True

    @classmethod
    def check_options(cls, options: Any) -> None:
        raise NotImplementedYet(
            "the prefork pool (worker-pool-prefork) is not implemented yet; choose another pool "
            "with -P solo or -P threads"
        )

    def __init__(self, options: Any) -> None:
        self.check_options(options)
