"""Redis broker and result backend for worker."""

from .backend import RedisBackend
from .transport import RedisTransport

__all__ = ["RedisBackend", "RedisTransport"]
