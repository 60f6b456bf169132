"""Redis broker and result backend for worker."""

from .startup import defer_redis_asyncio

defer_redis_asyncio()

from .backend import RedisBackend  # noqa: E402
from .transport import RedisTransport  # noqa: E402

__all__ = ["RedisBackend", "RedisTransport"]
