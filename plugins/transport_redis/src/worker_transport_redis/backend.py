"""The Redis result backend (being written)."""

from __future__ import annotations

from typing import Any

from worker_core.exceptions import NotImplementedYet


class RedisBackend:
    """Stores results in Redis as Celery does."""

    def __init__(self, url: str, settings: Any) -> None:
        raise NotImplementedYet("the Redis result backend (worker-transport-redis) is not implemented yet")
