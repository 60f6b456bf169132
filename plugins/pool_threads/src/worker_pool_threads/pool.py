"""The thread pool (being written)."""

from __future__ import annotations

from typing import Any, ClassVar

from worker_core.exceptions import NotImplementedYet


class ThreadPool:
    """Runs each job in a thread of this process."""

    is_process_pool: ClassVar[bool] = False

    @classmethod
    def check_options(cls, options: Any) -> None:
        raise NotImplementedYet(
            "the threads pool (worker-pool-threads) is not implemented yet; choose another pool with -P solo"
        )

    def __init__(self, options: Any) -> None:
        self.check_options(options)
