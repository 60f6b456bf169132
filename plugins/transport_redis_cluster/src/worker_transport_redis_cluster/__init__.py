"""Redis Cluster (and Valkey cluster) broker and result backend for worker, with a kombu transport
that Celery clients and workers can load to reach the same queues."""

from .backend import RedisClusterBackend
from .transport import RedisClusterTransport

__all__ = ["RedisClusterBackend", "RedisClusterTransport"]
